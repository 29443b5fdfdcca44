#pragma once
/// @file
/// The progress thread: tests the ring's outstanding requests while the
/// calling thread computes, sleeping between tests, or yielding with a zero
/// interval (a busy-polling thread steals a core from the GEMM; see
/// docs/design.md).

#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

#include "overlap/config.hpp"
#include "overlap/mpi/node_share.hpp"
#include "overlap/mpi/request.hpp"

namespace overlap::engine {

/// progress_policy::thread: a thread that tests the watched requests (MPI
/// moves large messages only inside MPI calls), sleeping `interval` between
/// two tests, while the caller's threads compute. Errors it sees are
/// rethrown by release().
class progress_thread {
 public:
  /// Starts the thread; it idles until watch().
  explicit progress_thread(std::chrono::microseconds interval) : interval_(interval), thread_([this] { loop(); }) {}
  progress_thread(const progress_thread&) = delete;
  progress_thread& operator=(const progress_thread&) = delete;
  ~progress_thread() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }

  /// Starts testing group until release(); the caller must not touch group meanwhile.
  void watch(mpi::request_group& group) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      active_ = &group;
    }
    cv_.notify_one();
  }

  /// Stops testing; on return the thread no longer touches the group.
  /// Rethrows an MPI error the thread saw.
  void release() {
    std::exception_ptr failure;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      active_ = nullptr;
      failure = std::exchange(failure_, nullptr);
    }
    if (failure) std::rethrow_exception(failure);
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      if (active_ == nullptr) {
        cv_.wait(lock, [this] { return stop_ || active_ != nullptr; });
        continue;
      }
      try {
        if (active_->test_all()) active_ = nullptr;  // all done: nothing left to progress
      } catch (...) {
        failure_ = std::current_exception();
        active_ = nullptr;
      }
      if (interval_.count() > 0) {
        // Interruptible: the destructor (and a new watch) wake it at once,
        // whatever the interval.
        cv_.wait_for(lock, interval_, [this] { return stop_; });
      } else {
        lock.unlock();
        std::this_thread::yield();
        lock.lock();
      }
    }
  }

  std::chrono::microseconds interval_;
  std::mutex mutex_;
  std::condition_variable cv_;
  mpi::request_group* active_ = nullptr;
  std::exception_ptr failure_;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members it uses exist
};

/// Watches a group for the lifetime of the guard (release also on exceptions).
class progress_scope {
 public:
  /// Starts watching g on p (nothing when p is null or g is empty).
  progress_scope(progress_thread* p, mpi::request_group& g) : p_(g.empty() ? nullptr : p) {
    if (p_ != nullptr) p_->watch(g);
  }
  progress_scope(const progress_scope&) = delete;
  progress_scope& operator=(const progress_scope&) = delete;
  /// Ends watching; rethrows an error the thread saw.
  void finish() {
    if (p_ != nullptr) std::exchange(p_, nullptr)->release();
  }
  ~progress_scope() {
    if (p_ == nullptr) return;
    try {
      p_->release();
    } catch (...) {  // already unwinding or finishing: the caller's wait reports MPI errors
    }
  }

 private:
  progress_thread* p_;
};

/// A policy chosen for progress_policy::automatic, with the reason in words.
struct progress_choice {
  progress_policy policy;  ///< the policy chosen
  std::string why;         ///< the reason, e.g. "a hardware thread is free"
};

/// progress_policy::automatic resolved from the node: a progress thread only
/// where MPI provides MPI_THREAD_MULTIPLE and a hardware thread is left over
/// by the ranks' compute threads, since a thread that must take turns with a
/// GEMM delays it; otherwise poll, which tests the transfers from the
/// computing thread between GEMM bands. Under SimGrid SMPI: none (the
/// simulator progresses transfers, and a second thread must not call MPI).
[[nodiscard]] inline progress_choice choose_progress(const mpi::node_share& s, bool simulated) {
  if (simulated) return {progress_policy::none, "SimGrid SMPI progresses transfers by itself"};
  const long long busy = static_cast<long long>(s.ranks) * s.threads;
  const std::string load = std::to_string(s.ranks) + (s.ranks == 1 ? " rank " : " ranks ") + s.ranks_from + " x " +
                           std::to_string(s.threads) + (s.threads == 1 ? " thread" : " threads") + " (" +
                           s.threads_from + ") on " + std::to_string(s.cpus) + " hardware threads";
  if (!s.multiple) return {progress_policy::poll, "MPI does not provide MPI_THREAD_MULTIPLE, which a thread needs"};
  if (busy < s.cpus) return {progress_policy::thread, load + ": " + std::to_string(s.cpus - busy) + " free"};
  return {progress_policy::poll, load + ": none free for a progress thread"};
}

}  // namespace overlap::engine
