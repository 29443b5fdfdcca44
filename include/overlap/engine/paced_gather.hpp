#pragma once
/// @file
/// A ring all-gather that its caller advances a step at a time, between the
/// steps of other work (matmul_all_reduce paces a group's gather over the
/// next group's ring). MPI_Iallgatherv instead puts every block in flight
/// at once: R - 1 flows each way per rank share the links from the start,
/// so the other work's transfers get 1/R of them while the gather lasts
/// (the cost model's all-reduce misses of up to 22% on SMPI's fat trees,
/// docs/smpi.md), and it progresses, on an MPI without a progress thread,
/// only inside MPI calls. Here one block per step is in flight each way,
/// posted when the caller says, and every message is contiguous, so that
/// SMPI's timing-only runs move it between shared buffers.

#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include "overlap/core/error.hpp"
#include "overlap/mpi/datatype.hpp"
#include "overlap/mpi/request.hpp"

namespace overlap::engine {

/// A gather's buffer: R blocks, block q (rank q's) counts[q] elements of
/// `type` at element displs[q] of `base`. The arrays outlive the gather.
struct gather_blocks {
  void* base = nullptr;                   ///< the buffer every block lands in
  const int* counts = nullptr;            ///< R counts, in elements
  const int* displs = nullptr;            ///< R displacements from base, in elements
  MPI_Datatype type = MPI_DATATYPE_NULL;  ///< the elements' type
};

/// A ring all-gather in place, R - 1 steps. At step s this rank sends to
/// the rank before it on the ring the block of the rank s positions after
/// it, and receives from the rank after it the block of the rank s + 1
/// positions after it (the direction of the ops' lane 0). Collective in
/// effect: every rank of the communicator starts it with the same counts
/// and ring, and advances it through all its steps. Not thread-safe.
class paced_gather {
 public:
  /// The ring, from this rank on (element k: the rank k positions after
  /// this one; element 0 is this rank), the same circle on every rank, and
  /// the messages' tag, owned by the caller.
  void configure(std::vector<int> ring, int tag) {
    ring_ = std::move(ring);
    tag_ = tag;
  }
  /// The watchdog's bound on each wait (0: none, the default; a wait past
  /// it throws mpi::wait_timeout).
  void set_timeout(double seconds) noexcept { requests_.set_timeout(seconds); }
  /// True once configure has given it a ring.
  [[nodiscard]] bool configured() const noexcept { return !ring_.empty(); }

  /// Starts a gather of `blocks` on comm: posts its first step (none on one
  /// rank). The previous gather must have finished.
  void start(const gather_blocks& blocks, MPI_Comm comm) {
    blocks_ = blocks, comm_ = comm;
    posted_ = 0;
    steps_ = static_cast<int>(ring_.size()) - 1;
    if (steps_ > 0) post(0);
  }
  /// R - 1: the gather's steps.
  [[nodiscard]] int steps() const noexcept { return steps_; }
  /// True between start and the wait that completes the last step.
  [[nodiscard]] bool active() const noexcept { return posted_ > 0; }

  /// Until `want` steps (at most R - 1) are posted: waits for the step in
  /// flight (whose block the next step passes on) and posts the next.
  void advance_to(int want) {
    want = std::min(want, steps_);
    while (active() && posted_ < want) {
      requests_.wait_due(posted_ - 1);
      post(posted_);
    }
  }
  /// Posts and waits for every step left (blocking).
  void finish() {
    advance_to(steps_);
    requests_.wait_all();
    posted_ = 0;
  }
  /// Forgets what is in flight without waiting (a fatal error: a send to
  /// a peer that is gone may never complete; mpi::request_group::leak).
  void leak() noexcept {
    requests_.leak();
    posted_ = 0;
  }

 private:
  void post(int s) {
    const int out = ring_[static_cast<size_t>(s)], in = ring_[static_cast<size_t>(s) + 1];
    const int to = ring_.back(), from = ring_[1];
    int size = 0;
    MPI_Type_size(blocks_.type, &size);
    auto* base = static_cast<char*>(blocks_.base);
    const auto at = [&](int q) { return base + static_cast<std::ptrdiff_t>(blocks_.displs[q]) * size; };
    mpi::request_group::about recv{0, from, blocks_.type, false};
    recv.count = blocks_.counts[in];
    OVERLAP_MPI(MPI_Irecv, mpi::any_buffer(at(in)), blocks_.counts[in], blocks_.type, from, tag_, comm_,
                requests_.add(s, recv));
    mpi::request_group::about send{0, to, blocks_.type, true};
    send.count = blocks_.counts[out];
    OVERLAP_MPI(MPI_Isend, mpi::any_buffer(at(out)), blocks_.counts[out], blocks_.type, to, tag_, comm_,
                requests_.add(s, send));
    posted_ = s + 1;
  }

  std::vector<int> ring_;
  int tag_ = 0;
  mpi::request_group requests_;
  gather_blocks blocks_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int steps_ = 0, posted_ = 0;
};

}  // namespace overlap::engine
