// The hierarchical (two-level) schedules of both ops: on every node
// layout that has two levels at this rank count (S ranks on each of R / S
// nodes, S >= 2, R / S >= 2, faked with detail::set_nodes_for_testing on one
// machine), every variant, transposes, bias and GELU, gathered_out,
// accumulate and started calls, balanced, skewed and empty shards, f32, bf16
// and f64 (reduce-scatter: also bf16 transfers), against the naive
// reference; where the ranks have no two levels it runs the ring, and says so
// in the schedule.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <vector>

#include "ag_cases.hpp"
#include "rs_cases.hpp"

using namespace testing_support;

namespace {

/// Ranks per node that give two levels at R ranks.
std::vector<int> two_level_slots(int R) {
  std::vector<int> s;
  for (int slots = 2; slots <= R / 2; ++slots)
    if (R % slots == 0) s.push_back(slots);
  return s;
}

constexpr overlap::gathered variants[] = {overlap::gathered::lhs_rows, overlap::gathered::lhs_cols,
                                          overlap::gathered::rhs_rows, overlap::gathered::rhs_cols};

overlap::schedule ag_schedule(overlap::context& ctx) {
  matrix<float> a(2, 3), b(3, 4), c(2 * ctx.size(), 4);
  overlap::ag_options opt;
  opt.strategy = overlap::strategy::hierarchical;
  return overlap::all_gather_matmul_schedule<float>(ctx, a.cview(), b.cview(), c.view(), opt);
}

void every_case(overlap::context& ctx, uint32_t seed) {
  for (auto variant : variants)
    for (split how : {split::balanced, split::skewed, split::first_empty})
      for (bool with_out : {false, true}) {
        ag_case cs{variant, overlap::strategy::hierarchical, 23, 10, 17, how, with_out ? 1 : 0, with_out, seed++};
        cs.transpose_a = seed % 2 == 0, cs.transpose_b = seed % 3 == 0;
        cs.bias = true, cs.act = overlap::activation::gelu;
        run_ag_case<float>(ctx, cs);
        run_ag_case<overlap::bfloat16>(ctx, cs);
        run_ag_case<double>(ctx, cs);
        cs.accumulate = true, cs.started = true;
        run_ag_case<float>(ctx, cs);
      }
}

TEST(hierarchical, all_gather_matmul_is_exact_on_every_two_level_layout) {
  overlap::context ctx(MPI_COMM_WORLD);
  for (int slots : two_level_slots(ctx.size())) {
    SCOPED_TRACE(std::to_string(ctx.size() / slots) + " nodes x " + std::to_string(slots) + " ranks");
    overlap::detail::set_nodes_for_testing(ctx, slots);
    ASSERT_TRUE(ctx.two_levels());
    EXPECT_EQ(ag_schedule(ctx).strategy, overlap::strategy::hierarchical);
    every_case(ctx, 500 + 100 * uint32_t(slots));
  }
}

// One node, or nodes of one rank, or rank counts without an even split: the
// two levels do not exist and the ring runs (exactly).
TEST(hierarchical, runs_the_ring_without_two_levels) {
  overlap::context ctx(MPI_COMM_WORLD);
  for (int slots : {ctx.size(), 1}) {
    overlap::detail::set_nodes_for_testing(ctx, slots);
    ASSERT_FALSE(ctx.two_levels());
    EXPECT_EQ(ag_schedule(ctx).strategy, overlap::strategy::ring);
    every_case(ctx, 900);
  }
}

overlap::schedule rs_schedule(overlap::context& ctx) {
  matrix<float> a(5 * ctx.size(), 3), b(3, 4), c(5, 4);
  overlap::rs_options opt;
  opt.strategy = overlap::strategy::hierarchical;
  return overlap::matmul_reduce_scatter_schedule<float>(ctx, a.cview(), b.cview(), c.view(), opt);
}

void every_rs_case(overlap::context& ctx, uint32_t seed) {
  for (auto sc : {overlap::scattered::rows, overlap::scattered::cols})
    for (split k_split : {split::balanced, split::skewed})
      for (split out_split : {split::balanced, split::skewed, split::first_empty}) {
        rs_case cs{sc, overlap::strategy::hierarchical, 19, 14, 21, k_split, out_split, 1, seed++};
        cs.transpose_a = seed % 2 == 0, cs.transpose_b = seed % 3 == 0;
        cs.bias = true, cs.act = overlap::activation::gelu;
        run_rs_case<float>(ctx, cs);
        run_rs_case<overlap::bfloat16>(ctx, cs);
        run_rs_case<double>(ctx, cs);
        cs.bf16_transfers = true;
        run_rs_case<overlap::bfloat16>(ctx, cs);
        cs.bf16_transfers = false, cs.accumulate = true, cs.started = true;
        run_rs_case<float>(ctx, cs);
      }
}

TEST(hierarchical, matmul_reduce_scatter_is_exact_on_every_two_level_layout) {
  overlap::context ctx(MPI_COMM_WORLD);
  for (int slots : two_level_slots(ctx.size())) {
    SCOPED_TRACE(std::to_string(ctx.size() / slots) + " nodes x " + std::to_string(slots) + " ranks");
    overlap::detail::set_nodes_for_testing(ctx, slots);
    ASSERT_TRUE(ctx.two_levels());
    const overlap::schedule s = rs_schedule(ctx);
    EXPECT_EQ(s.strategy, overlap::strategy::hierarchical);
    EXPECT_EQ(s.chunks, 2);  // pieces go round the node one step apart
    every_rs_case(ctx, 1300 + 100 * uint32_t(slots));
  }
}

// Pieces per shard as configured (config.rs_chunks) rather than the default 2.
TEST(hierarchical, matmul_reduce_scatter_takes_the_configured_chunks) {
  const std::vector<int> slots = two_level_slots(overlap::context(MPI_COMM_WORLD).size());
  if (slots.empty()) GTEST_SKIP() << "no two-level layout at this rank count (the other tests cover it)";
  for (int chunks : {3, 5}) {
    overlap::config cfg;
    cfg.rs_chunks = chunks;
    overlap::context ctx(MPI_COMM_WORLD, cfg);
    overlap::detail::set_nodes_for_testing(ctx, slots.back());
    EXPECT_EQ(rs_schedule(ctx).chunks, chunks);
    every_rs_case(ctx, 1700 + 10 * uint32_t(chunks));
  }
}

TEST(hierarchical, matmul_reduce_scatter_runs_the_ring_without_two_levels) {
  overlap::context ctx(MPI_COMM_WORLD);
  for (int slots : {ctx.size(), 1}) {
    overlap::detail::set_nodes_for_testing(ctx, slots);
    ASSERT_FALSE(ctx.two_levels());
    EXPECT_EQ(rs_schedule(ctx).strategy, overlap::strategy::ring);
    every_rs_case(ctx, 1900);
  }
}

}  // namespace
