#pragma once
/// @file
/// A ring reduce-scatter, all-gather or all-reduce (reduce-scatter, then
/// all-gather) of one contiguous buffer that advances without blocking:
/// poll() completes the step that has arrived, adds what it brought and
/// posts the next one, so that a thread or the caller moves the collective
/// along between pieces of other work (layers/data_parallel.hpp sums
/// gradients over the data-parallel ranks this way while the backward pass
/// computes). As in paced_gather, one block per step is in flight each way
/// and every message is contiguous. MPI_Iallreduce would do the same work,
/// but Open MPI's libnbc runs it as a binomial tree below 4 ranks or in
/// place: twice a ring's time at 2 ranks.

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "overlap/core/error.hpp"
#include "overlap/core/matrix.hpp"
#include "overlap/mpi/datatype.hpp"
#include "overlap/mpi/simulator.hpp"
#include "overlap/mpi/wait.hpp"

namespace overlap::engine {

/// What a ring_reduce computes over the R ranks of its communicator. The
/// buffer's count elements are split into R balanced blocks
/// (shard_layout::balanced(count, R)); block q is rank q's.
enum class ring_collective {
  all_reduce,      ///< every block summed over the ranks, on every rank
  reduce_scatter,  ///< block r summed over the ranks on rank r; the others are left as scratch
  all_gather,      ///< block q as rank q holds it, on every rank
};

/// One ring collective at a time on a buffer of A (float or double), in
/// 2(R - 1) steps for all_reduce and R - 1 for the others. Reduce-scatter
/// step s sends block r - s - 1 to the next rank and adds block r - s - 2,
/// received from the previous one, to its own copy (block r ends summed on
/// rank r); all-gather step t passes block r - t on and receives block
/// r - t - 1 in place. Collective in effect: every rank of the communicator
/// starts the same collective with the same count, in the same order, and
/// advances it to the end. Not thread-safe: one thread at a time calls it.
template <class A>
class ring_reduce {
  static_assert(std::is_same_v<A, float> || std::is_same_v<A, double>, "ring_reduce sums float or double");

 public:
  ring_reduce() = default;
  ring_reduce(const ring_reduce&) = delete;
  ring_reduce& operator=(const ring_reduce&) = delete;
  /// Drops requests still in flight (see leak): only a failed run leaves any.
  ~ring_reduce() { leak(); }

  /// The communicator (borrowed; its ranks in order form the ring), the
  /// messages' tag and the watchdog's bound on one step in seconds (0: none).
  void configure(MPI_Comm comm, int tag, double timeout_s) {
    comm_ = comm, tag_ = tag, timeout_s_ = timeout_s;
    OVERLAP_MPI(MPI_Comm_rank, comm, &rank_);
    OVERLAP_MPI(MPI_Comm_size, comm, &size_);
  }
  /// The ring's ranks.
  [[nodiscard]] int size() const noexcept { return size_; }
  /// This rank's place on the ring (its block's index).
  [[nodiscard]] int rank() const noexcept { return rank_; }

  /// Starts `what` on data[0, count): posts its first step. The previous
  /// collective must have finished. data stays valid and untouched by the
  /// caller until poll() returns true.
  void start(ring_collective what, A* data, int64_t count) {
    if (active()) throw std::logic_error("overlap::engine::ring_reduce: start while a collective is in flight");
    what_ = what, data_ = data;
    blocks_ = shard_layout::balanced(count, size_);
    const int steps = size_ - 1;
    reduce_steps_ = what == ring_collective::all_gather ? 0 : steps;
    total_ = reduce_steps_ + (what == ring_collective::reduce_scatter ? 0 : steps);
    const int64_t largest = blocks_.max_size();
    if (reduce_steps_ > 0 && int64_t(scratch_.size()) < largest) scratch_.resize(size_t(largest));
    step_ = 0, posted_ = false;
  }
  /// True between start and the poll that returns true.
  [[nodiscard]] bool active() const noexcept { return step_ < total_; }
  /// Steps completed since construction, over every collective (a thread
  /// that advances the ring learns from it how long a step takes).
  [[nodiscard]] int64_t steps_completed() const noexcept { return completed_; }

  /// Without blocking: completes every step that has arrived (adding what
  /// it brought) and posts the next. True once the collective has finished.
  /// Throws overlap::error for an MPI error and mpi::wait_timeout when a
  /// step has waited longer than the timeout; both leave the ring unusable
  /// (a fatal failure, as in the ops).
  bool poll() {
    while (active()) {
      if (!posted_) post();
      int done = 0;
      OVERLAP_MPI(MPI_Testall, 2, reqs_, &done, MPI_STATUSES_IGNORE);
      if (done == 0) {
        if (timeout_s_ > 0 && mpi::wtime() - posted_at_ > timeout_s_) {
          leak();
          throw mpi::wait_timeout("watchdog: a data-parallel ring step waited more than " + std::to_string(timeout_s_) +
                                  " s for rank " + std::to_string(from()) + " or rank " + std::to_string(to()) +
                                  " of its communicator");
        }
        return false;
      }
      if (step_ < reduce_steps_) {
        const int q = block(rank_ - step_ - 2);
        A* own = data_ + blocks_.offset(q);
        const A* in = scratch_.data();
        const int64_t n = blocks_.size(q);
        for (int64_t i = 0; i < n; ++i) own[i] += in[i];
      }
      ++step_, ++completed_, posted_ = false;
    }
    return true;
  }
  /// Advances the collective to its end, blocking (sleeping between tests
  /// as the library's waits do).
  void finish() {
    while (!poll()) (void)mpi::poll_until([&] { return poll(); }, timeout_s_ > 0 ? timeout_s_ : 1e300);
  }
  /// Forgets what is in flight without waiting (a fatal error: a peer that
  /// is gone may never complete it) and ends the collective.
  void leak() noexcept {
    reqs_[0] = reqs_[1] = MPI_REQUEST_NULL;
    step_ = total_ = 0, posted_ = false;
  }

 private:
  [[nodiscard]] int block(int q) const noexcept { return ((q % size_) + size_) % size_; }
  [[nodiscard]] int to() const noexcept { return (rank_ + 1) % size_; }
  [[nodiscard]] int from() const noexcept { return (rank_ + size_ - 1) % size_; }
  [[nodiscard]] static MPI_Datatype type() { return std::is_same_v<A, double> ? MPI_DOUBLE : MPI_FLOAT; }

  void post() {
    const bool reducing = step_ < reduce_steps_;
    const int t = reducing ? step_ : step_ - reduce_steps_;
    const int out = reducing ? block(rank_ - t - 1) : block(rank_ - t);
    const int in = reducing ? block(rank_ - t - 2) : block(rank_ - t - 1);
    A* into = reducing ? scratch_.data() : data_ + blocks_.offset(in);
    OVERLAP_MPI(MPI_Irecv, into, mpi::detail::to_count(blocks_.size(in), "a ring block"), type(), from(), tag_, comm_,
                &reqs_[0]);
    OVERLAP_MPI(MPI_Isend, mpi::any_buffer(data_ + blocks_.offset(out)),
                mpi::detail::to_count(blocks_.size(out), "a ring block"), type(), to(), tag_, comm_, &reqs_[1]);
    posted_ = true, posted_at_ = mpi::wtime();
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int tag_ = 0, rank_ = 0, size_ = 1;
  double timeout_s_ = 0, posted_at_ = 0;
  ring_collective what_ = ring_collective::all_reduce;
  A* data_ = nullptr;
  shard_layout blocks_;
  std::vector<A> scratch_;  ///< the reduce-scatter's incoming block
  MPI_Request reqs_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  int step_ = 0, total_ = 0, reduce_steps_ = 0;
  int64_t completed_ = 0;
  bool posted_ = false;
};

}  // namespace overlap::engine
