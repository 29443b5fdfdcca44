// The cost model prices the plan that runs. For every case of the
// identical sweep (support/identical_sweep.hpp, the cases
// tools/identical/compare.sh hashes), on every rank:
// - the products and transfers the model reads from the plan built dry
//   (`priced`, what choosing a schedule builds for each candidate) equal
//   those of the plan built to run, step by step;
// - over all ranks, the products add up to the call's whole work, counted
//   from the sweep's sizes alone: all_gather_matmul, every rank's c with
//   all of K; matmul_reduce_scatter, all of C with every rank's K shard.
// matmul_all_reduce, which the sweep leaves out, is checked the same way
// over its layouts, strategies, element types and uneven K shards.
//   (The other-operands algorithm computes other blocks on other ranks, but
//   the same total.) So neither list can be empty, or short of a piece.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <exception>
#include <string>

#include "identical_sweep.hpp"
#include "overlap/ops/all_gather_matmul-inl.hpp"
#include "overlap/ops/matmul_all_reduce-inl.hpp"
#include "overlap/ops/matmul_reduce_scatter-inl.hpp"
#include "overlap/overlap.hpp"

namespace {

using namespace overlap_sweep;
using overlap::detail::build_site;
using overlap::detail::work;

/// Multiply-adds of a plan's products as the model lists them.
double products_of(const work& w) {
  double sum = 0;
  for (const auto& g : w.gemms) sum += double(g.m) * double(g.n) * double(g.k) * double(g.times);
  for (const auto& st : w.ring_steps)
    for (const auto& g : st.products) sum += double(g.m) * double(g.n) * double(g.k) * double(g.times);
  return sum;
}

double summed(double x) {
  double all = 0;
  MPI_Allreduce(&x, &all, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return all;
}

struct tally {
  int checked = 0, refused = 0, ring = 0, others = 0;
};

/// One case through op Op: the built plan (prepared as a call prepares it)
/// against the dry one. `mine`: this rank's share of the whole work.
template <class Op>
void check(overlap::context& ctx, const sweep_case& sc, const typename Op::args& x, const typename Op::options& opt,
           double mine, tally& t) {
  const typename Op::plan* plan = nullptr;
  try {
    plan = &overlap::detail::prepare<Op>(ctx, x, opt);
  } catch (const std::exception&) {  // refused alike on every rank (the agreement)
    ++t.refused;
    return;
  }
  const work built = Op::work_of(*plan, build_site(ctx));
  const work dry = overlap::detail::priced<Op>(build_site::dry(ctx), x, opt, plan->whole, plan->sched);
  EXPECT_TRUE(built == dry) << sc.name();
  EXPECT_EQ(summed(products_of(built)), summed(mine)) << sc.name();
  ++t.checked;
  t.ring += built.ring ? 1 : 0;
  t.others += built.pipelined ? 1 : 0;
}

template <class T>
void check_case(overlap::context& ctx, const sweep_case& sc, uint64_t id, tally& t) {
  const int r = ctx.rank(), R = ctx.size();
  const operands<T> x(sc, r, R, id);
  if (sc.which == op::ag) {
    const overlap::detail::ag_args<T> args{x.av, x.bv, x.cv, x.ov, sc.with_out};
    check<overlap::detail::ag_op<T>>(ctx, sc, args, x.ag, double(x.cv.rows) * double(x.cv.cols) * double(sc.k), t);
  } else {
    const overlap::detail::rs_args<T> args{x.av, x.bv, x.cv};
    const double k_mine = double(shard_of(sc.k, sc.shards, r, R));
    check<overlap::detail::rs_op<T>>(ctx, sc, args, x.rs, double(sc.m) * double(sc.n) * k_mine, t);
  }
}

TEST(priced_plan, the_model_lists_what_the_built_plan_runs_for_every_case_of_the_identical_sweep) {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  overlap::context plain(MPI_COMM_WORLD);
  overlap::config cfg = plain.config();
  cfg.ag_chunks = 3, cfg.rs_chunks = 3;
  overlap::context chunked(MPI_COMM_WORLD, cfg);
  tally t;
  uint64_t id = 0;
  const std::vector<sweep_case> cases = sweep(size);
  for (const sweep_case& sc : cases) {
    overlap::context& ctx = sc.chunked ? chunked : plain;
    overlap::detail::set_nodes_for_testing(ctx, sc.node_slots > 0 ? sc.node_slots : size);
    if (sc.dtype == 0) check_case<float>(ctx, sc, id, t);
    if (sc.dtype == 1) check_case<overlap::bfloat16>(ctx, sc, id, t);
    if (sc.dtype == 2) check_case<double>(ctx, sc, id, t);
    ++id;
  }
  EXPECT_EQ(t.checked + t.refused, static_cast<int>(cases.size()));
  // Most cases run; rings and the other operands among them.
  EXPECT_GT(t.checked, static_cast<int>(cases.size()) / 2);
  if (size > 1) {
    EXPECT_GT(t.ring, 0);
  }
  EXPECT_GT(t.others, 0);
}

/// matmul_all_reduce: every rank's C over its K shard (K_p of an uneven split).
template <class T>
void check_all_reduce(overlap::context& ctx, const sweep_case& sc, overlap::reduced layout, tally& t) {
  const int r = ctx.rank(), R = ctx.size();
  const int64_t kp = shard_of(sc.k, sc.shards, r, R);
  std::vector<T> a(static_cast<size_t>(sc.m * kp), T(1.0F)), b(static_cast<size_t>(kp * sc.n), T(1.0F));
  std::vector<T> c(static_cast<size_t>(sc.m * sc.n));
  overlap::ar_options opt;
  opt.reduced = layout, opt.strategy = sc.strategy;
  const overlap::detail::ar_args<T> args{{a.data(), sc.m, kp}, {b.data(), kp, sc.n}, {c.data(), sc.m, sc.n}};
  check<overlap::detail::ar_op<T>>(ctx, sc, args, opt, double(sc.m) * double(sc.n) * double(kp), t);
}

TEST(priced_plan, the_model_lists_what_matmul_all_reduces_built_plan_runs) {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  overlap::context plain(MPI_COMM_WORLD);
  overlap::config cfg = plain.config();
  cfg.rs_chunks = 3;
  cfg.ar_groups = 3;  // groups whose all-gathers ride on the next group's ring
  overlap::context chunked(MPI_COMM_WORLD, cfg);
  tally t;
  int cases = 0;
  for (const overlap::strategy st : {overlap::strategy::bulk, overlap::strategy::ring, overlap::strategy::bidirectional,
                                     overlap::strategy::hierarchical, overlap::strategy::automatic})
    for (const overlap::reduced layout : {overlap::reduced::rows, overlap::reduced::cols})
      for (int shape = 0; shape < 2; ++shape) {
        sweep_case sc;
        sc.strategy = st, sc.shards = (cases % 3), sc.dtype = cases % 3;
        if (shape == 1) sc.m = 130, sc.n = 96, sc.k = 150, sc.chunked = true;
        overlap::context& ctx = sc.chunked ? chunked : plain;
        const int slots = size % 2 == 0 && size >= 4 ? 2 : size;
        overlap::detail::set_nodes_for_testing(ctx, st == overlap::strategy::hierarchical ? slots : size);
        if (sc.dtype == 0) check_all_reduce<float>(ctx, sc, layout, t);
        if (sc.dtype == 1) check_all_reduce<overlap::bfloat16>(ctx, sc, layout, t);
        if (sc.dtype == 2) check_all_reduce<double>(ctx, sc, layout, t);
        ++cases;
      }
  EXPECT_EQ(t.checked, cases);  // none refused
  if (size > 1) {
    EXPECT_GT(t.ring, 0);
  }
}

}  // namespace
