// A program that fails on purpose, for tests/system/faults/fault_test.sh: the job
// must end (non-zero, quickly, with a message naming the failure) instead of
// hanging. The fatal policy and the watchdog come from OVERLAP_ON_FATAL and
// OVERLAP_TIMEOUT_S.
//
//   fault_driver ring-fault STEP   the last rank's GEMM fails at ring step STEP
//   fault_driver absent SECONDS    the last rank sleeps instead of calling
//   fault_driver ring-stall STEP SECONDS   the last rank sleeps at ring step STEP
//   fault_driver bulk-stall SECONDS        the last rank sleeps before the bulk all-gather
//   fault_driver others-stall SECONDS      the same before the other-operands algorithm's transfers
//   fault_driver loop SECONDS      every rank calls ops until SECONDS pass (for kill tests)
//
// Under OVERLAP_ON_FATAL=throw each rank prints "rank R caught: MESSAGE" for
// the error it got and exits 3 without MPI_Finalize (its peers may still wait
// for it in MPI; a program that handles a fatal error ends the job), after
// FAULT_LINGER_S seconds when that is set.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "overlap/ops/faults.hpp"
#include "overlap/overlap.hpp"

namespace {
void one_call(overlap::context& ctx, int64_t m_r, overlap::strategy s = overlap::strategy::ring,
              overlap::algorithm alg = overlap::algorithm::named) {
  const int64_t k = 256, n = 256;
  std::vector<float> a(static_cast<size_t>(m_r * k), 1.0f), b(static_cast<size_t>(k * n), 0.5f);
  std::vector<float> c(static_cast<size_t>(m_r * ctx.size() * n));
  overlap::ag_options opt;
  opt.strategy = s;
  opt.algorithm = alg;
  overlap::all_gather_matmul<float>(ctx, {a.data(), m_r, k}, {b.data(), k, n}, {c.data(), m_r * ctx.size(), n}, opt);
}
}  // namespace

int main(int argc, char** argv) {
  overlap::mpi::environment env(argc, argv);
  const std::string mode = argc > 1 ? argv[1] : "";
  const double arg = argc > 2 ? std::atof(argv[2]) : 0;
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  try {
    overlap::context ctx(MPI_COMM_WORLD);
    if (mode == "ring-fault") {
      overlap::detail::test_fault = {size - 1, static_cast<int>(arg)};
      for (int i = 0; i < 3; ++i) one_call(ctx, 64);
    } else if (mode == "ring-stall") {
      overlap::detail::test_fault = {size - 1, static_cast<int>(arg), argc > 3 ? std::atof(argv[3]) : 0};
      one_call(ctx, 64);
    } else if (mode == "bulk-stall") {
      one_call(ctx, 64, overlap::strategy::bulk);  // the plan exists: the next call goes straight to the collective
      overlap::detail::test_fault = {size - 1, -1, arg};
      one_call(ctx, 64, overlap::strategy::bulk);
    } else if (mode == "others-stall") {
      one_call(ctx, 64, overlap::strategy::bulk, overlap::algorithm::others);
      overlap::detail::test_fault = {size - 1, -1, arg};
      one_call(ctx, 64, overlap::strategy::bulk, overlap::algorithm::others);
    } else if (mode == "absent") {
      one_call(ctx, 64);  // everybody there once
      if (rank == size - 1)
        std::this_thread::sleep_for(std::chrono::duration<double>(arg));
      else
        one_call(ctx, 64);
    } else if (mode == "loop") {
      std::printf("rank %d pid %d running\n", rank, static_cast<int>(getpid()));
      std::fflush(stdout);
      const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(arg);
      while (std::chrono::steady_clock::now() < end) one_call(ctx, 128);
    } else {
      std::fprintf(stderr,
                   "usage: fault_driver ring-fault STEP | ring-stall STEP SECONDS | bulk-stall SECONDS | "
                   "others-stall SECONDS | "
                   "absent SECONDS | loop SECONDS\n");
      return 2;
    }
  } catch (const std::exception& e) {
    std::printf("rank %d caught: %s\n", rank, e.what());
    std::fflush(stdout);
    // FAULT_LINGER_S: stay alive a while, so that peers meet their own
    // watchdog instead of mpirun ending them when this process exits.
    if (const char* linger = std::getenv("FAULT_LINGER_S"))
      std::this_thread::sleep_for(std::chrono::duration<double>(std::atof(linger)));
    std::_Exit(3);
  }
  std::printf("rank %d finished\n", rank);
  return 0;
}
