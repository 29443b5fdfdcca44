// Contexts on groups smaller than the world, as a mesh makes them: the world
// split into two disjoint halves (a tensor-parallel group each, of different
// sizes at odd rank counts), each half running both ops with every schedule
// on uneven shards at the same time as the other half; and two contexts on
// one communicator used alternately, each keeping its own plans; rings in
// orders other than rank order (as placement by node makes them); errors
// naming the ranks of a context in the world. Results against the naive
// reference, on every rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "ag_cases.hpp"
#include "rs_cases.hpp"

using namespace testing_support;

namespace {

/// The half of the world this rank is in (ranks [0, R/2) and [R/2, R); at one
/// rank, the world itself), as its own communicator.
class half_of_world {
 public:
  half_of_world() {
    int r = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    color_ = size > 1 && r >= size / 2 ? 1 : 0;
    MPI_Comm_split(MPI_COMM_WORLD, color_, r, &comm_);
  }
  half_of_world(const half_of_world&) = delete;
  half_of_world& operator=(const half_of_world&) = delete;
  ~half_of_world() { MPI_Comm_free(&comm_); }
  [[nodiscard]] MPI_Comm comm() const { return comm_; }
  [[nodiscard]] int color() const { return color_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int color_ = 0;
};

TEST(groups, disjoint_halves_run_both_ops_concurrently) {
  half_of_world half;
  overlap::context ctx(half.comm());
  uint32_t seed = 1;
  for (const plan_choice& choice : plan_choices)
    for (auto variant : {overlap::gathered::lhs_rows, overlap::gathered::lhs_cols, overlap::gathered::rhs_rows,
                         overlap::gathered::rhs_cols}) {
      // The halves multiply different problems (their own shapes and data).
      ag_case cs{variant, choice.strategy, 23 + 4 * half.color(), 9, 17, split::skewed, 1, false, seed++};
      cs.algorithm = choice.algorithm;
      SCOPED_TRACE("half " + std::to_string(half.color()) + " of " + std::to_string(ctx.size()) + " ranks");
      run_ag_case<float>(ctx, cs);
    }
  for (const plan_choice& choice : plan_choices)
    for (auto sc : {overlap::scattered::rows, overlap::scattered::cols}) {
      rs_case cs{sc, choice.strategy, 19, 14 + 3 * half.color(), 21, split::first_empty, split::skewed, 1, seed++};
      cs.algorithm = choice.algorithm;
      SCOPED_TRACE("half " + std::to_string(half.color()) + " of " + std::to_string(ctx.size()) + " ranks");
      run_rs_case<float>(ctx, cs);
    }
}

TEST(groups, two_contexts_on_one_communicator_alternate) {
  overlap::config chunked;
  chunked.ag_chunks = 3;
  chunked.rs_chunks = 2;
  overlap::context first(MPI_COMM_WORLD), second(MPI_COMM_WORLD, chunked);
  for (uint32_t round = 0; round < 3; ++round)
    for (const plan_choice& choice : plan_choices) {
      for (overlap::context* ctx : {&first, &second}) {
        ag_case ag{overlap::gathered::lhs_rows, choice.strategy, 13, 7, 11, split::skewed, 0, false, 40 + round};
        ag.algorithm = choice.algorithm;
        run_ag_case<float>(*ctx, ag);
        rs_case rs{
            overlap::scattered::cols, choice.strategy, 9, 12, 10, split::skewed, split::last_takes_all, 0, 50 + round};
        rs.algorithm = choice.algorithm;
        run_rs_case<float>(*ctx, rs);
      }
    }
  // Each context built its own plans once and reused them in later rounds.
  EXPECT_EQ(first.plans_built(), 2 * std::size(plan_choices));
  EXPECT_EQ(second.plans_built(), 2 * std::size(plan_choices));
}

// ---- ring order ----

TEST(topology, ring_by_node_keeps_each_nodes_ranks_together) {
  // Ranks placed round-robin on two nodes (mpirun --map-by node): 0 2 4 on
  // the node led by 0, 1 3 5 on the node led by 1.
  EXPECT_EQ(overlap::mpi::ring_by_node({0, 1, 0, 1, 0, 1}), (std::vector<int>{0, 2, 4, 1, 3, 5}));
  EXPECT_EQ(overlap::mpi::node_count({0, 1, 0, 1, 0, 1}), 2);
  // Placed by slot: the identity.
  EXPECT_EQ(overlap::mpi::ring_by_node({0, 0, 2, 2}), (std::vector<int>{0, 1, 2, 3}));
  // Three uneven nodes, interleaved.
  EXPECT_EQ(overlap::mpi::ring_by_node({0, 1, 1, 0, 4, 1, 4}), (std::vector<int>{0, 3, 1, 2, 5, 4, 6}));
  EXPECT_EQ(overlap::mpi::node_count({0, 1, 1, 0, 4, 1, 4}), 3);
  EXPECT_EQ(overlap::mpi::ring_by_node({0}), (std::vector<int>{0}));
}

TEST(topology, rank_text_names_the_world_rank_when_it_differs) {
  EXPECT_EQ(overlap::mpi::rank_text(2, {}), "rank 2");
  EXPECT_EQ(overlap::mpi::rank_text(1, {4, 6}), "rank 1 (world rank 6)");
  EXPECT_EQ(overlap::mpi::rank_text(0, {MPI_UNDEFINED}), "rank 0 (not in MPI_COMM_WORLD)");
}

TEST(topology, one_machine_is_one_node_and_the_ring_is_rank_order) {
  overlap::context ctx(MPI_COMM_WORLD);
  std::vector<int> identity(static_cast<size_t>(ctx.size()));
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(ctx.nodes(), 1);
  EXPECT_TRUE(ctx.one_node());
  EXPECT_EQ(ctx.ring(), identity);
  EXPECT_EQ(ctx.ring_at(1), (ctx.rank() + 1) % ctx.size());
  EXPECT_EQ(ctx.ring_at(-1), (ctx.rank() + ctx.size() - 1) % ctx.size());
  EXPECT_EQ(ctx.rank_name(0), "rank 0");
}

/// Ring orders a placement can make: reversed, nodes interleaved (even ranks
/// on one node, odd on the other: ring 0 2 4 .. 1 3 5 ..), and rotated.
std::vector<std::vector<int>> ring_orders(int R) {
  std::vector<int> base(static_cast<size_t>(R));
  std::iota(base.begin(), base.end(), 0);
  std::vector<int> reversed(base.rbegin(), base.rend()), interleaved, rotated = base;
  for (int r = 0; r < R; r += 2) interleaved.push_back(r);
  for (int r = 1; r < R; r += 2) interleaved.push_back(r);
  std::rotate(rotated.begin(), rotated.begin() + R / 2, rotated.end());
  return {reversed, interleaved, rotated};
}

std::string order_text(const std::vector<int>& order) {
  std::string s;
  for (int r : order) s += std::to_string(r) + " ";
  return s;
}

TEST(topology, both_ops_are_exact_on_rings_in_any_order) {
  overlap::config cfg;
  cfg.ag_chunks = 2;
  cfg.rs_chunks = 2;
  overlap::context ctx(MPI_COMM_WORLD, cfg);
  uint32_t seed = 300;
  for (const std::vector<int>& order : ring_orders(ctx.size())) {
    overlap::detail::set_ring_for_testing(ctx, order);
    ASSERT_EQ(ctx.ring(), order);
    SCOPED_TRACE("ring " + order_text(order));
    for (const plan_choice& choice : plan_choices) {
      for (auto variant : {overlap::gathered::lhs_rows, overlap::gathered::lhs_cols, overlap::gathered::rhs_rows,
                           overlap::gathered::rhs_cols}) {
        ag_case cs{variant, choice.strategy, 21, 10, 15, split::skewed, 1, true, seed++};
        cs.algorithm = choice.algorithm;
        run_ag_case<float>(ctx, cs);
        cs.with_out = false;
        run_ag_case<overlap::bfloat16>(ctx, cs);
      }
      for (auto sc : {overlap::scattered::rows, overlap::scattered::cols}) {
        rs_case cs{sc, choice.strategy, 17, 13, 19, split::first_empty, split::skewed, 1, seed++};
        cs.algorithm = choice.algorithm;
        run_rs_case<float>(ctx, cs);
        run_rs_case<overlap::bfloat16>(ctx, cs);
      }
    }
  }
}

TEST(topology, the_ring_order_must_agree_across_ranks) {
  int r = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size == 1) GTEST_SKIP() << "needs two ranks to disagree";
  overlap::config cfg;
  cfg.ring = r == size - 1 ? overlap::ring_order::rank : overlap::ring_order::node;
  try {
    overlap::context ctx(MPI_COMM_WORLD, cfg);
    ADD_FAILURE() << "a context with different ring orders was created";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("OVERLAP_RING_ORDER) differs across ranks (node and rank)"), std::string::npos)
        << e.what();
  }
}

// ---- ranks named in the world ----

TEST(groups, errors_name_the_context_rank_and_the_world_rank) {
  half_of_world half;
  overlap::context ctx(half.comm());
  if (ctx.size() < 2) GTEST_SKIP() << "a half of one rank cannot disagree";
  int world = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world);
  std::vector<int> worlds(static_cast<size_t>(ctx.size()));
  MPI_Allgather(&world, 1, MPI_INT, worlds.data(), 1, MPI_INT, half.comm());
  // The last rank of the half gives M one larger: the ranks disagree on M.
  const int last = ctx.size() - 1;
  const int64_t m = ctx.rank() == last ? 5 : 4, n = 3, k = 2;
  std::vector<float> a(static_cast<size_t>(m * k), 1.0F), b(static_cast<size_t>(k * n), 1.0F),
      c(static_cast<size_t>(m * n));
  const int64_t cols = ctx.rank() == 0 ? n : 0;  // every column on rank 0
  overlap::rs_options opt;
  opt.scattered = overlap::scattered::cols;
  try {
    overlap::matmul_reduce_scatter<float>(ctx, {a.data(), m, k}, {b.data(), k, n}, {c.data(), m, cols}, opt);
    ADD_FAILURE() << "M disagreed across ranks and the op ran";
  } catch (const std::invalid_argument& e) {
    const std::string want = "rank " + std::to_string(last) + " (world rank " + std::to_string(worlds.back()) + "): 5";
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what() << "\nwanted: " << want;
  }
  // The context is still usable.
  ag_case cs{overlap::gathered::lhs_rows, overlap::strategy::ring, 9, 4, 5, split::skewed, 0, false, 7};
  run_ag_case<float>(ctx, cs);
}

}  // namespace
