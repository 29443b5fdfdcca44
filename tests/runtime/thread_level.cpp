// The progress thread needs MPI_THREAD_MULTIPLE: with a lower thread level a
// context asked for it must refuse with a clear error on every rank, and a
// context with progress_policy::none, poll or automatic (the default, which
// then chooses poll) must still work; a started op is refused on every rank.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "overlap/overlap.hpp"

int main(int argc, char** argv) {
  overlap::mpi::environment env(argc, argv, MPI_THREAD_FUNNELED);
  int failures = 0;
  if (env.provided() >= MPI_THREAD_MULTIPLE) {
    std::printf("MPI gave MPI_THREAD_MULTIPLE although FUNNELED was asked for; nothing to check\n");
    return 1;
  }
  try {
    overlap::config cfg;
    cfg.progress = overlap::progress_policy::thread;
    overlap::context ctx(MPI_COMM_WORLD, cfg);
    std::printf("context with a progress thread was accepted at a low thread level\n");
    failures = 1;
  } catch (const std::invalid_argument& e) {
    if (std::string(e.what()).find("MPI_THREAD_MULTIPLE") == std::string::npos) failures = 1;
  }
  // Policies that call MPI from the calling thread only work at this level,
  // and the automatic one (the default) chooses among them.
  int R = 1, rank = 0;
  for (auto policy :
       {overlap::progress_policy::none, overlap::progress_policy::poll, overlap::progress_policy::automatic}) {
    overlap::config cfg;
    cfg.progress = policy;
    overlap::context ctx(MPI_COMM_WORLD, cfg);
    if (ctx.config().progress == overlap::progress_policy::thread ||
        ctx.config().progress == overlap::progress_policy::automatic) {
      std::printf("progress %s left %s at a low thread level\n", overlap::to_string(policy),
                  overlap::to_string(ctx.config().progress));
      failures = 1;
    }
    R = ctx.size(), rank = ctx.rank();
    std::vector<float> a(2 * 2, 1.0f), b(2 * 3, 0.5f), c(static_cast<size_t>(R) * 2 * 3, 0.0f);
    overlap::all_gather_matmul<float>(ctx, {a.data(), 2, 2}, {b.data(), 2, 3}, {c.data(), 2 * R, 3});
    for (float v : c)
      if (v != 1.0f) failures = 1;
    // A started op runs on a second thread: refused on every rank, each time
    // (no rank keeps a worker the others lack), and the context stays usable.
    for (int attempt = 0; attempt < 2; ++attempt) {
      try {
        overlap::start_all_gather_matmul<float>(ctx, {a.data(), 2, 2}, {b.data(), 2, 3}, {c.data(), 2 * R, 3}).wait();
        std::printf("a started op was accepted at a low thread level\n");
        failures = 1;
      } catch (const std::invalid_argument& e) {
        if (std::string(e.what()).find("MPI_THREAD_MULTIPLE") == std::string::npos) failures = 1;
      }
    }
    std::fill(c.begin(), c.end(), 0.0f);
    overlap::all_gather_matmul<float>(ctx, {a.data(), 2, 2}, {b.data(), 2, 3}, {c.data(), 2 * R, 3});
    for (float v : c)
      if (v != 1.0f) failures = 1;
  }
  int all = 0;
  MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) std::printf("thread level check: %s\n", all ? "FAILED" : "ok");
  return all;
}
