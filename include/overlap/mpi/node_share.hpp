#pragma once
/// @file
/// What a rank shares its node's hardware threads with: the facts the
/// automatic progress policy decides on (engine/progress.hpp).

#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "overlap/core/error.hpp"

#if defined(__linux__)
#include <sched.h>
#endif

namespace overlap::mpi {

/// One rank's view of its node.
struct node_share {
  int cpus = 1;              ///< hardware threads this process may run on (its affinity mask)
  int ranks = 1;             ///< processes competing for those hardware threads, this one included
  int threads = 1;           ///< compute threads per rank
  std::string ranks_from;    ///< where ranks came from, for messages
  std::string threads_from;  ///< where threads came from, for messages
  bool multiple = false;     ///< MPI provides MPI_THREAD_MULTIPLE
};

namespace detail {
/// A positive integer at the start of s ("4" or "4,2" as OMP_NUM_THREADS
/// nests levels), else 0.
[[nodiscard]] inline int leading_count(const char* s) {
  if (s == nullptr || *s < '0' || *s > '9') return 0;
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  return v >= 1 && v <= 1 << 20 && (*end == '\0' || *end == ',') ? static_cast<int>(v) : 0;
}

/// This process's affinity mask as bytes (empty where the OS has none to tell).
[[nodiscard]] inline std::vector<unsigned char> affinity_bytes() {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return {};
  std::vector<unsigned char> out(sizeof set);
  std::memcpy(out.data(), &set, sizeof set);
  return out;
#else
  return {};
#endif
}

[[nodiscard]] inline int bits_set(const std::vector<unsigned char>& bytes) {
  int n = 0;
  for (unsigned char b : bytes)
    for (; b != 0; b &= static_cast<unsigned char>(b - 1)) ++n;
  return n;
}
}  // namespace detail

/// Collective over comm. Counts the ranks of comm on this node (MPI_Comm_split_type
/// with MPI_COMM_TYPE_SHARED) whose affinity masks meet this rank's. When this
/// process is not bound (its mask holds every online hardware thread) and the
/// launcher says more ranks of the job run on the node (Open MPI's
/// OMPI_COMM_WORLD_LOCAL_SIZE, Hydra's MPI_LOCALNRANKS), those count too:
/// ranks outside comm compute on the same cores. Compute threads per rank
/// are OMP_NUM_THREADS's first level, else every hardware thread of the mask
/// (the OpenMP default that oneDNN's runtime follows).
[[nodiscard]] inline node_share share_of_node(MPI_Comm comm) {
  node_share s;
  std::vector<unsigned char> mask = detail::affinity_bytes();
  const unsigned hw = std::thread::hardware_concurrency();
  s.cpus = mask.empty() ? std::max(1U, hw) : std::max(1, detail::bits_set(mask));
  const int width = static_cast<int>(mask.size());

  int rank = 0;
  OVERLAP_MPI(MPI_Comm_rank, comm, &rank);
  MPI_Comm node = MPI_COMM_NULL;
  OVERLAP_MPI(MPI_Comm_split_type, comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int here = 1;
  MPI_Comm_size(node, &here);
  std::vector<unsigned char> all(static_cast<size_t>(here) * mask.size());
  // Every rank of a node runs the same OS, so the masks have one width.
  const int rc =
      width == 0 ? MPI_SUCCESS : MPI_Allgather(mask.data(), width, MPI_BYTE, all.data(), width, MPI_BYTE, node);
  MPI_Comm_free(&node);
  if (rc != MPI_SUCCESS) overlap::detail::throw_mpi_error(rc, "MPI_Allgather");
  s.ranks = width == 0 ? here : 0;
  for (int r = 0; r < here && width > 0; ++r)
    for (int b = 0; b < width; ++b)
      if ((all[static_cast<size_t>(r) * mask.size() + static_cast<size_t>(b)] & mask[static_cast<size_t>(b)]) != 0) {
        ++s.ranks;
        break;
      }
  s.ranks_from = "of this communicator on this node";
  const bool bound = !mask.empty() && static_cast<unsigned>(s.cpus) < hw;
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
    const int n = detail::leading_count(std::getenv(var));
    if (!bound && n > s.ranks) {
      s.ranks = n;
      s.ranks_from = std::string("on this node (") + var + ")";
    }
  }
  s.threads = detail::leading_count(std::getenv("OMP_NUM_THREADS"));
  s.threads_from = "OMP_NUM_THREADS";
  if (s.threads == 0) {
    s.threads = s.cpus;
    s.threads_from = "OMP_NUM_THREADS unset: one per hardware thread";
  }
  int provided = MPI_THREAD_SINGLE;
  OVERLAP_MPI(MPI_Query_thread, &provided);
  s.multiple = provided >= MPI_THREAD_MULTIPLE;
  return s;
}

}  // namespace overlap::mpi
