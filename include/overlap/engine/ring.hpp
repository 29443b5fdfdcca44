#pragma once
/// @file
/// The ring engine: one loop for both patterns (all-gather-then-compute, where
/// input shards travel, and compute-then-reduce-scatter, where accumulators
/// travel). A Pattern says, per step, what arrives, what leaves and what to
/// compute; the engine posts the transfers, keeps them progressing while the
/// step computes, and completes them.

#include <mpi.h>

#include <exception>

#include "overlap/config.hpp"
#include "overlap/engine/progress.hpp"
#include "overlap/error.hpp"
#include "overlap/mpi/request.hpp"

namespace overlap::engine {

/// One block to send or receive: count 1 of a derived datatype at buf.
/// A transfer with type == MPI_DATATYPE_NULL means "nothing this step".
struct transfer {
  void* buf = nullptr;
  MPI_Datatype type = MPI_DATATYPE_NULL;
  [[nodiscard]] bool active() const noexcept { return type != MPI_DATATYPE_NULL; }
};

/// Where this rank sits in the ring: data arrives from `from` and leaves to `to`.
struct ring_links {
  MPI_Comm comm = MPI_COMM_NULL;
  int from = MPI_PROC_NULL;
  int to = MPI_PROC_NULL;
  int tag = 0;
};

/// Runs the ring schedule of `pattern`:
///
///   for each step t:
///     post Irecv of the data step t + lead needs   (pattern.recv(t + lead))
///     post Isend of what leaves at step t          (pattern.send(t))
///     compute step t while the progress policy moves the transfers
///     complete this step's transfers
///
/// The pattern's lead is chosen so that every message posted at step t is
/// matched by the neighbour's post at its step t: all transfers of a step
/// complete within that step, and the pattern needs lead + 1 (+1 when it
/// sends a step's result one step later) buffer slots, none allocated here.
///
/// Pattern requirements:
///   int steps() const; int lead() const (>= 1);
///   transfer recv(int t) const; transfer send(int t) const; void compute(int t);
template <class Pattern>
void run_ring(const ring_links& links, Pattern& pattern, mpi::request_group& requests,
              progress_thread* progress, ring_phases phases = ring_phases::both) {
  const int steps = pattern.steps();
  const int lead = pattern.lead();
  const bool transfers = phases != ring_phases::compute_only;
  const bool compute = phases != ring_phases::comm_only;
  // If a step throws (an MPI or backend error), its requests are cancelled so
  // the next call starts from an empty group. The peers of this rank cannot
  // finish this call then: such errors are fatal to the collective, like any
  // MPI error inside a collective.
  struct cancel_on_throw {
    mpi::request_group& g;
    int unwinding = std::uncaught_exceptions();
    ~cancel_on_throw() {
      if (std::uncaught_exceptions() > unwinding) g.cancel_all();
    }
  } guard{requests};
  for (int t = 0; t < steps; ++t) {
    if (transfers && t + lead < steps) {
      const transfer in = pattern.recv(t + lead);
      if (in.active())
        OVERLAP_MPI(MPI_Irecv, in.buf, 1, in.type, links.from, links.tag, links.comm, requests.add());
    }
    const transfer out = transfers ? pattern.send(t) : transfer{};
    if (out.active())
      OVERLAP_MPI(MPI_Isend, out.buf, 1, out.type, links.to, links.tag, links.comm, requests.add());

    progress_scope scope(progress, requests);
    if (compute) pattern.compute(t);
    scope.finish();
    requests.wait_all();
  }
}

}  // namespace overlap::engine
