// The ring engine with transfers that name their peer: a pairwise exchange
// (all-to-all) on every rank of the world. Rank p holds a block for every
// rank q (values made of p, q and the element's index); at step t it
// computes on the block of rank p - t (its own at step 0), whose receive was
// posted `lead` steps ahead, and sends its block for rank p + t + 1 (needed
// there at step t + 1: a send never waits on the step that needs it). After the
// run every rank holds, from every rank, exactly the block that rank made
// for it: compared against the formula, not against the engine's own
// bookkeeping.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <vector>

#include "overlap/engine/ring.hpp"
#include "overlap/mpi/communicator.hpp"

namespace {

/// The value rank `from` sends rank `to` at index i of its block.
int value_of(int from, int to, int i) { return 1000000 * from + 1000 * to + i; }

struct pairwise_pattern {
  int ranks = 1, rank = 0, lead = 1, slack = 0, block = 3;
  std::vector<int> outgoing, incoming;  ///< block q: for rank q; from rank q
  std::vector<int> computed_from;       ///< the rank whose block each step computed on, in order

  pairwise_pattern(int r, int p, int l, int s, int b) : ranks(r), rank(p), lead(l), slack(s), block(b) {
    outgoing.resize(static_cast<size_t>(ranks * block));
    incoming.assign(static_cast<size_t>(ranks * block), -1);
    for (int q = 0; q < ranks; ++q)
      for (int i = 0; i < block; ++i) outgoing[static_cast<size_t>(q * block + i)] = value_of(rank, q, i);
  }
  [[nodiscard]] int peer(int offset) const { return ((rank + offset) % ranks + ranks) % ranks; }
  [[nodiscard]] int steps() const { return ranks; }
  [[nodiscard]] overlap::engine::ring_window window() const { return {lead, slack}; }
  /// Step u's block comes from rank p - u (the block it sent at step u - 1); step 0's is this rank's own.
  [[nodiscard]] overlap::engine::transfer recv(int u, int /*lane*/) const {
    if (u == 0) return {};
    const int from = peer(-u);
    return {const_cast<int*>(&incoming[static_cast<size_t>(from * block)]), MPI_INT, block, from};
  }
  /// Step t sends rank p + t + 1 the block it computes on at step t + 1.
  [[nodiscard]] overlap::engine::transfer send(int t, int /*lane*/) {
    const int u = t + 1;
    if (u >= ranks) return {};
    const int to = peer(u);
    return {&outgoing[static_cast<size_t>(to * block)], MPI_INT, block, to};
  }
  void compute(int t) {
    const int from = peer(-t);
    if (t == 0)
      std::copy(outgoing.begin() + rank * block, outgoing.begin() + (rank + 1) * block,
                incoming.begin() + rank * block);
    computed_from.push_back(from);
    for (int i = 0; i < block; ++i)
      EXPECT_EQ(incoming[static_cast<size_t>(from * block + i)], value_of(from, rank, i))
          << "step " << t << ": the block from rank " << from << " had not arrived";
  }
};

TEST(engine_peers, pairwise_exchange_delivers_every_block) {
  auto comm = overlap::mpi::communicator::borrow(MPI_COMM_WORLD).dup();
  int ranks = 1, rank = 0;
  MPI_Comm_size(comm.get(), &ranks);
  MPI_Comm_rank(comm.get(), &rank);
  overlap::mpi::request_group requests;
  overlap::engine::ring_links links;
  links.comm = comm.get();
  // The lane's neighbours are deliberately wrong: every transfer names its peer.
  links.lanes[0] = {MPI_PROC_NULL, MPI_PROC_NULL, 21};
  for (int lead : {1, 2})
    for (int slack : {0, 1})
      for (int block : {1, 5}) {
        pairwise_pattern pat(ranks, rank, lead, slack, block);
        overlap::engine::run_ring(links, pat, requests, nullptr);
        EXPECT_TRUE(requests.empty());
        ASSERT_EQ(static_cast<int>(pat.computed_from.size()), ranks);
        for (int q = 0; q < ranks; ++q)
          for (int i = 0; i < block; ++i)
            EXPECT_EQ(pat.incoming[static_cast<size_t>(q * block + i)], value_of(q, rank, i))
                << "lead " << lead << " slack " << slack << ": from rank " << q << ", element " << i;
        // Every rank's block was computed on once.
        std::vector<int> seen = pat.computed_from;
        std::sort(seen.begin(), seen.end());
        for (int q = 0; q < ranks; ++q) EXPECT_EQ(seen[static_cast<size_t>(q)], q);
      }
}

/// A ring pattern's transfers, naming no peer, still go to the lane's neighbours.
TEST(engine_peers, a_transfer_without_a_peer_uses_its_lane) {
  const overlap::engine::transfer t{nullptr, MPI_INT, 1};
  EXPECT_EQ(t.peer_or(3), 3);
  const overlap::engine::transfer named{nullptr, MPI_INT, 1, 0};
  EXPECT_EQ(named.peer_or(3), 0);
}

}  // namespace
