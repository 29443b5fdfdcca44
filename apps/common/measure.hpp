#pragma once
// Timing shared by the apps: each iteration is timed on every rank after a
// barrier, the iteration's time is the max over ranks, and the result is the
// median over iterations (robust on a shared, noisy machine).
#include <mpi.h>

#include <algorithm>
#include <functional>
#include <vector>

namespace overlap::apps {

/// Collective. Runs `body` warmup + iters times; returns the median over the
/// measured iterations of the slowest rank's time, in milliseconds.
inline double median_max_ms(MPI_Comm comm, int warmup, int iters, const std::function<void()>& body) {
  std::vector<double> times;
  for (int it = 0; it < warmup + iters; ++it) {
    MPI_Barrier(comm);
    const double t0 = MPI_Wtime();
    body();
    double local = (MPI_Wtime() - t0) * 1e3, slowest = 0;
    MPI_Allreduce(&local, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm);
    if (it >= warmup) times.push_back(slowest);
  }
  std::sort(times.begin(), times.end());
  const size_t n = times.size();
  return n == 0 ? 0.0 : (n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]));
}

}  // namespace overlap::apps
