#pragma once
/// @file
/// Running the parts of an op after the ranks agreed to run it: the ring,
/// a bulk collective, a local compute step; every failure there takes the
/// one fatal path (context::fatal applies the policy).

#include <string>

#include "overlap/engine/ring.hpp"
#include "overlap/ops/faults.hpp"
#include "overlap/ops/op_id.hpp"
#include "overlap/runtime/context.hpp"
#include "overlap/runtime/watchdog.hpp"

namespace overlap::detail {

/// Runs `f`, a part of an op after the ranks agreed to run it, on the one
/// error path of such parts: the peers are in it too, so a watchdog timeout,
/// an MPI or backend error or any other exception is fatal (context::fatal
/// applies the policy). where() describes the place; `part` names it in
/// the call of the report ("ring": "ring wait", "ring step").
template <class Where, class F>
void fatal_on_failure(context& ctx, const plan_base& plan, const std::string& part, Where&& where, F&& f) {
  try {
    f();
  } catch (const mpi::wait_timeout& e) {
    ctx.fatal("watchdog: " + plan.summary + ": " + e.what(), (part + " wait").c_str(), 0, error_source::watchdog);
  } catch (const error& e) {
    ctx.fatal(where() + ": " + e.what(), e.call().c_str(), e.code(), e.source());
  } catch (const std::exception& e) {
    ctx.fatal(where() + ": " + e.what(), (part + " step").c_str(), 0, error_source::backend);
  }
}

/// Runs an op's ring pattern on the context's ring (context::ring). Lane 0
/// carries data from the next rank on the ring to the previous one
/// (ring_at(1) to ring_at(-1)), lane 1 (bidirectional) the other way, each
/// with the op's tag for it (`tags`, its op_info's); with `two_levels` (the hierarchical
/// schedule) lane 0 runs between nodes (from this local rank of the next
/// node to that of the previous one) and lane 1 inside the node (from the
/// next local rank to the previous one). Any failure
/// inside the ring (MPI, backend, the watchdog) is fatal: the peers are in
/// the ring too (context::fatal applies the policy).
template <class Pattern>
void run_on_ring(context& ctx, const plan_base& plan, Pattern& pattern, const op_tags& tags, int lanes,
                 bool two_levels = false) {
  const int p = ctx.rank();
  engine::ring_links links;
  links.comm = ctx.comm();
  links.n_lanes = lanes;
  links.lanes[0] = {ctx.ring_at(1), ctx.ring_at(-1), tags.lanes[0]};
  links.lanes[1] = {ctx.ring_at(-1), ctx.ring_at(1), tags.lanes[1]};
  if (two_levels) {
    links.lanes[0] = {ctx.node_peer(1, 0), ctx.node_peer(-1, 0), tags.lanes[0]};
    links.lanes[1] = {ctx.node_peer(0, 1), ctx.node_peer(0, -1), tags.lanes[1]};
  }
  const bool trace = ctx.config().verbose >= 2 && p == 0;
  int step = 0;
  // Where the failure happened: the plan, the step, and the ring neighbours.
  auto where = [&] {
    std::string s = plan.summary + ", at ring step " + std::to_string(step + 1) + " of " +
                    std::to_string(pattern.steps()) + " (lane 0 receives from " + ctx.rank_name(links.lanes[0].from) +
                    " and sends to " + ctx.rank_name(links.lanes[0].to);
    if (two_levels)
      return s + "; lane 1, inside the node, receives from " + ctx.rank_name(links.lanes[1].from) + " and sends to " +
             ctx.rank_name(links.lanes[1].to) + ")";
    return s + (lanes == 2 ? "; lane 1 the other way)" : ")");
  };
  engine::trace_recorder* rec = ctx.tracer();
  const double t0 = rec != nullptr ? rec->now() : 0.0;
  fatal_on_failure(ctx, plan, "ring", where, [&] {
    if (test_fault.rank == p) {
      faulty_pattern<Pattern> faulty{pattern, test_fault.step};
      engine::run_ring(links, faulty, ctx.requests(), ctx.progress(), ctx.config().phases, trace, &step, rec);
    } else {
      engine::run_ring(links, pattern, ctx.requests(), ctx.progress(), ctx.config().phases, trace, &step, rec);
    }
  });
  if (rec != nullptr)
    rec->span(plan.summary, "op", engine::trace_recorder::track::ops, t0, rec->now(),
              {{"steps", pattern.steps()}, {"lanes", lanes}});
}

/// Runs a bulk collective of a plan (blocking, or bounded by the watchdog);
/// not at all under ring_phases::compute_only (benchmarks time each half alone).
template <class Blocking, class Start>
void run_collective(context& ctx, const plan_base& plan, const char* call, Blocking&& blocking, Start&& start) {
  if (ctx.config().phases == ring_phases::compute_only) return;
  maybe_stall(ctx.rank());
  engine::trace_recorder* rec = ctx.tracer();
  const double t0 = rec != nullptr ? rec->now() : 0.0;
  watched_collective(ctx, call, blocking, start, [&] { return plan.summary; });
  if (rec != nullptr)
    rec->span(std::string(call) + ": " + plan.summary, "collective", engine::trace_recorder::track::ops, t0,
              rec->now());
}

/// Runs a local compute step outside a ring (a bulk GEMM, packing B, a
/// finishing pass): a failure there is fatal like one in a ring, since the
/// peers go on to the next collective. Not at all under
/// ring_phases::comm_only.
template <class F>
void run_local_step(context& ctx, const plan_base& plan, F&& f) {
  if (ctx.config().phases == ring_phases::comm_only) return;
  engine::trace_recorder* rec = ctx.tracer();
  const double t0 = rec != nullptr ? rec->now() : 0.0;
  try {
    f();
    if (rec != nullptr)
      rec->span("local step: " + plan.summary, "gemm", engine::trace_recorder::track::ops, t0, rec->now());
  } catch (const error& e) {
    ctx.fatal(plan.summary + ": " + e.what(), e.call().c_str(), e.code(), e.source());
  }
}

}  // namespace overlap::detail
