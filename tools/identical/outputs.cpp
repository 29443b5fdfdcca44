// Hashes of every rank's outputs over a fixed sweep of calls, for comparing
// two builds of the library bit for bit (tools/identical/compare.sh): a
// refactoring that must not change results is checked by running this
// program against the old headers and the new ones and diffing the lines.
//
// Uses only the public API (and detail::set_nodes_for_testing for the
// hierarchical schedule's faked nodes), so that the same source builds
// against older commits. Inputs are a function of (case, rank, index) only;
// every rank prints nothing, rank 0 prints one line per case:
//   <case name> <hash of rank 0's outputs> <hash of rank 1's> ...
// or "<case name> error: <what>" when the call refused the case (the same
// refusal on both builds compares equal).
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "../../tests/support/identical_sweep.hpp"
#include "overlap/overlap.hpp"

namespace {

using namespace overlap_sweep;

/// FNV-1a over the bytes of a buffer, continued from h.
uint64_t fnv(const void* p, size_t bytes, uint64_t h = 1469598103934665603ULL) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ b[i]) * 1099511628211ULL;
  return h;
}

/// Runs one case on this rank; returns the hash of its outputs.
template <class T>
uint64_t run_case(overlap::context& ctx, const sweep_case& sc, uint64_t id) {
  operands<T> x(sc, ctx.rank(), ctx.size(), id);
  if (sc.which == op::ag) {
    if (sc.with_out)
      overlap::all_gather_matmul<T>(ctx, x.av, x.bv, x.cv, x.ov, x.ag);
    else
      overlap::all_gather_matmul<T>(ctx, x.av, x.bv, x.cv, x.ag);
  } else {
    overlap::matmul_reduce_scatter<T>(ctx, x.av, x.bv, x.cv, x.rs);
  }
  return fnv(x.out.data(), x.out.size() * sizeof(T), fnv(x.c.data(), x.c.size() * sizeof(T)));
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  {
    overlap::context plain(MPI_COMM_WORLD);
    overlap::config cfg = plain.config();
    cfg.ag_chunks = 3, cfg.rs_chunks = 3;
    overlap::context chunked(MPI_COMM_WORLD, cfg);
    uint64_t id = 0;
    for (const sweep_case& sc : sweep(size)) {
      overlap::context& ctx = sc.chunked ? chunked : plain;
      overlap::detail::set_nodes_for_testing(ctx, sc.node_slots > 0 ? sc.node_slots : size);
      std::string line = sc.name();
      uint64_t h = 0;
      std::string refused;
      try {
        if (sc.dtype == 0) h = run_case<float>(ctx, sc, id);
        if (sc.dtype == 1) h = run_case<bfloat16>(ctx, sc, id);
        if (sc.dtype == 2) h = run_case<double>(ctx, sc, id);
      } catch (const std::exception& e) {
        refused = e.what();
      }
      std::vector<unsigned long long> all(static_cast<size_t>(size));
      unsigned long long mine = h;
      MPI_Gather(&mine, 1, MPI_UNSIGNED_LONG_LONG, all.data(), 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
      if (rank == 0) {
        if (!refused.empty()) {
          std::printf("%s error: %s\n", line.c_str(), refused.c_str());
        } else {
          for (unsigned long long v : all) line += " " + std::to_string(v);
          std::printf("%s\n", line.c_str());
        }
      }
      ++id;
    }
  }
  MPI_Finalize();
  return 0;
}
