#pragma once
/// @file
/// The data-parallel axis of a training step: buffers (a block's gradients,
/// its updated weights) summed or gathered over the data-parallel ranks in
/// buckets of a stated size, each bucket a ring collective
/// (engine/ring_reduce.hpp), queued and run one after the other while the
/// caller computes. A thread of the reducer's own advances the rings where
/// MPI provides MPI_THREAD_MULTIPLE (Open MPI moves a message only inside an
/// MPI call); otherwise the caller's poll() calls and waits do.

#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>

#include "overlap/core/enum_names.hpp"
#include "overlap/engine/ring_reduce.hpp"
#include "overlap/engine/trace.hpp"
#include "overlap/mpi/communicator.hpp"
#include "overlap/mpi/simulator.hpp"
#include "overlap/mpi/wait.hpp"

namespace overlap::layers {

/// When a training step combines the data-parallel ranks' gradients.
enum class dp_sync {
  bulk,        ///< after the whole backward pass, block after block (the baseline)
  overlapped,  ///< each block's, as soon as its backward has made them, while the blocks before it compute
  none,        ///< never: each rank keeps its own (the bound of any overlap; not training the same model)
};

/// How the optimizer's state is kept over the data-parallel ranks.
enum class optimizer_state {
  replicated,  ///< every rank holds it all: the gradients are all-reduced
  sharded,     ///< each rank holds its part (ZeRO-1/2): reduce-scattered gradients, all-gathered weights
};

}  // namespace overlap::layers

namespace overlap {

/// The names of dp_sync's values, as the apps and JSON spell them.
template <>
struct enum_names<layers::dp_sync> {
  /// Every value with its name.
  static constexpr std::array<enum_entry<layers::dp_sync>, 3> entries{
      {{layers::dp_sync::bulk, "bulk"}, {layers::dp_sync::overlapped, "overlapped"}, {layers::dp_sync::none, "none"}}};
};

/// The names of optimizer_state's values.
template <>
struct enum_names<layers::optimizer_state> {
  /// Every value with its name.
  static constexpr std::array<enum_entry<layers::optimizer_state>, 2> entries{
      {{layers::optimizer_state::replicated, "replicated"}, {layers::optimizer_state::sharded, "sharded"}}};
};

}  // namespace overlap

namespace overlap::layers {

/// Ring collectives over a communicator's ranks on buffers of A (float or
/// double), in buckets of at most `bucket` elements, run one at a time in
/// the order they were queued. Collective in effect: every rank queues the
/// same collectives with the same counts in the same order. One thread (the
/// caller's) calls it; the reducer's own thread, when it has one, only
/// advances the queue.
template <class A>
class dp_reducer {
 public:
  /// The element type of the buffers.
  using value_type = A;
  /// Counts the collectives queued so far: wait(t) returns once the first t have finished.
  using ticket = int64_t;

  /// How a reducer runs.
  struct options {
    int64_t bucket = int64_t(25) << 20;  ///< elements per ring collective (clamped to 1 .. INT_MAX)
    double timeout_s = 0;                ///< the watchdog's bound on one ring step (0: none)
    /// Advance the rings on a thread of the reducer's own (needs
    /// MPI_THREAD_MULTIPLE; ignored under SimGrid SMPI, where a rank's
    /// second thread must not call MPI); otherwise poll() and wait()
    /// advance them. The thread sleeps between tests for an eighth of the
    /// last ring step's time, within [interval, 2 ms]: each test costs
    /// the GEMMs beside it a little of their core, and a ring step of
    /// megabytes on a slow link takes milliseconds (see docs/layer.md).
    bool thread = true;
    std::chrono::microseconds interval{100};  ///< the shortest sleep between the thread's tests
  };

  /// Collective over comm: duplicates it (the rings' messages then meet no others).
  dp_reducer(MPI_Comm comm, const options& o)
      : comm_(mpi::communicator::borrow(comm).dup()),
        bucket_(std::clamp<int64_t>(o.bucket, 1, INT_MAX)),
        interval_(o.interval) {
    ring_.configure(comm_.get(), 0, o.timeout_s);
    if (o.thread && !mpi::simulated) thread_ = std::thread([this] { loop(); });
  }
  dp_reducer(const dp_reducer&) = delete;
  dp_reducer& operator=(const dp_reducer&) = delete;
  /// Stops the thread. Collectives still queued are abandoned, their
  /// requests leaked (after a failure; a finished step leaves none).
  ~dp_reducer() {
    if (thread_.joinable()) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
      }
      work_.notify_all();
      thread_.join();
    }
  }

  /// The ranks of the data-parallel axis, and this one's place among them.
  [[nodiscard]] int size() const noexcept { return ring_.size(); }
  [[nodiscard]] int rank() const noexcept { return ring_.rank(); }  ///< this rank's place
  /// True when a thread of the reducer's own advances the rings.
  [[nodiscard]] bool threaded() const noexcept { return thread_.joinable(); }
  /// Records every bucket's collective, from its start to its end as seen
  /// by whoever advanced it, on the data-parallel track (null: off). Set
  /// before the first enqueue.
  void trace(engine::trace_recorder* r) noexcept { tracer_ = r; }

  /// Queues `what` on data[0, count) in buckets; returns the ticket that
  /// wait() takes. data stays valid, and is touched by nobody else, until
  /// then. Rethrows an earlier failure of the queue.
  ticket enqueue(engine::ring_collective what, A* data, int64_t count) {
    std::lock_guard<std::mutex> lock(mutex_);
    rethrow_locked();
    for (int64_t at = 0; at < count; at += bucket_) queue_.push_back({what, data + at, std::min(bucket_, count - at)});
    queued_ += (count + bucket_ - 1) / bucket_;
    const ticket t = queued_;
    work_.notify_all();
    return t;
  }
  /// Advances the queue without blocking (nothing to do with a thread).
  void poll() {
    if (!threaded()) advance();
  }
  /// Blocks until the collectives up to ticket t have finished; rethrows
  /// their failure (overlap::error, mpi::wait_timeout), after which the
  /// reducer is unusable.
  void wait(ticket t) {
    if (!threaded()) {
      (void)mpi::poll_until([&] { return advance() >= t; }, 1e300);  // each ring step is bounded by the timeout
      return;
    }
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return finished_ >= t || failure_; });
    rethrow_locked();
  }
  /// f(offset, n) for this rank's block of every bucket of a count-element
  /// buffer: the elements a reduce_scatter sums here and an all_gather
  /// takes from here.
  template <class F>
  void for_each_owned(int64_t count, F&& f) const {
    for (int64_t at = 0; at < count; at += bucket_) {
      const shard_layout blocks = shard_layout::balanced(std::min(bucket_, count - at), size());
      f(at + blocks.offset(rank()), blocks.size(rank()));
    }
  }

 private:
  struct job {
    engine::ring_collective what;
    A* data;
    int64_t count;
    bool started = false;
    double began = 0;  ///< the tracer's clock at its start
  };

  void begin(job& j) {
    ring_.start(j.what, j.data, j.count);
    last_step_ = std::chrono::steady_clock::now();  // time idle before a job is no step's
    j.started = true;
    if (tracer_ != nullptr) j.began = tracer_->now();
  }
  void end(const job& j) {
    if (tracer_ == nullptr) return;
    try {
      const char* name = j.what == engine::ring_collective::all_reduce       ? "all-reduce"
                         : j.what == engine::ring_collective::reduce_scatter ? "reduce-scatter"
                                                                             : "all-gather";
      tracer_->span(name, "dp", engine::trace_recorder::track::data_parallel, j.began, tracer_->now(),
                    {{"bytes", static_cast<long long>(j.count * int64_t(sizeof(A)))}, {"ranks", size()}});
    } catch (const std::exception&) {  // a timeline is not worth a crash
    }
  }

  /// Advances the front of the queue as far as it goes without blocking;
  /// returns the number of collectives finished. The caller's thread only.
  ticket advance() {
    try {
      while (!queue_.empty()) {
        job& j = queue_.front();
        if (!j.started) begin(j);
        if (!ring_.poll()) break;
        end(j);
        queue_.pop_front();
        ++finished_;
      }
    } catch (...) {
      failure_ = std::current_exception();
      throw;
    }
    return finished_;
  }

  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      work_.wait(lock, [&] { return stop_ || (!queue_.empty() && !failure_); });
      if (stop_) return;
      job j = queue_.front();  // enqueue only appends: the front stays put while unlocked
      lock.unlock();
      bool finished = false;
      std::exception_ptr failed;
      try {
        if (!j.started) begin(j);
        const int64_t before = ring_.steps_completed();
        finished = ring_.poll();
        learn_step(ring_.steps_completed() - before);
        if (finished) end(j);
      } catch (...) {
        failed = std::current_exception();
      }
      lock.lock();
      queue_.front().started = j.started, queue_.front().began = j.began;
      if (failed) {
        failure_ = failed;
        done_.notify_all();
        continue;
      }
      if (finished) {
        queue_.pop_front();
        ++finished_;
        done_.notify_all();
        continue;
      }
      // Sleep between tests (a thread that polls without pause takes a core
      // from the GEMMs); a new job or stop wakes it.
      work_.wait_for(lock, sleep_, [&] { return stop_; });
    }
  }

  /// The thread's sleep from the time of the step that just completed
  /// (steps: how many this test completed; one alone is timed).
  void learn_step(int64_t steps) {
    if (steps == 0) return;
    const auto now = std::chrono::steady_clock::now();
    if (steps == 1) {
      const auto eighth = std::chrono::duration_cast<std::chrono::microseconds>(now - last_step_) / 8;
      sleep_ = std::clamp(eighth, interval_, std::max(interval_, std::chrono::microseconds(2000)));
    }
    last_step_ = now;
  }

  void rethrow_locked() const {
    if (failure_) std::rethrow_exception(failure_);
  }

  mpi::communicator comm_;
  int64_t bucket_;
  std::chrono::microseconds interval_;
  std::chrono::microseconds sleep_{interval_};         ///< the thread's, between tests
  std::chrono::steady_clock::time_point last_step_{};  ///< when the thread saw the last step complete
  engine::ring_reduce<A> ring_;                        ///< the thread's while it runs, else the caller's
  engine::trace_recorder* tracer_ = nullptr;
  std::mutex mutex_;
  std::condition_variable work_, done_;
  std::deque<job> queue_;  ///< queued collectives; the front one runs
  ticket queued_ = 0, finished_ = 0;
  std::exception_ptr failure_;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members it uses exist
};

}  // namespace overlap::layers
