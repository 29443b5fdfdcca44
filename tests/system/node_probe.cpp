// Prints, per rank, how many ranks share its node (MPI_COMM_TYPE_SHARED, as
// the library's node detection sees it) and whether a context thinks all
// ranks share one node, the nodes it counts and its ring order: "rank R
// node_ranks N one_node B nodes K ring a,b,c,...". The emulated cluster's
// smoke test checks it against the nodes x slots it brought up.
#include <mpi.h>

#include <cstdio>
#include <string>

#include "overlap/overlap.hpp"

int main(int argc, char** argv) {
  overlap::mpi::environment env(argc, argv);
  overlap::context ctx(MPI_COMM_WORLD);
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, ctx.rank(), MPI_INFO_NULL, &node);
  int node_ranks = 0;
  MPI_Comm_size(node, &node_ranks);
  MPI_Comm_free(&node);
  std::string ring;
  for (int r : ctx.ring()) ring += (ring.empty() ? "" : ",") + std::to_string(r);
  std::printf("rank %d node_ranks %d one_node %d nodes %d ring %s\n", ctx.rank(), node_ranks, ctx.one_node() ? 1 : 0,
              ctx.nodes(), ring.c_str());
  return 0;
}
