#pragma once
/// @file
/// The ring engine: one loop for both patterns (all-gather-then-compute, where
/// input shards travel, and compute-then-reduce-scatter, where accumulators
/// travel). A Pattern says, per step and lane, what arrives, what leaves and
/// what to compute; the engine posts the transfers ahead of the products,
/// keeps them progressing while the step computes, and completes each one
/// only when a later step needs it complete. A transfer goes to its lane's
/// neighbour unless it names a peer: a pairwise exchange (all-to-all), whose
/// step t computes on the block of the rank t places back and sends the rank
/// t + 1 places on the block it needs next, runs on the same loop.

#include <mpi.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <exception>

#include "overlap/config.hpp"
#include "overlap/core/error.hpp"
#include "overlap/engine/progress.hpp"
#include "overlap/engine/trace.hpp"
#include "overlap/mpi/request.hpp"
#include "overlap/mpi/simulator.hpp"

namespace overlap::engine {

/// One block to send or receive: `count` elements of `type` at buf, to or
/// from `peer`. A transfer with type == MPI_DATATYPE_NULL means "nothing
/// this step".
struct transfer {
  /// The peer of a transfer that names none: its lane's neighbour (ring_lane::to for a send, from for a receive).
  static constexpr int lane_neighbour = -1000000;
  void* buf = nullptr;                    ///< the block's first byte
  MPI_Datatype type = MPI_DATATYPE_NULL;  ///< its layout
  int count = 1;                          ///< how many of `type`
  /// The rank (in the links' communicator) it goes to or comes from: a
  /// pairwise exchange names a different peer each step; a ring leaves it
  /// to the lane (lane_neighbour).
  int peer = lane_neighbour;
  /// The step before which it must complete; -1: for a receive, the step
  /// that computes on it, for a send, the window's bound (t + 1 +
  /// send_slack). A pattern that knows better says so: matmul_reduce_scatter's
  /// owner computes before its accumulator is needed (rs_step::ahead), and its
  /// sends' slots are rewritten only at a later step (rs_step::send_due).
  int due = -1;
  [[nodiscard]] bool active() const noexcept { return type != MPI_DATATYPE_NULL; }  ///< something to move
  /// The rank it moves to or from on `lane`, whose neighbour is `neighbour`.
  [[nodiscard]] int peer_or(int neighbour) const noexcept { return peer == lane_neighbour ? neighbour : peer; }
};

/// One direction round the ring: data arrives from `from` and leaves to `to`
/// (unless a transfer names its own peer).
struct ring_lane {
  int from = MPI_PROC_NULL;  ///< the rank data arrives from
  int to = MPI_PROC_NULL;    ///< the rank data leaves to
  int tag = 0;               ///< distinct per lane, so the lanes' messages never match each other
};

/// Where this rank sits in the ring: up to two lanes (unidirectional or
/// bidirectional schedules).
struct ring_links {
  MPI_Comm comm = MPI_COMM_NULL;     ///< the communicator the ranks are numbered in
  std::array<ring_lane, 2> lanes{};  ///< lanes[0], and lanes[1] when n_lanes is 2
  int n_lanes = 1;                   ///< 1 or 2
};

/// How long transfers may stay in flight, in steps (both >= 0):
///   a receive for step u is posted at step u - lead and completed just before
///   step u computes;
///   a send posted at step t is completed before step t + 1 + send_slack
///   posts anything.
/// A pattern chooses them so that the neighbour posts the matching operation
/// in the same step, and sizes its buffers so that no buffer is rewritten
/// while a transfer on it may be in flight (see the ops' plans).
struct ring_window {
  int lead = 1;        ///< steps a receive is posted ahead of the step that computes on it
  int send_slack = 0;  ///< steps a send may stay in flight after the step that posted it
  /// A lane's sends go out one at a time (mpi::request_group::send_paced):
  /// with send_slack >= 1 several pieces could share the lane's link, and
  /// the first, whose product waits for it, would arrive last (the ops'
  /// plans decide: detail::paced_lanes).
  bool paced = false;
  /// With paced lanes, under progress_policy::none (no one tests the
  /// requests while a step computes): before each step, post a lane's held
  /// send when the one in flight is expected to complete during the step
  /// (mpi::request_group::release_ahead, the previous step's time as the
  /// horizon), rather than at the step's end.
  bool ahead = false;
};

/// The buffers a ring plan's travelling pieces live in while a plan is
/// built: `per_lane` slots per lane (enough for the window), `lanes` lanes,
/// and the largest piece so far, which sizes every slot.
struct ring_slots {
  ///@{
  /// Slots per lane, and lanes.
  int per_lane = 0, lanes = 1;
  ///@}
  int64_t elems = 0;  ///< elements of the largest piece, which every slot holds
};

namespace detail {
/// Lane l's receive of what step u needs, completed before step u.
template <class Pattern>
void post_recv(const ring_links& links, Pattern& pattern, mpi::request_group& requests, int u, int l) {
  const ring_lane& lane = links.lanes[static_cast<size_t>(l)];
  const transfer in = pattern.recv(u, l);
  if (!in.active()) return;
  const int from = in.peer_or(lane.from);
  mpi::request_group::about what{l, from, in.type, false};
  what.count = in.count;
  OVERLAP_MPI(MPI_Irecv, in.buf, in.count, in.type, from, lane.tag, links.comm,
              requests.add(in.due >= 0 ? in.due : u, what));
}

/// Step t's transfers: the receive for step t + lead, the send of step t.
template <class Pattern>
void post_step(const ring_links& links, Pattern& pattern, mpi::request_group& requests, const ring_window& w, int t,
               int steps) {
  for (int l = 0; l < links.n_lanes; ++l) {
    const ring_lane& lane = links.lanes[static_cast<size_t>(l)];
    if (t + w.lead < steps) post_recv(links, pattern, requests, t + w.lead, l);
    const transfer out = pattern.send(t, l);
    if (!out.active()) continue;
    const int to = out.peer_or(lane.to);
    mpi::request_group::about what{l, to, out.type, true};
    what.count = out.count;
    const int due = out.due >= 0 ? out.due : t + 1 + w.send_slack;
    if (w.paced) {
      requests.send_paced(out.buf, out.count, out.type, to, lane.tag, links.comm, due, what);
      continue;
    }
    OVERLAP_MPI(MPI_Isend, out.buf, out.count, out.type, to, lane.tag, links.comm, requests.add(due, what));
  }
}

/// The receives for steps 0 .. lead - 1, which no step posts.
template <class Pattern>
void post_first_receives(const ring_links& links, Pattern& pattern, mpi::request_group& requests, const ring_window& w,
                         int steps) {
  for (int u = 0; u < w.lead && u < steps; ++u)
    for (int l = 0; l < links.n_lanes; ++l) post_recv(links, pattern, requests, u, l);
}

/// Step t's product, with the progress policy's help for the transfers in
/// flight; the verbose line (trace) and the timeline span (rec).
template <class Pattern>
void compute_step(Pattern& pattern, mpi::request_group& requests, progress_thread* progress, int t, int steps,
                  bool trace, double waited_s, trace_recorder* rec) {
  const double t1 = trace ? mpi::wtime() : 0.0;
  const int in_flight = requests.size();
  const double c0 = rec != nullptr ? rec->now() : 0.0;
  progress_scope scope(progress, requests);
  pattern.compute(t);
  scope.finish();
  if (rec != nullptr)
    rec->span("gemm, step " + std::to_string(t + 1) + "/" + std::to_string(steps), "gemm", trace_recorder::track::steps,
              c0, rec->now(), {{"outstanding_transfers", in_flight}});
  if (trace)
    std::fprintf(stderr, "overlap: ring step %d/%d: waited %.3f ms, computed %.3f ms, %d transfers outstanding\n",
                 t + 1, steps, waited_s * 1e3, (mpi::wtime() - t1) * 1e3, in_flight);
}
}  // namespace detail

/// Runs the ring schedule of `pattern`:
///
///   for each step t:
///     complete the transfers due before step t  (this step's receives,
///                                                sends older than the slack)
///     for each lane: post Irecv of what step t + lead needs  (pattern.recv)
///     for each lane: post Isend of what leaves at step t     (pattern.send)
///     compute step t while the progress policy moves the transfers
///
/// Receives of steps before `lead` are posted before step 0 (the ring
/// patterns have none: their data is local; the hierarchical one has some).
///
/// Pattern requirements:
///   int steps() const; ring_window window() const;
///   transfer recv(int t, int lane) const; transfer send(int t, int lane);
///   void compute(int t);
///
/// send(t, lane) is called once per step and lane, after the transfers due
/// before step t completed and before step t computes: a pattern may fill
/// the block it returns there (ring attention adds its share of gradients
/// that arrived for step t before passing them on).
///
/// With `trace`, prints one line per step to stderr: the time spent waiting
/// for the step's transfers, the time computing it, and how many transfers
/// were outstanding (posted, not yet completed by the engine) when it started
/// computing (OVERLAP_VERBOSE=2 on rank 0).
/// `at`, when given, holds the step being run (for error reports); `rec`,
/// when given (OVERLAP_TRACE), records every step's wait and GEMM.
template <class Pattern>
void run_ring(const ring_links& links, Pattern& pattern, mpi::request_group& requests, progress_thread* progress,
              ring_phases phases = ring_phases::both, bool trace = false, int* at = nullptr,
              trace_recorder* rec = nullptr) {
  const int steps = pattern.steps();
  const ring_window w = pattern.window();
  // If a step throws (an MPI or backend error, or the watchdog), its requests
  // are forgotten (freed, not waited for: a send to a peer that is gone may
  // never complete) so the group is empty again. The peers of this rank
  // cannot finish this call then: such errors are fatal to the collective,
  // and the caller applies the context's fatal policy (ops/run.hpp). The
  // buffers of the failed run must outlive whatever MPI still does with them.
  struct leak_on_throw {
    mpi::request_group& g;
    int unwinding = std::uncaught_exceptions();
    ~leak_on_throw() {
      if (std::uncaught_exceptions() > unwinding) g.leak();
    }
  } guard{requests};
  // Receives of the first `lead` steps (most patterns have none: their data
  // is local) are posted before the first step.
  if (phases != ring_phases::compute_only) detail::post_first_receives(links, pattern, requests, w, steps);
  double last_step_s = 0;  // the previous step's compute: the horizon of release_ahead
  for (int t = 0; t < steps; ++t) {
    if (at != nullptr) *at = t;
    const double t0 = trace ? mpi::wtime() : 0.0;
    const double w0 = rec != nullptr ? rec->now() : 0.0;
    requests.wait_due(t);
    if (rec != nullptr && rec->now() - w0 > 1.0)  // waits under a microsecond: nothing to see
      rec->span("wait, step " + std::to_string(t + 1), "wait", trace_recorder::track::steps, w0, rec->now());
    if (phases != ring_phases::compute_only) detail::post_step(links, pattern, requests, w, t, steps);
    if (phases == ring_phases::comm_only) continue;
    if (w.ahead) requests.release_ahead(last_step_s);
    const double c0 = w.ahead ? mpi::wtime() : 0.0;
    detail::compute_step(pattern, requests, progress, t, steps, trace, trace ? mpi::wtime() - t0 : 0.0, rec);
    if (w.ahead) last_step_s = mpi::wtime() - c0;
  }
  if (at != nullptr) *at = steps;
  requests.wait_all();
}

}  // namespace overlap::engine
