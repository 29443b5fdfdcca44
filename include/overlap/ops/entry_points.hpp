#pragma once
/// @file
/// The three entry points every op has, declared once for all ops: the
/// call, the call started on the context's worker, and the schedule a call
/// runs. `Op` is the op's traits type (ag_op<T>, rs_op<T>: see
/// ops/pipeline.hpp, which defines the entry points); it may be incomplete
/// where they are called. The compiled library instantiates them for every
/// op and element type in one list (src/instantiations.cpp); the
/// header-only flavour instantiates them where they are called.

#include "overlap/ops/pending.hpp"
#include "overlap/schedule/schedule.hpp"

namespace overlap {
class context;
namespace detail {

/// The call: prepared and run on this thread. Collective over ctx.
template <class Op, class Args, class Options>
void op_call(context& ctx, const Args& x, const Options& opt);

/// The call, started: prepared on this thread, run as the worker's job.
/// Collective over ctx (the preparing); pending::wait is local.
template <class Op, class Args, class Options>
pending op_start(context& ctx, const Args& x, const Options& opt);

/// The schedule the call runs (builds and caches its plan). Collective over ctx.
template <class Op, class Args, class Options>
schedule op_schedule(context& ctx, const Args& x, const Options& opt);

}  // namespace detail
}  // namespace overlap
