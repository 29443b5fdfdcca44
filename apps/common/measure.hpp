#pragma once
// Timing shared by the apps: each iteration is timed on every rank after a
// barrier, the iteration's time is the max over ranks, and the result is the
// median over iterations (robust on a shared, noisy machine).
#include <mpi.h>

#include <algorithm>
#include <functional>
#include <vector>

namespace overlap::apps {

/// Collective. Runs every body once per round, warmup + iters rounds, so that
/// a slow phase of a shared machine hits them alike; returns each body's
/// median over the measured rounds of the slowest rank's time, in ms.
inline std::vector<double> interleaved_median_max_ms(MPI_Comm comm, int warmup, int iters,
                                                     const std::vector<std::function<void()>>& bodies) {
  std::vector<std::vector<double>> times(bodies.size());
  for (int it = 0; it < warmup + iters; ++it)
    for (size_t b = 0; b < bodies.size(); ++b) {
      MPI_Barrier(comm);
      const double t0 = MPI_Wtime();
      bodies[b]();
      double local = (MPI_Wtime() - t0) * 1e3, slowest = 0;
      MPI_Allreduce(&local, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm);
      if (it >= warmup) times[b].push_back(slowest);
    }
  std::vector<double> medians;
  for (auto& t : times) {
    std::sort(t.begin(), t.end());
    const size_t n = t.size();
    medians.push_back(n == 0 ? 0.0 : (n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2])));
  }
  return medians;
}

/// Collective. Runs `body` warmup + iters times; returns the median over the
/// measured iterations of the slowest rank's time, in milliseconds.
inline double median_max_ms(MPI_Comm comm, int warmup, int iters, const std::function<void()>& body) {
  return interleaved_median_max_ms(comm, warmup, iters, {body}).front();
}

}  // namespace overlap::apps
