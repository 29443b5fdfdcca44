#pragma once
/// @file
/// Where the ranks of a communicator sit: which share a node, their ranks in
/// MPI_COMM_WORLD, and the ring order that keeps a node's ranks together.

#include <mpi.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "overlap/core/error.hpp"

namespace overlap::mpi {

/// Collective over comm: for every rank of comm, the lowest rank of comm on
/// its node (MPI_Comm_split_type with MPI_COMM_TYPE_SHARED), so that two
/// ranks share a node exactly when their values are equal.
[[nodiscard]] inline std::vector<int> node_leaders(MPI_Comm comm) {
  int rank = 0, size = 1;
  OVERLAP_MPI(MPI_Comm_rank, comm, &rank);
  OVERLAP_MPI(MPI_Comm_size, comm, &size);
  MPI_Comm node = MPI_COMM_NULL;
  OVERLAP_MPI(MPI_Comm_split_type, comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int leader = rank;
  const int rc = MPI_Allreduce(&rank, &leader, 1, MPI_INT, MPI_MIN, node);
  MPI_Comm_free(&node);
  if (rc != MPI_SUCCESS) overlap::detail::throw_mpi_error(rc, "MPI_Allreduce");
  std::vector<int> leaders(static_cast<size_t>(size));
  OVERLAP_MPI(MPI_Allgather, &leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, comm);
  return leaders;
}

/// Local: the rank in MPI_COMM_WORLD of every rank of comm; empty when comm's
/// ranks are the world's in the same order (the names agree, so messages
/// need only one).
[[nodiscard]] inline std::vector<int> world_ranks(MPI_Comm comm) {
  MPI_Group mine = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  OVERLAP_MPI(MPI_Comm_group, comm, &mine);
  OVERLAP_MPI(MPI_Comm_group, MPI_COMM_WORLD, &world);
  int size = 0;
  MPI_Group_size(mine, &size);
  std::vector<int> ranks(static_cast<size_t>(size)), out(static_cast<size_t>(size));
  std::iota(ranks.begin(), ranks.end(), 0);
  const int rc = MPI_Group_translate_ranks(mine, size, ranks.data(), world, out.data());
  MPI_Group_free(&mine);
  MPI_Group_free(&world);
  if (rc != MPI_SUCCESS) overlap::detail::throw_mpi_error(rc, "MPI_Group_translate_ranks");
  int world_size = 0;
  OVERLAP_MPI(MPI_Comm_size, MPI_COMM_WORLD, &world_size);
  if (size == world_size && out == ranks) out.clear();
  return out;
}

/// "rank r", or "rank r (world rank w)" when the communicator's ranks are
/// not the world's (world: world_ranks() of it; MPI_UNDEFINED: a process
/// outside MPI_COMM_WORLD, e.g. spawned).
[[nodiscard]] inline std::string rank_text(int r, const std::vector<int>& world) {
  std::string s = "rank " + std::to_string(r);
  if (world.empty() || r < 0 || static_cast<size_t>(r) >= world.size()) return s;
  const int w = world[static_cast<size_t>(r)];
  return s + (w == MPI_UNDEFINED ? " (not in MPI_COMM_WORLD)" : " (world rank " + std::to_string(w) + ")");
}

/// The ring order (element k: the rank at position k) that makes the ranks
/// of one node neighbours: nodes in the order of their lowest rank, ranks in
/// rank order inside a node. A ring over n nodes then crosses each node
/// boundary once per direction; with ranks placed by node (each node's ranks
/// consecutive, mpirun's default --map-by slot) it is the identity.
/// leaders: node_leaders() of the communicator.
[[nodiscard]] inline std::vector<int> ring_by_node(const std::vector<int>& leaders) {
  std::vector<int> order(leaders.size());
  std::iota(order.begin(), order.end(), 0);
  // Ties broken by rank (std::sort: no temporary buffer, unlike stable_sort).
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    const int la = leaders[static_cast<size_t>(a)], lb = leaders[static_cast<size_t>(b)];
    return la != lb ? la < lb : a < b;
  });
  return order;
}

/// The number of ranks on each node when every node has as many, else 0.
/// leaders: node_leaders() of the communicator.
[[nodiscard]] inline int uniform_node_size(const std::vector<int>& leaders) {
  std::map<int, int> count;
  for (int l : leaders) ++count[l];
  const int first = count.empty() ? 0 : count.begin()->second;
  for (const auto& node : count)
    if (node.second != first) return 0;
  return first;
}

/// Number of distinct nodes in node_leaders().
[[nodiscard]] inline int node_count(std::vector<int> leaders) {
  std::sort(leaders.begin(), leaders.end());
  return static_cast<int>(std::unique(leaders.begin(), leaders.end()) - leaders.begin());
}

}  // namespace overlap::mpi
