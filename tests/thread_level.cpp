// The progress thread needs MPI_THREAD_MULTIPLE: with a lower thread level a
// context must refuse with a clear error on every rank, and a context with
// progress_policy::none must still work.
#include <mpi.h>

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
    overlap::context ctx(MPI_COMM_WORLD);
    std::printf("context with a progress thread was accepted at a low thread level\n");
    failures = 1;
  } catch (const std::invalid_argument& e) {
    if (std::string(e.what()).find("MPI_THREAD_MULTIPLE") == std::string::npos) failures = 1;
  }
  overlap::config cfg;
  cfg.progress = overlap::progress_policy::none;
  overlap::context ctx(MPI_COMM_WORLD, cfg);
  const int R = ctx.size();
  std::vector<float> a(2, 1.0f), b(2 * 3, 0.5f), c(static_cast<size_t>(R) * 3, 0.0f);
  overlap::all_gather_matmul<float>(ctx, {a.data(), 1, 2}, {b.data(), 2, 3}, {c.data(), R, 3});
  for (float v : c)
    if (v != 1.0f) failures = 1;
  int all = 0;
  MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (ctx.rank() == 0) std::printf("thread level check: %s\n", all ? "FAILED" : "ok");
  return all;
}
