#pragma once
// Timing shared by the apps: each iteration is timed on every rank after a
// barrier, the iteration's time is the max over ranks, and the result is the
// median over iterations (robust on a shared, noisy machine).
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <string>
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

/// Busy CPU time of this node so far, all cores together, in milliseconds
/// (user + nice + system + irq + softirq + steal from /proc/stat); negative
/// where /proc/stat cannot be read. Differences of two readings say how much
/// CPU a phase kept busy, including the kernel's network stack, which the
/// ranks' own CPU times do not show.
inline double node_busy_cpu_ms() {
  std::ifstream stat("/proc/stat");
  std::string cpu;
  long long user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  if (!(stat >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal) || cpu != "cpu") return -1;
  static const double ms_per_tick = 1000.0 / double(sysconf(_SC_CLK_TCK));
  return double(user + nice + system + irq + softirq + steal) * ms_per_tick;
}

}  // namespace overlap::apps
