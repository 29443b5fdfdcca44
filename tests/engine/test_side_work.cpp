// Side work in an op's waits (engine::side_work, request_group::fill_waits):
// a wait whose requests have not completed runs the caller's pieces, in
// their order, testing the requests between pieces, and returns once they
// complete; what it left runs after. Every rank exchanges a block with its
// neighbours, and receives one from itself that only a piece sends, so the
// wait cannot complete before that piece ran.
#include <gtest/gtest.h>
#include <mpi.h>

#include <vector>

#include "overlap/engine/side_work.hpp"
#include "overlap/mpi/request.hpp"
#include "reference.hpp"

namespace {

using testing_support::world_rank;
using testing_support::world_size;

TEST(side_work, a_wait_runs_pieces_in_order_until_its_requests_complete) {
  const int R = world_size(), p = world_rank();
  const int next = (p + 1) % R, prev = (p + R - 1) % R;
  const int n = 1000;
  std::vector<int> to_next(n), to_self(n), from_prev(n, -1), from_self(n, -1);
  for (int i = 0; i < n; ++i) to_next[i] = 1000 * p + i, to_self[i] = -1000 * p - i;
  overlap::mpi::request_group g;
  MPI_Irecv(from_prev.data(), n, MPI_INT, prev, 21, MPI_COMM_WORLD, g.add(0));
  MPI_Irecv(from_self.data(), n, MPI_INT, p, 22, MPI_COMM_WORLD, g.add(0));
  MPI_Request sends[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  std::vector<int> ran;
  overlap::engine::side_work work;
  const int pieces = 8, sends_at = 3;
  for (int k = 0; k < pieces; ++k)
    work.add([&, k] {
      ran.push_back(k);
      if (k == 1) MPI_Isend(to_next.data(), n, MPI_INT, next, 21, MPI_COMM_WORLD, &sends[0]);
      if (k == sends_at) MPI_Isend(to_self.data(), n, MPI_INT, p, 22, MPI_COMM_WORLD, &sends[1]);
    });
  {
    overlap::engine::filling_waits fill(g, work);
    g.wait_due(0);
  }
  EXPECT_TRUE(g.empty());
  EXPECT_GT(work.done(), static_cast<size_t>(sends_at)) << "the wait returned before the piece its receive needs";
  work.run_rest();
  EXPECT_EQ(work.left(), 0u);
  EXPECT_EQ(work.done(), static_cast<size_t>(pieces));
  ASSERT_EQ(ran.size(), static_cast<size_t>(pieces));
  for (int k = 0; k < pieces; ++k) EXPECT_EQ(ran[static_cast<size_t>(k)], k) << "pieces run out of order";
  MPI_Waitall(2, sends, MPI_STATUSES_IGNORE);
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(from_prev[i], 1000 * prev + i);
    ASSERT_EQ(from_self[i], -1000 * p - i);
  }
  // Without work set (the scope ended), a wait only waits.
  MPI_Irecv(from_self.data(), n, MPI_INT, p, 23, MPI_COMM_WORLD, g.add(0));
  MPI_Send(to_self.data(), n, MPI_INT, p, 23, MPI_COMM_WORLD);
  g.wait_all();
  EXPECT_EQ(work.done(), static_cast<size_t>(pieces));
}

TEST(side_work, rows_split_into_runs_that_cover_them_once) {
  for (int64_t rows : {0, 1, 31, 64, 65, 1000, 4096})
    for (overlap::engine::row_split s : {overlap::engine::row_split{}, overlap::engine::row_split{3, 1},
                                         overlap::engine::row_split{0, 0}, overlap::engine::row_split{16, 500}}) {
      int64_t next = 0, runs = 0;
      overlap::engine::for_row_runs(rows, s, [&](int64_t first, int64_t count) {
        EXPECT_EQ(first, next);
        EXPECT_GT(count, 0);
        if (s.least > 0 && rows >= 2 * s.least) {
          EXPECT_GE(count, s.least) << rows << " rows";
        }
        next = first + count, ++runs;
      });
      EXPECT_EQ(next, rows);
      EXPECT_LE(runs, s.pieces < 1 ? 1 : s.pieces);
    }
}

}  // namespace
