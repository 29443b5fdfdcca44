#pragma once
/// @file
/// The pipeline every op runs, written once. An op is a traits type (`Op`,
/// e.g. ag_op<T> in all_gather_matmul-inl.hpp) that says what is its own:
/// its arguments and options, the checks of one rank, the row the ranks
/// exchange and the rules across ranks, the schedule's choice, the builders
/// of its plans (bulk, ring, hierarchical, other operands), its bulk run and
/// its ring pattern. This file does the rest: preparing a call (checks,
/// agreement, choice, building, caching), running a plan (a batch's members,
/// packing B, the ring), and the three entry points (ops/entry_points.hpp).
/// docs/design.md, "Adding an op", lists what a traits type declares.

#include <mpi.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "overlap/ops/accumulate.hpp"
#include "overlap/ops/call_agreement.hpp"
#include "overlap/ops/checks.hpp"
#include "overlap/ops/choose.hpp"
#include "overlap/ops/entry_points.hpp"
#include "overlap/ops/measured_plans.hpp"
#include "overlap/ops/op_id.hpp"
#include "overlap/ops/others.hpp"
#include "overlap/ops/pending.hpp"
#include "overlap/ops/run.hpp"
#include "overlap/ops/site.hpp"
#include "overlap/ops/verbose.hpp"
#include "overlap/runtime/context.hpp"
#include "overlap/schedule/model.hpp"
#include "overlap/schedule/schedule.hpp"

namespace overlap::detail {

/// The types an op's traits type names, for the pipeline: its element
/// type, operands (with c, the output), options, plan, the row the ranks
/// exchange, what the exchanged table says about the whole problem, and
/// its ring pattern (engine/ring.hpp).
template <class T, class Args, class Options, class Plan, class Row, class Global, class Pattern>
struct op_types {
  using element = T;
  using args = Args;
  using options = Options;
  using plan = Plan;
  using row = Row;
  using global = Global;
  using pattern = Pattern;
};

/// What names an op to the pipeline: its id (ops/op_id.hpp), with the names
/// and tags its file declares (op_info<Id>), the member of its options that
/// holds its layout (e.g. &ag_options::gathered), and the setting of its
/// configured chunks (e.g. &config::ag_chunks).
template <op_id Id, auto Layout, auto ConfiguredChunks>
struct op_names {
  static constexpr op_id id = Id;
  static constexpr entry_names names = op_info<Id>::names;
  static constexpr op_tags tags = op_info<Id>::tags;
  static constexpr auto layout = Layout;
  static constexpr auto configured_chunks = ConfiguredChunks;
};

/// Which builders apply to an op's problem, as the op declares them
/// (`static constexpr op_builders<...> builders()`): each names one of the
/// op's static functions, or is null where the op has no such plan (its
/// choose never asks for one: matmul_all_reduce has no other-operands
/// algorithm). `ring` builds the one- and two-lane rings; `hierarchical`
/// the two-level ring.
template <class Plan, class Args, class Options, class Global>
struct op_builders {
  using simple = void (*)(const build_site&, Plan&, const Args&, const Options&);
  using pieces = void (*)(const build_site&, Plan&, const Args&, const Options&, int);
  using whole = void (*)(const build_site&, Plan&, const Args&, const Options&, const Global&, int);
  simple bulk = nullptr;          ///< gather-then-compute or compute-then-reduce, in collectives
  pieces ring = nullptr;          ///< a ring of `chunks` pieces per shard
  pieces hierarchical = nullptr;  ///< a ring between nodes and one inside them
  whole others = nullptr;         ///< the other operands travel, in `pieces`
};

/// What an op's traits type inherits unless it says otherwise: nothing to
/// do before its ring runs, no view beyond a, b and c in its plan key, and
/// the pipeline runs its plans (runs_itself: the op runs a batch member's
/// plan itself, Op::run_member, as matmul_all_reduce runs its groups' rings).
struct op_defaults {
  static constexpr bool runs_itself = false;
  template <class Context, class Plan, class Args>
  static void before_ring(Context& /*ctx*/, const Plan& /*plan*/, const Args& /*x*/) {}
  template <class Args, class Options>
  static void append_own_views(plan_key& /*key*/, const Args& /*x*/, const Options& /*o*/) {}
};

/// What the op's options and builders decide of a call's schedule request:
/// the strategy and algorithm asked, and which plans apply (a two-level
/// ring, the other operands: Op::builders()). The op adds the rest.
template <class Op>
schedule_request request_of(const typename Op::options& opt) {
  constexpr auto builders = Op::builders();
  schedule_request req;
  req.strategy = opt.strategy, req.algorithm = opt.algorithm;
  req.hierarchical = builders.hierarchical != nullptr;
  req.others_allowed = builders.others != nullptr;
  return req;
}

/// The plan key's part that only this rank's views decide: their leading
/// dimensions and batch strides (the op's own views' too).
template <class Op>
void append_strides(plan_key& key, const typename Op::args& x, const typename Op::options& o) {
  key.insert(key.end(), {x.a.ld, x.b.ld, x.c.ld, o.batch.a, o.batch.b, o.batch.c});
  Op::append_own_views(key, x, o);
}

/// A plan of schedule `sched` for the problem `g` describes, before it is
/// built: what runs, the batch, and the op's geometry (Op::describe).
template <class Op>
std::unique_ptr<typename Op::plan> plan_of(const typename Op::options& opt, const typename Op::global& g,
                                           const schedule& sched) {
  auto plan = std::make_unique<typename Op::plan>();
  plan->sched = sched;
  plan->strategy = sched.strategy;
  plan->algorithm = sched.algorithm;
  plan->lanes = sched.lanes;
  plan->batch = opt.batch;
  Op::describe(*plan, opt, g);
  return plan;
}

/// Builds a plan at `at` with the op's builder for its schedule
/// (Op::builders(): the other operands, bulk, hierarchical or a ring).
template <class Op>
void build(const build_site& at, typename Op::plan& plan, const typename Op::args& x, const typename Op::options& opt,
           const typename Op::global& g) {
  constexpr auto builders = Op::builders();
  const schedule& sched = plan.sched;
  auto missing = [&](const char* what) {
    throw std::logic_error(std::string(Op::names.call) + " has no " + what + " plan");
  };
  if (sched.algorithm == algorithm::others) {
    if (builders.others == nullptr) missing("other-operands");
    builders.others(at, plan, x, opt, g, sched.chunks);
  } else if (sched.strategy == strategy::bulk) {
    builders.bulk(at, plan, x, opt);
  } else if (sched.strategy == strategy::hierarchical) {
    if (builders.hierarchical == nullptr) missing("hierarchical");
    builders.hierarchical(at, plan, x, opt, sched.chunks);
  } else {
    builders.ring(at, plan, x, opt, sched.chunks);
  }
}

/// What the cost model prices for a candidate schedule: the plan this rank
/// would run, built dry at `at` (no kernels, buffers or datatypes), as
/// the op lists its transfers and products (Op::work_of).
template <class Op>
work priced(const build_site& at, const typename Op::args& x, const typename Op::options& opt,
            const typename Op::global& g, const schedule& sched) {
  const std::unique_ptr<typename Op::plan> plan = plan_of<Op>(opt, g, sched);
  build<Op>(at, *plan, x, opt, g);
  return Op::work_of(*plan, at);
}

/// Step 5 of preparing a call: builds the plan of the schedule. Buffers,
/// datatypes and primitives may fail on one rank only, so the outcome is
/// agreed before any transfer (build_agreed).
template <class Op>
std::unique_ptr<typename Op::plan> make_plan(context& ctx, const arg_checks& checks, const typename Op::args& x,
                                             const typename Op::options& opt, const typename Op::global& g,
                                             const schedule& sched, uint64_t fingerprint) {
  using T = typename Op::element;
  std::unique_ptr<typename Op::plan> plan = plan_of<Op>(opt, g, sched);
  plan->fingerprint = fingerprint;
  plan->summary = checks.op() + " " + to_string(dtype_of<T>()) + " on " + std::to_string(ctx.size()) +
                  " ranks: " + to_string(sched.strategy) + Op::summary(*plan, g);
  plan->schedule_words = to_string(sched);
  plan->automatic = opt.strategy == strategy::automatic;
  build_agreed(ctx, checks.op(), [&] {
    plan->saved.prepare(opt.accumulate, x.c, opt.batch.count, opt.batch.c);
    build<Op>(build_site(ctx), *plan, x, opt, g);
    return 0;
  });
  if (ctx.config().verbose && ctx.rank() == 0) {
    const bool chosen = ctx.config().*Op::configured_chunks == 0;
    log_built_plan(
        ctx, plan->summary,
        ring_summary(opt.strategy, *plan, sched.chunks, chosen, plan->slots.size() * sizeof(*plan->slots.data())) +
            Op::plan_notes(*plan) + "; schedule: " + plan->schedule_words,
        dtype_of<T>());
  }
  return plan;
}

/// The plan a call runs, and where automatic measures (measured_plans.hpp)
/// the choice to tell its time to (null: the call is not timed).
template <class Op>
struct call_plan {
  typename Op::plan& plan;
  std::shared_ptr<measured_choice> timed;
};

/// A call of a shape whose automatic schedule is measured: the plan of the
/// candidate whose turn it is (built on its first turn; a candidate whose
/// build fails, agreed on every rank, is skipped). Collective.
template <class Op>
call_plan<Op> measured_call(context& ctx, const arg_checks& checks, const typename Op::args& x,
                            const typename Op::options& opt, measured_plans<typename Op::plan, typename Op::global>& m,
                            call_use use) {
  measured_choice& choice = *m.choice();
  measured_choice::turn t = use == call_use::runs ? choice.next_call() : measured_choice::turn{choice.running(), false};
  for (;;) {
    try {
      typename Op::plan& plan = m.plan_for(t.candidate, [&](const schedule& s) {
        return make_plan<Op>(ctx, checks, x, opt, m.global(), s, m.fingerprint);
      });
      return {plan, t.timed ? m.choice() : nullptr};
    } catch (const std::exception&) {
      const size_t failed = t.candidate;
      choice.skip(failed);
      if (choice.running() == failed) throw;  // nothing else to run
      t = {choice.running(), t.timed && !choice.settled()};
    }
  }
}

/// Checks a call, agrees with the other ranks, and returns the plan (built
/// and cached on first use). Collective. The steps: the time of a timed
/// call pending from a started op (measured_plans.hpp), the checks each
/// rank makes alone, the agreement (and on a plan miss anywhere the
/// exchange of every rank's row), the rules that span ranks on that
/// exchange, choosing the schedule, building it. Where automatic measures,
/// the entry holds the candidates' plans and the call runs the one whose
/// turn it is (`use`: a call that runs counts as one of the shape's calls).
template <class Op>
call_plan<Op> prepare_call(context& ctx, const typename Op::args& x, const typename Op::options& opt, call_use use) {
  using T = typename Op::element;
  using measured = measured_plans<typename Op::plan, typename Op::global>;
  settle_timed_call(ctx, Op::names.call);
  arg_checks checks(Op::id, Op::names, dtype_of<T>(), to_string(opt.*Op::layout));
  const int backend = Op::local_checks(ctx, checks, x, opt);
  const typename Op::row mine = Op::row_of(ctx, x, opt);
  plan_key& key = ctx.scratch().key;
  key.clear();
  append_values(key, mine);
  // The bias is this rank's own business (it touches only this rank's c).
  key.insert(key.end(), {static_cast<bool>(opt.epilogue.bias), static_cast<int64_t>(checks.id()), backend,
                         static_cast<int64_t>(checks.type())});
  append_strides<Op>(key, x, opt);
  const agreement<typename Op::row> agreed_on = agree_or_exchange(ctx, checks, key, mine);
  if (agreed_on.cached != nullptr) {
    if (auto* m = dynamic_cast<measured*>(agreed_on.cached)) return measured_call<Op>(ctx, checks, x, opt, *m, use);
    return {static_cast<typename Op::plan&>(*agreed_on.cached), nullptr};
  }

  const plan_key stored = key;  // the scratch is the next call's
  const typename Op::global g = Op::global_checks(ctx, checks, opt, agreed_on.table);
  const schedule sched = Op::choose(ctx, x, opt, g);
  const uint64_t fingerprint = agreed_on.fingerprint(checks.id());
  if (measures(ctx, sched)) {
    const std::string call = checks.op() + " " + to_string(dtype_of<T>()) + " on " + std::to_string(ctx.size()) +
                             " ranks:" + Op::summary(*plan_of<Op>(opt, g, sched), g);
    auto choice = choice_for(ctx, sched, choice_key(ctx, checks.op(), fingerprint), call);
    auto& m = static_cast<measured&>(
        *ctx.store_plan(stored, std::make_unique<measured>(g, sched, std::move(choice), fingerprint)));
    return measured_call<Op>(ctx, checks, x, opt, m, use);
  }
  return {static_cast<typename Op::plan&>(
              *ctx.store_plan(stored, make_plan<Op>(ctx, checks, x, opt, g, sched, fingerprint))),
          nullptr};
}

/// prepare_call for a caller that only asks which plan runs (it does not
/// count as a call of the shape).
template <class Op>
typename Op::plan& prepare(context& ctx, const typename Op::args& x, const typename Op::options& opt) {
  return prepare_call<Op>(ctx, x, opt, call_use::asks).plan;
}

/// A ring pattern that packs B (b_packing) just before its first product,
/// after the first step's transfers are posted: packed before the ring, B
/// delayed them by the pack (about 1 ms for the 8 MiB B of f32 2048^3,
/// on the all-gather's path: SMPI's star mirror, docs/results.md). No
/// transfer of a step reads B.
template <class Pattern, class Plan, class Args>
struct packing_first {
  Pattern& p;
  Plan& plan;
  const Args& x;
  bool packed = false;  ///< true from the start where B needs no packing this call
  [[nodiscard]] int steps() const { return p.steps(); }
  [[nodiscard]] engine::ring_window window() const { return p.window(); }
  [[nodiscard]] engine::transfer recv(int t, int lane) const { return p.recv(t, lane); }
  [[nodiscard]] engine::transfer send(int t, int lane) const { return p.send(t, lane); }
  void compute(int t) {
    if (!packed) plan.pack.pack(x.b.data), packed = true;
    p.compute(t);
  }
};

/// A pattern that calls hook(t, steps) before step t's sends are posted:
/// other work paced by the ring's steps (matmul_all_reduce's gathers).
template <class Pattern, class Hook>
struct hooked_steps {
  Pattern& p;
  Hook& hook;
  [[nodiscard]] int steps() const { return p.steps(); }
  [[nodiscard]] engine::ring_window window() const { return p.window(); }
  [[nodiscard]] engine::transfer recv(int t, int lane) const { return p.recv(t, lane); }
  [[nodiscard]] engine::transfer send(int t, int lane) {
    if (lane == 0) hook(t, p.steps());
    return p.send(t, lane);
  }
  void compute(int t) { p.compute(t); }
};

/// No hook.
struct no_step_hook {
  void operator()(int /*t*/, int /*steps*/) const noexcept {}
};

/// Runs a ring plan's steps with the op's ring pattern, B packed at the
/// first product (packing_first) unless `pack` is false (B already packed
/// in the plan this call: matmul_all_reduce's row groups share it), calling
/// hook(t, steps) before step t's sends (not at all under
/// ring_phases::compute_only, which posts none).
template <class Op, class Hook = no_step_hook>
void run_ring(context& ctx, typename Op::plan& plan, const typename Op::args& x, const typename Op::options& opt,
              const typename Op::element* bias, bool pack = true, Hook hook = {}) {
  typename Op::pattern pattern(plan, x, opt, bias, ctx.rank());
  using packing_t = packing_first<typename Op::pattern, typename Op::plan, typename Op::args>;
  packing_t packing{pattern, plan, x, !pack};
  const bool two_levels = plan.strategy == strategy::hierarchical;
  if constexpr (std::is_same_v<Hook, no_step_hook>) {
    run_on_ring(ctx, plan, packing, Op::tags, plan.lanes, two_levels);
  } else {
    hooked_steps<packing_t, Hook> hooked{packing, hook};
    run_on_ring(ctx, plan, hooked, Op::tags, plan.lanes, two_levels);
  }
  if (pattern.work_after_ring()) run_local_step(ctx, plan, [&] { pattern.after_ring(); });
}

/// Runs a prepared plan: C = the op's result. Bulk and the other-operands
/// algorithm run a batch's members one after the other on the same plan;
/// a ring moves every member's piece in one message per step.
template <class Op>
void run(context& ctx, typename Op::plan& plan, const typename Op::args& x, const typename Op::options& opt) {
  using T = typename Op::element;
  const T* bias = opt.epilogue.bias.template get<T>();
  if constexpr (Op::runs_itself) {  // an op made of other ops' plans (op_defaults)
    for (int64_t m = 0; m < plan.batch.count; ++m) Op::run_member(ctx, plan, Op::member(x, plan.batch, m), opt, bias);
  } else {
    if (plan.algorithm == algorithm::others || plan.strategy == strategy::bulk) {
      for (int64_t m = 0; m < plan.batch.count; ++m) {
        const typename Op::args y = Op::member(x, plan.batch, m);
        if (plan.algorithm == algorithm::others)
          others_runner<T>(ctx, plan, plan.others, Op::tags.blocks, y, bias).run();
        else
          Op::bulk(ctx, plan, y, opt, bias);
      }
      return;
    }
    Op::before_ring(ctx, plan, x);
    run_ring<Op>(ctx, plan, x, opt, bias);
  }
}

/// Runs a prepared call (with accumulate's save and add); a timed one
/// leaves its seconds on this rank for the ranks to agree on
/// (settle_timed_call).
template <class Op>
void run_call(context& ctx, const call_plan<Op>& p, const typename Op::args& x, const typename Op::options& opt) {
  const double t0 = p.timed ? MPI_Wtime() : 0;
  // A timed call times its candidate alone: the caller's side work, if any
  // (request_group::fill_waits), waits until after it rather than be charged
  // to whichever candidate's waits happened to run it.
  mpi::request_group::idle_work* const side = p.timed ? ctx.requests().fill_waits(nullptr) : nullptr;
  run_accumulating(ctx, p.plan, p.plan.saved, x.c, [&] { run<Op>(ctx, p.plan, x, opt); });
  if (p.timed) ctx.last_timed() = {p.timed, MPI_Wtime() - t0};
  if (side != nullptr) ctx.requests().fill_waits(side);
}

/// The call: prepared and run on this thread (a timed call's time agreed at once).
template <class Op, class Args, class Options>
void op_call(context& ctx, const Args& x, const Options& opt) {
  static_assert(std::is_same_v<Args, typename Op::args> && std::is_same_v<Options, typename Op::options>);
  ctx.check_usable(Op::names.call);
  const call_plan<Op> p = prepare_call<Op>(ctx, x, opt, call_use::runs);
  run_call<Op>(ctx, p, x, opt);
  if (p.timed) settle_timed_call(ctx, Op::names.call);
}

/// The call, started: prepared here, run as the worker's job (a timed
/// call's time is agreed when the next call on the context is prepared:
/// the worker runs no collective of its own). Its time runs from the job's
/// start to its end, so a candidate whose transfers slow the caller's own
/// work meanwhile is not charged for it, but one that finishes later is.
template <class Op, class Args, class Options>
pending op_start(context& ctx, const Args& x, const Options& opt) {
  static_assert(std::is_same_v<Args, typename Op::args> && std::is_same_v<Options, typename Op::options>);
  ctx.check_usable(Op::names.start);
  engine::worker& w = ctx.start_worker(Op::names.start);
  const call_plan<Op> p = prepare_call<Op>(ctx, x, opt, call_use::runs);
  w.post([&ctx, p, x, opt] { run_call<Op>(ctx, p, x, opt); });
  return pending(&w);
}

/// The schedule a call runs (builds and caches its plan).
template <class Op, class Args, class Options>
schedule op_schedule(context& ctx, const Args& x, const Options& opt) {
  static_assert(std::is_same_v<Args, typename Op::args> && std::is_same_v<Options, typename Op::options>);
  ctx.check_usable(Op::names.schedule);
  return prepare<Op>(ctx, x, opt).sched;
}

}  // namespace overlap::detail
