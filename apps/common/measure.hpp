#pragma once
// Timing shared by the apps: each iteration is timed on every rank after a
// barrier, the iteration's time is the max over ranks, and the result is the
// median over iterations (robust on a shared, noisy machine).
#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <vector>

#include "overlap/runtime/context.hpp"

namespace overlap::apps {

/// MPI_COMM_WORLD's size and this process's rank in it.
inline int world_size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}
inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

/// Collective. Empties the token buckets of rate-limited links before a timed
/// call: each rank sends `bytes` to both neighbours in rank order and
/// receives theirs. Emulated links (tc tbf, tools/vcluster) let data through
/// at line rate until a bucket (vcluster: 256 KiB per link and direction)
/// runs dry, and refill it while idle; a call that follows an idle gap then
/// gets up to a bucket of free transfer (2 ms at 1 Gbit/s), one that follows
/// a link-bound call none, which real NICs do not do. Sending twice the
/// bucket leaves it empty for every call alike. Untimed; 0 bytes: nothing.
class link_drain {
 public:
  link_drain(MPI_Comm comm, long bytes) : comm_(comm), bytes_(static_cast<int>(bytes)) {
    int size = 1;
    MPI_Comm_size(comm, &size);
    if (size < 2) bytes_ = 0;
    out_.assign(static_cast<size_t>(bytes_), std::byte{1});
    in_.resize(2 * static_cast<size_t>(bytes_));
  }
  void operator()() {
    if (bytes_ == 0) return;
    int rank = 0, size = 1;
    MPI_Comm_rank(comm_, &rank), MPI_Comm_size(comm_, &size);
    const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    MPI_Request r[4];
    MPI_Irecv(in_.data(), bytes_, MPI_BYTE, prev, 977, comm_, &r[0]);
    MPI_Irecv(in_.data() + bytes_, bytes_, MPI_BYTE, next, 978, comm_, &r[1]);
    MPI_Isend(out_.data(), bytes_, MPI_BYTE, next, 977, comm_, &r[2]);
    MPI_Isend(out_.data(), bytes_, MPI_BYTE, prev, 978, comm_, &r[3]);
    MPI_Waitall(4, r, MPI_STATUSES_IGNORE);
  }

 private:
  MPI_Comm comm_;
  int bytes_;
  std::vector<std::byte> out_, in_;
};

/// Collective. Runs every body once per round, warmup + iters rounds, so that
/// a slow phase of a shared machine hits them alike; returns each body's
/// median over the measured rounds of the slowest rank's time, in ms.
/// `before` (untimed) runs before each call, e.g. a link_drain.
inline std::vector<double> interleaved_median_max_ms(MPI_Comm comm, int warmup, int iters,
                                                     const std::vector<std::function<void()>>& bodies,
                                                     const std::function<void()>& before = {}) {
  std::vector<std::vector<double>> times(bodies.size());
  for (int it = 0; it < warmup + iters; ++it)
    for (size_t b = 0; b < bodies.size(); ++b) {
      if (before) before();
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

/// Collective. Runs `body` (after `before`) until strategy::automatic has
/// settled on every shape of ctx it measures (the first calls of a shape
/// time the cost model's best candidates: docs/design.md, "Measured
/// choice"), at least once and at most `most` times; returns the runs.
/// Timing after it sees what a training job's later steps run.
inline int run_until_settled(const overlap::context& ctx, const std::function<void()>& body, int most = 40,
                             const std::function<void()>& before = {}) {
  int runs = 0;
  do {
    if (before) before();
    body();
    ++runs;
  } while (runs < most && ctx.measuring() > 0);
  return runs;
}

/// Collective. Runs `body` warmup + iters times; returns the median over the
/// measured iterations of the slowest rank's time, in milliseconds.
inline double median_max_ms(MPI_Comm comm, int warmup, int iters, const std::function<void()>& body,
                            const std::function<void()>& before = {}) {
  return interleaved_median_max_ms(comm, warmup, iters, {body}, before).front();
}

}  // namespace overlap::apps
