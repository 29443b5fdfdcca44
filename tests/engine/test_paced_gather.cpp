// engine::paced_gather: a ring all-gather advanced a step at a time by its
// caller (matmul_all_reduce paces a group's gather over the next group's
// ring). Every rank's block, uneven and some empty, lands on every rank:
// paced by a caller's steps or finished at once, round the ring either way,
// on a ring that is not in rank order, and two gathers (one per lane, half
// of each block) at once.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "overlap/engine/paced_gather.hpp"

namespace {

int world_size() {
  int r = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &r);
  return r;
}
int world_rank() {
  int p = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &p);
  return p;
}

/// Element i of rank q's block.
float value(int q, int i) { return static_cast<float>(q * 10000 + i); }

/// Uneven blocks in rank order: rank q holds (q % 3) * 37 + (q == 1 ? 0 : 5) floats (rank 1's is empty).
struct blocks {
  std::vector<int> counts, displs;
  std::vector<float> data;
  explicit blocks(int R) {
    for (int q = 0; q < R; ++q) {
      displs.push_back(q == 0 ? 0 : displs.back() + counts.back());
      counts.push_back(q == 1 ? 0 : (q % 3) * 37 + 5);
    }
    data.assign(static_cast<size_t>(displs.back() + counts.back()), -1.0f);
  }
  void fill_own(int p) {
    for (int i = 0; i < counts[static_cast<size_t>(p)]; ++i) data[static_cast<size_t>(displs[p] + i)] = value(p, i);
  }
  void expect_all(int R) const {
    for (int q = 0; q < R; ++q)
      for (int i = 0; i < counts[static_cast<size_t>(q)]; ++i)
        ASSERT_EQ(data[static_cast<size_t>(displs[q] + i)], value(q, i)) << "rank " << q << "'s element " << i;
  }
};

/// The ring from this rank on, over `circle` (every rank once, the same on every rank).
std::vector<int> from_me(const std::vector<int>& circle, int p) {
  const int R = static_cast<int>(circle.size());
  int at = 0;
  while (circle[static_cast<size_t>(at)] != p) ++at;
  std::vector<int> ring;
  for (int k = 0; k < R; ++k) ring.push_back(circle[static_cast<size_t>((at + k) % R)]);
  return ring;
}

std::vector<int> rank_order(int R) {
  std::vector<int> c(static_cast<size_t>(R));
  std::iota(c.begin(), c.end(), 0);
  return c;
}

/// Runs a gather of b over `circle`: paced over `pretend_steps` steps of
/// other work (as matmul_all_reduce's hook does), then finished.
void gather(blocks& b, const std::vector<int>& circle, int pretend_steps) {
  const int p = world_rank();
  overlap::engine::paced_gather g;
  g.configure(from_me(circle, p), 77);
  b.fill_own(p);
  g.start({b.data.data(), b.counts.data(), b.displs.data(), MPI_FLOAT}, MPI_COMM_WORLD);
  EXPECT_EQ(g.steps(), world_size() - 1);
  for (int t = 0; t < pretend_steps; ++t) g.advance_to(1 + t * g.steps() / pretend_steps);
  g.finish();
  EXPECT_FALSE(g.active());
}

TEST(paced_gather, paced_over_a_callers_steps_every_block_lands_everywhere) {
  const int R = world_size();
  for (int steps : {1, 2, 3 * R, 7 * R + 1}) {
    blocks b(R);
    gather(b, rank_order(R), steps);
    b.expect_all(R);
  }
}

TEST(paced_gather, finished_at_once_the_other_way_round_and_on_a_shuffled_ring) {
  const int R = world_size();
  std::vector<int> reversed = rank_order(R), shuffled;
  std::reverse(reversed.begin(), reversed.end());
  for (int q = 0; q < R; q += 2) shuffled.push_back(q);  // evens, then odds
  for (int q = 1; q < R; q += 2) shuffled.push_back(q);
  for (const std::vector<int>& circle : {reversed, shuffled}) {
    blocks b(R);
    gather(b, circle, 0);
    b.expect_all(R);
  }
}

TEST(paced_gather, two_lanes_each_move_half_of_every_block) {
  const int R = world_size(), p = world_rank();
  blocks b(R);
  b.fill_own(p);
  std::vector<int> reversed = rank_order(R);
  std::reverse(reversed.begin(), reversed.end());
  std::vector<int> counts0, displs0, counts1, displs1;
  for (int q = 0; q < R; ++q) {
    const int half = b.counts[static_cast<size_t>(q)] / 2;
    counts0.push_back(half), displs0.push_back(b.displs[static_cast<size_t>(q)]);
    counts1.push_back(b.counts[static_cast<size_t>(q)] - half),
        displs1.push_back(b.displs[static_cast<size_t>(q)] + half);
  }
  overlap::engine::paced_gather lane0, lane1;
  lane0.configure(from_me(rank_order(R), p), 77);
  lane1.configure(from_me(reversed, p), 78);
  lane0.start({b.data.data(), counts0.data(), displs0.data(), MPI_FLOAT}, MPI_COMM_WORLD);
  lane1.start({b.data.data(), counts1.data(), displs1.data(), MPI_FLOAT}, MPI_COMM_WORLD);
  const int steps = 2 * R;
  for (int t = 0; t < steps; ++t) {
    lane0.advance_to(1 + t * lane0.steps() / steps);
    lane1.advance_to(1 + t * lane1.steps() / steps);
  }
  lane0.finish();
  lane1.finish();
  b.expect_all(R);
}

}  // namespace
