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

#include <chrono>
#include <cstdint>
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

// The all-gather's pattern forwards block b unchanged from rank b, so every
// rank ends with each block as its owner held it.
TEST(timing_only, all_gather_moves_the_ring_pattern) {
  int R = 1, p = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &R);
  MPI_Comm_rank(MPI_COMM_WORLD, &p);
  std::vector<int> counts(static_cast<size_t>(R));
  for (int q = 0; q < R; ++q) counts[static_cast<size_t>(q)] = (q % 3) * 2;  // empty blocks too
  std::vector<int> at(static_cast<size_t>(R) + 1, 0);
  std::partial_sum(counts.begin(), counts.end(), at.begin() + 1);
  std::vector<double> data(static_cast<size_t>(at.back()));
  for (int b = 0; b < R; ++b)
    for (int i = at[static_cast<size_t>(b)]; i < at[static_cast<size_t>(b) + 1]; ++i)
      data[static_cast<size_t>(i)] = double(1000 * p + b);
  ASSERT_EQ(overlap::mpi::timing_all_gather({data.data(), counts.data(), MPI_DOUBLE, 7}, MPI_COMM_WORLD), MPI_SUCCESS);
  for (int b = 0; b < R; ++b)
    for (int i = at[static_cast<size_t>(b)]; i < at[static_cast<size_t>(b) + 1]; ++i)
      ASSERT_EQ(data[static_cast<size_t>(i)], double(1001 * b)) << "block " << b << " on rank " << p;
}

// The all-reduce's pattern is the reduce-scatter's then the all-gather's over
// count / R blocks (the first count % R one longer): block b ends on every
// rank as the reduce-scatter left it on rank b.
TEST(timing_only, all_reduce_moves_the_ring_patterns) {
  int R = 1, p = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &R);
  MPI_Comm_rank(MPI_COMM_WORLD, &p);
  for (const int count : {3 * R + 2, R - 1, 0}) {
    std::vector<int> owner;  // each element's block
    for (int b = 0; b < R; ++b) owner.insert(owner.end(), size_t(count / R + (b < count % R ? 1 : 0)), b);
    ASSERT_EQ(owner.size(), size_t(count));
    std::vector<float> data(owner.size());
    for (size_t i = 0; i < data.size(); ++i) data[i] = float(1000 * p + owner[i]);
    ASSERT_EQ(overlap::mpi::timing_all_reduce(data.data(), count, MPI_FLOAT, 7, MPI_COMM_WORLD), MPI_SUCCESS);
    for (size_t i = 0; i < data.size(); ++i)
      ASSERT_EQ(data[i], float(1000 * ((owner[i] + 1) % R) + owner[i])) << "count " << count << ", element " << i;
  }
}

// Under SMPI every simulated rank gets the same object, even ranks that ask
// for it first in the same scheduling round (each a barrier apart from the
// others' increments would see its own object otherwise); on a real MPI,
// each process has its own.
TEST(timing_only, process_wide_is_one_object_for_the_simulation) {
  int R = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &R);
  MPI_Barrier(MPI_COMM_WORLD);  // every rank asks in the same round
  int& counter = overlap::mpi::process_wide<int>("test/process-wide-counter");
  MPI_Barrier(MPI_COMM_WORLD);
  ++counter;
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_EQ(counter, overlap::mpi::simulated ? R : 1);
  const auto at = reinterpret_cast<uintptr_t>(&counter);
  uintptr_t lowest = at, highest = at;
  MPI_Allreduce(&at, &lowest, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&at, &highest, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  if (overlap::mpi::simulated) {
    EXPECT_EQ(lowest, highest) << "ranks got different objects";
  }
}

// A rate measured once per simulation is measured once even when every rank
// asks in the same round: ending the timed burst before measuring is a
// simcall that lets the other ranks in. On a real MPI, once per process.
TEST(timing_only, a_rate_is_measured_once) {
  MPI_Barrier(MPI_COMM_WORLD);  // every rank asks in the same round
  int& measured = overlap::mpi::process_wide<int>("test/measured-once-count");
  // Work worth charging (SMPI drops bursts under smpi/cpu-threshold), so
  // that ending the burst is a simcall, as it is after a rank's real work.
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(2);
  while (std::chrono::steady_clock::now() < until) {
  }
  const double rate = overlap::mpi::measured_once("test/measured-once-rate", [&] {
    ++measured;
    return 2.5e-10;
  });
  EXPECT_EQ(rate, 2.5e-10);
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_EQ(measured, 1);
}

// Shared workspaces (timing-only runs under SMPI): a rank's live ones never
// overlap, a block given back is lent again, and every rank's i-th block is
// the same memory. On a real MPI they are the rank's own allocations.
TEST(timing_only, shared_workspaces_are_distinct_within_a_rank) {
  const overlap::mpi::shared_workspaces_scope shared;
  bool s1 = false, s2 = false, s3 = false;
  void* a = overlap::mpi::allocate_workspace(64, 1 << 16, s1);
  void* b = overlap::mpi::allocate_workspace(64, 1 << 16, s2);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(a, b);
  EXPECT_EQ(s1, overlap::mpi::simulated);
  const auto at = reinterpret_cast<uintptr_t>(a);
  uintptr_t lowest = at, highest = at;
  MPI_Allreduce(&at, &lowest, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&at, &highest, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  if (overlap::mpi::simulated) {
    EXPECT_EQ(lowest, highest) << "a rank's first block is not the others'";
  }
  overlap::mpi::free_workspace(a, s1);
  void* c = overlap::mpi::allocate_workspace(64, 1 << 12, s3);  // a smaller one fits the block given back
  if (overlap::mpi::simulated) {
    EXPECT_EQ(c, a);
  }
  EXPECT_NE(c, b);
  overlap::mpi::free_workspace(b, s2);
  overlap::mpi::free_workspace(c, s3);
}

// A copy is made on a real MPI and in runs that compute; skipped (and its
// time charged) only where the workspaces are shared garbage.
TEST(timing_only, copies_are_charged_only_in_timing_only_runs) {
  EXPECT_FALSE(overlap::mpi::timing_only_buffers());
  {
    const overlap::mpi::shared_workspaces_scope shared;
    EXPECT_EQ(overlap::mpi::timing_only_buffers(), overlap::mpi::simulated);
  }
  EXPECT_GT(overlap::mpi::copy_seconds(1 << 20), 0);
  EXPECT_NEAR(overlap::mpi::copy_seconds(2 << 20), 2 * overlap::mpi::copy_seconds(1 << 20), 1e-12);
}

}  // namespace
