// The data-parallel rings (engine::ring_reduce, queued in buckets by
// layers::dp_reducer): all-reduce, reduce-scatter and all-gather of buffers
// of every size (empty, shorter than the ranks, uneven over them, several
// buckets), against sums written with plain loops, advanced by the
// reducer's thread or by the caller's polls and waits, with several
// collectives queued at once.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "overlap/core/matrix.hpp"
#include "overlap/layers/data_parallel.hpp"

namespace {

using overlap::engine::ring_collective;
using overlap::layers::dp_reducer;

int world(int* rank) {
  int r = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, rank);
  MPI_Comm_size(MPI_COMM_WORLD, &r);
  return r;
}

/// Rank q's element i: integers, so every sum is exact in any order.
double value(int q, int64_t i) { return double((q + 1) * 1000 + i % 997); }

/// Checks one collective's result on this rank: `got` after `what` with
/// buckets of `bucket` elements over R ranks (block ownership per bucket).
void expect(ring_collective what, const std::vector<double>& got, int64_t bucket, int R, int me) {
  const int64_t count = int64_t(got.size());
  for (int64_t at = 0; at < count; at += bucket) {
    const int64_t n = std::min(bucket, count - at);
    const overlap::shard_layout blocks = overlap::shard_layout::balanced(n, R);
    for (int q = 0; q < R; ++q)
      for (int64_t k = blocks.offset(q); k < blocks.offset(q) + blocks.size(q); ++k) {
        const int64_t i = at + k;
        double want = 0;
        if (what == ring_collective::all_gather) {
          want = value(q, i);
        } else {
          if (what == ring_collective::reduce_scatter && q != me) continue;  // scratch there
          for (int p = 0; p < R; ++p) want += value(p, i);
        }
        ASSERT_EQ(got[size_t(i)], want) << "element " << i << " (bucket at " << at << ", rank " << q << "'s block)";
      }
  }
}

void run_all(bool thread) {
  int me = 0;
  const int R = world(&me);
  const int64_t bucket = 77;
  dp_reducer<double> reducer(MPI_COMM_WORLD, {bucket, 60, thread, std::chrono::microseconds(50)});
  ASSERT_EQ(reducer.size(), R);
  ASSERT_EQ(reducer.rank(), me);
  ASSERT_EQ(reducer.threaded(), thread && !overlap::mpi::simulated);  // SMPI: no second thread calls MPI
  for (ring_collective what :
       {ring_collective::all_reduce, ring_collective::reduce_scatter, ring_collective::all_gather})
    for (int64_t count : {int64_t(0), int64_t(1), int64_t(R - 1), int64_t(2 * R + 1), int64_t(76), int64_t(1000)}) {
      std::vector<double> data(size_t(count), -1.0);
      if (what == ring_collective::all_gather) {  // only this rank's blocks are read
        reducer.for_each_owned(count, [&](int64_t at, int64_t n) {
          for (int64_t i = at; i < at + n; ++i) data[size_t(i)] = value(me, i);
        });
      } else {
        for (int64_t i = 0; i < count; ++i) data[size_t(i)] = value(me, i);
      }
      reducer.wait(reducer.enqueue(what, data.data(), count));
      SCOPED_TRACE("count " + std::to_string(count) + ", collective " + std::to_string(int(what)));
      expect(what, data, bucket, R, me);
    }
}

TEST(ring_reduce, every_collective_and_size_with_the_reducers_thread) { run_all(true); }
TEST(ring_reduce, every_collective_and_size_advanced_by_the_caller) { run_all(false); }

TEST(ring_reduce, queued_collectives_finish_in_order_while_the_caller_polls) {
  int me = 0;
  const int R = world(&me);
  for (bool thread : {true, false}) {
    dp_reducer<float> reducer(MPI_COMM_WORLD, {100, 60, thread, std::chrono::microseconds(0)});
    std::vector<std::vector<float>> buffers(5);
    std::vector<dp_reducer<float>::ticket> tickets;
    for (size_t b = 0; b < buffers.size(); ++b) {
      buffers[b].assign(250 + 31 * b, float(me + 1));
      tickets.push_back(reducer.enqueue(ring_collective::all_reduce, buffers[b].data(), int64_t(buffers[b].size())));
      reducer.poll();
    }
    for (size_t b = buffers.size(); b-- > 0;) {  // the last ticket covers every one before it
      reducer.wait(tickets[b]);
      for (float v : buffers[b]) ASSERT_EQ(v, float(R * (R + 1) / 2)) << "buffer " << b;
    }
  }
}

}  // namespace
