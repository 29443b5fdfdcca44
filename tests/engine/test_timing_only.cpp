// The bulk reduce-scatter's message pattern for SMPI's timing-only runs
// (mpi::timing_reduce_scatter): on a real MPI too it moves the ring
// reduce-scatter's blocks between the ring's neighbours, in its order, with
// uneven and empty blocks, and ends. Nothing is summed: each received block
// overwrites the sender's copy in the send buffer, so block b ends on every
// rank as rank b + 1 first sent it, which only the ring's chain of R - 1
// forwarding steps gives (a wrong peer, block or step order leaves other
// values).
#include <gtest/gtest.h>
#include <mpi.h>

#include <numeric>
#include <vector>

#include "overlap/mpi/timing_only.hpp"

namespace {

TEST(timing_only, reduce_scatter_moves_the_ring_pattern) {
  int R = 1, p = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &R);
  MPI_Comm_rank(MPI_COMM_WORLD, &p);
  for (int variant = 0; variant < 3; ++variant) {
    std::vector<int> counts(static_cast<size_t>(R));
    for (int q = 0; q < R; ++q)
      counts[static_cast<size_t>(q)] = variant == 0 ? 5 : variant == 1 ? 1 + 3 * q : (q % 2) * 7;
    std::vector<int> at(static_cast<size_t>(R) + 1, 0);
    std::partial_sum(counts.begin(), counts.end(), at.begin() + 1);
    std::vector<float> send(static_cast<size_t>(at.back()));
    for (int b = 0; b < R; ++b)
      for (int i = at[static_cast<size_t>(b)]; i < at[static_cast<size_t>(b) + 1]; ++i)
        send[static_cast<size_t>(i)] = float(1000 * p + b);
    ASSERT_EQ(overlap::mpi::timing_reduce_scatter({send.data(), counts.data(), MPI_FLOAT, 7}, MPI_COMM_WORLD),
              MPI_SUCCESS);
    for (int b = 0; b < R; ++b)
      for (int i = at[static_cast<size_t>(b)]; i < at[static_cast<size_t>(b) + 1]; ++i)
        ASSERT_EQ(send[static_cast<size_t>(i)], float(1000 * ((b + 1) % R) + b))
            << "variant " << variant << ", block " << b << " on rank " << p;
  }
  EXPECT_GT(overlap::mpi::add_seconds(1 << 20, 4), 0);
  EXPECT_NEAR(overlap::mpi::add_seconds(2 << 20, 4), 2 * overlap::mpi::add_seconds(1 << 20, 4), 1e-12);
}

}  // namespace
