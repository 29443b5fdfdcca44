// Paced sends (config::paced, mpi::request_group::send_paced): a lane's
// sends go out one at a time, each held back until the one before it
// completed, in their order, or released ahead when the one before is
// expected to complete during a step; the rings of both op families give the
// reference results with every send paced, on one and two lanes and on the
// two-level ring, with uneven shards.
#include <gtest/gtest.h>
#include <mpi.h>

#include <vector>

#include "ag_cases.hpp"
#include "overlap/mpi/request.hpp"
#include "rs_cases.hpp"

using namespace testing_support;

namespace {

// Every rank sends three blocks of 2 MiB to the next rank, paced on one
// lane, before any rank posts a receive: the first cannot complete before
// its receive is posted (no MPI sends 2 MiB eagerly), so the others are
// held. Then the receives: every block arrives, in order.
TEST(paced_sends, a_lane_holds_its_sends_until_the_one_before_completes) {
  const int R = world_size(), p = world_rank();
  if (R == 1) GTEST_SKIP() << "needs a neighbour";
  const int next = (p + 1) % R, prev = (p + R - 1) % R;
  const int n = 512 * 1024;  // ints: 2 MiB
  std::vector<std::vector<int>> out(3, std::vector<int>(n)), in(3, std::vector<int>(n, -1));
  for (int b = 0; b < 3; ++b)
    for (int i = 0; i < n; i += 4096) out[b][i] = 1000 * p + b;
  overlap::mpi::request_group g;
  for (int b = 0; b < 3; ++b) {
    overlap::mpi::request_group::about what;
    what.lane = 0, what.peer = next, what.type = MPI_INT, what.count = n;
    g.send_paced(out[b].data(), n, MPI_INT, next, 7, MPI_COMM_WORLD, 10, what);
  }
  EXPECT_GE(g.held(), 1);
  EXPECT_LE(g.held(), 2);
  MPI_Barrier(MPI_COMM_WORLD);
  for (int b = 0; b < 3; ++b) MPI_Irecv(in[b].data(), n, MPI_INT, prev, 7, MPI_COMM_WORLD, g.add(10));
  g.wait_due(10);
  EXPECT_EQ(g.held(), 0);
  EXPECT_TRUE(g.empty());
  for (int b = 0; b < 3; ++b)
    for (int i = 0; i < n; i += 4096) ASSERT_EQ(in[b][i], 1000 * prev + b) << "block " << b;
}

// release_ahead (progress none: before a step no one tests the requests
// through) posts a lane's held send when the one in flight is expected to
// complete within the horizon, at the rate the lane's sends to that peer
// were seen to move (the fastest): none before a wait has seen one complete, then
// the held send goes ahead while the first is still in flight (2 MiB:
// rendezvous, its receive not yet posted). Every block arrives in order.
TEST(paced_sends, release_ahead_posts_a_held_send_once_its_lane_has_a_rate) {
  const int R = world_size(), p = world_rank();
  if (R == 1) GTEST_SKIP() << "needs a neighbour";
  const int next = (p + 1) % R, prev = (p + R - 1) % R;
  const int n = 512 * 1024;  // ints: 2 MiB
  overlap::mpi::request_group g;
  for (int round = 0; round < 2; ++round) {
    std::vector<std::vector<int>> out(2, std::vector<int>(n)), in(2, std::vector<int>(n, -1));
    for (int b = 0; b < 2; ++b) {
      for (int i = 0; i < n; i += 4096) out[b][i] = 1000 * p + 10 * round + b;
      overlap::mpi::request_group::about what;
      what.lane = 0, what.peer = next, what.type = MPI_INT, what.count = n;
      g.send_paced(out[b].data(), n, MPI_INT, next, 8, MPI_COMM_WORLD, 10, what);
    }
    ASSERT_EQ(g.held(), 1) << "round " << round;
    g.release_ahead(0);  // no horizon: nothing goes ahead
    EXPECT_EQ(g.held(), 1);
    g.release_ahead(1e9);
    if (round == 0) {
      EXPECT_EQ(g.paced_rate(0, next), 0);
      EXPECT_EQ(g.held(), 1) << "no rate known yet: the send stays held";
    } else {
      EXPECT_GT(g.paced_rate(0, next), 0);
      EXPECT_EQ(g.held(), 0) << "the first is expected to complete within the horizon";
    }
    MPI_Barrier(MPI_COMM_WORLD);
    for (int b = 0; b < 2; ++b) MPI_Irecv(in[b].data(), n, MPI_INT, prev, 8, MPI_COMM_WORLD, g.add(10));
    g.wait_due(10);
    EXPECT_TRUE(g.empty());
    for (int b = 0; b < 2; ++b)
      for (int i = 0; i < n; i += 4096) ASSERT_EQ(in[b][i], 1000 * prev + 10 * round + b) << "block " << b;
  }
  EXPECT_GT(g.paced_rate(0, next), 0) << "the wait saw a paced send complete";
}

overlap::config paced_config(int chunks) {
  overlap::config cfg;
  cfg.paced = overlap::paced_sends::on;
  cfg.ag_chunks = chunks, cfg.rs_chunks = chunks;
  return cfg;
}

TEST(paced_sends, rings_compute_the_reference) {
  overlap::context ctx(MPI_COMM_WORLD, paced_config(3));
  uint32_t seed = 11;
  for (auto s : {overlap::strategy::ring, overlap::strategy::bidirectional})
    for (split how : {split::balanced, split::skewed, split::first_empty}) {
      run_ag_case<float>(ctx, ag_case{overlap::gathered::lhs_rows, s, 61, 20, 17, how, 1, false, seed++});
      run_ag_case<float>(ctx, ag_case{overlap::gathered::rhs_cols, s, 19, 45, 23, how, 0, true, seed++});
      run_rs_case<float>(ctx, rs_case{overlap::scattered::rows, s, 50, 21, 30, how, split::skewed, 1, seed++});
      run_rs_case<double>(ctx, rs_case{overlap::scattered::cols, s, 17, 43, 12, split::balanced, how, 0, seed++});
    }
}

TEST(paced_sends, the_two_level_rings_compute_the_reference) {
  overlap::context ctx(MPI_COMM_WORLD, paced_config(2));
  const int R = ctx.size();
  uint32_t seed = 51;
  for (int slots = 2; slots <= R / 2; ++slots) {
    if (R % slots != 0) continue;
    SCOPED_TRACE(std::to_string(R / slots) + " nodes x " + std::to_string(slots) + " ranks");
    overlap::detail::set_nodes_for_testing(ctx, slots);
    run_ag_case<float>(ctx, ag_case{overlap::gathered::lhs_rows, overlap::strategy::hierarchical, 48, 20, 17,
                                    split::skewed, 1, false, seed++});
    run_rs_case<float>(ctx, rs_case{overlap::scattered::rows, overlap::strategy::hierarchical, 40, 21, 30,
                                    split::balanced, split::skewed, 1, seed++});
  }
}

}  // namespace
