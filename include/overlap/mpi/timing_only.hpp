#pragma once
/// @file
/// Bulk collectives as their message pattern alone, for SMPI's timing-only
/// runs (sim_compute::skipped or calibrated, whose buffers are shared by the
/// simulated ranks and hold garbage). SimGrid's own MPI_Reduce_scatter
/// allocates every rank's whole input and really sums it, in memory that
/// shared malloc never reaches: about 64 GiB at 1024 ranks for a 4096^2
/// f32 product. Here the same ring moves the same bytes between the same
/// ranks from and into the shared buffers, and each step's sum is charged,
/// not computed.

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <vector>

#include "overlap/mpi/datatype.hpp"
#include "overlap/mpi/simulator.hpp"

namespace overlap::mpi {

/// Seconds this machine takes to add n elements of `size` bytes into
/// others: the rate of a float add over two 4 MiB arrays, measured on the
/// first call (the best of 3 runs, untimed by SMPI) and kept. What a
/// timing-only step charges for the sum it skips, scaled like any measured
/// time.
[[nodiscard]] inline double add_seconds(long long n, int size) {
  static const double seconds_per_byte = [] {
    untimed_scope measuring;
    constexpr size_t count = size_t{1} << 20;
    std::vector<float> x(count, 1.0f), y(count, 2.0f);
    double best = 1e30;
    for (int run = 0; run < 3; ++run) {
      const auto t0 = std::chrono::steady_clock::now();
      for (size_t i = 0; i < count; ++i) y[i] += x[i];
      const std::chrono::duration<double> took = std::chrono::steady_clock::now() - t0;
      best = std::min(best, took.count());
    }
    volatile float keep = y[count / 2];  // the adds are used
    (void)keep;
    return best / static_cast<double>(count * sizeof(float));
  }();
  return seconds_per_byte * static_cast<double>(n) * size;
}

/// Seconds this machine takes to copy `bytes`: the rate of a memcpy between
/// two 64 MiB arrays (beyond the caches, as a shard's copy is), measured
/// once per simulation (the best of 3 runs, untimed by SMPI) and kept for
/// every rank.
[[nodiscard]] inline double copy_seconds(double bytes) {
  double& seconds_per_byte = process_wide<double>("overlap/copy-seconds-per-byte");
  if (seconds_per_byte > 0) return seconds_per_byte * bytes;
  untimed_scope measuring;  // ends this rank's timed burst: other ranks run meanwhile, and may measure first
  if (seconds_per_byte <= 0) {
    constexpr size_t count = size_t{64} << 20;
    std::vector<std::byte> from(count, std::byte{1}), to(count, std::byte{2});
    double best = 1e30;
    for (int run = 0; run < 3; ++run) {
      const auto t0 = std::chrono::steady_clock::now();
      std::memcpy(to.data(), from.data(), count);
      const std::chrono::duration<double> took = std::chrono::steady_clock::now() - t0;
      best = std::min(best, took.count());
    }
    volatile std::byte keep = to[count / 2];  // the copy is used
    (void)keep;
    seconds_per_byte = best / static_cast<double>(count);
  }
  return seconds_per_byte * bytes;
}

/// Whether a local copy of matrix data is skipped and charged instead:
/// under SMPI's timing-only runs, whose workspaces are garbage shared by
/// every simulated rank. At 1024 ranks of a dp x tp mesh (tp 8, the
/// 65536 x 8192 all-gather) bulk's copy of each rank's 256 MiB shard into
/// the gathered buffer was 95% of the simulation's real time.
[[nodiscard]] inline bool copies_charged() noexcept { return simulated && shared_workspaces(); }

/// Charges a skipped copy of `bytes` to this rank's simulated clock, as
/// SMPI would have charged the copy's real time.
inline void charge_copy(double bytes) {
  untimed_scope charged;
  charge_compute(copy_seconds(bytes));
}

/// A reduce-scatter's input: R blocks in rank order, counts[q] elements of
/// `type` each, contiguous from `send`, and the tag of its messages.
struct reduce_scatter_blocks {
  const void* send;   ///< the blocks, one after the other
  const int* counts;  ///< R counts, in elements
  MPI_Datatype type;  ///< the elements' type
  int tag;            ///< engine::message_tag::timing_reduce_scatter
};

/// The ring reduce-scatter's pattern (Open MPI's choice for large blocks):
/// R - 1 steps; at step s rank p sends its partial block p - s - 1 to rank
/// p + 1, receives block p - s - 2 from rank p - 1 and adds it (charged).
/// Returns MPI_SUCCESS or the first MPI error. Collective over comm;
/// blocking. Only for buffers whose contents do not matter: nothing is
/// summed, each received block overwrites the send buffer's copy, and the
/// caller's result buffer is not written.
inline int timing_reduce_scatter(const reduce_scatter_blocks& x, MPI_Comm comm) {
  const int* counts = x.counts;
  const MPI_Datatype type = x.type;
  const int tag = x.tag;
  int R = 1, p = 0, size = 0;
  MPI_Comm_size(comm, &R);
  MPI_Comm_rank(comm, &p);
  MPI_Type_size(type, &size);
  std::vector<std::ptrdiff_t> at(static_cast<size_t>(R) + 1, 0);  // block offsets, in bytes
  for (int q = 0; q < R; ++q)
    at[static_cast<size_t>(q) + 1] = at[static_cast<size_t>(q)] + std::ptrdiff_t{counts[q]} * size;
  const auto* base = static_cast<const std::byte*>(x.send);
  const int next = (p + 1) % R, prev = (p + R - 1) % R;
  const auto block = [R](int b) { return ((b % R) + R) % R; };
  int rc = MPI_SUCCESS;
  for (int s = 0; s < R - 1 && rc == MPI_SUCCESS; ++s) {
    const int out = block(p - s - 1), in = block(p - s - 2);
    // Received into the send buffer's copy of the block (shared garbage of
    // the block's size; no other buffer is as large as every block).
    void* into = const_cast<std::byte*>(base + at[static_cast<size_t>(in)]);
    MPI_Request r[2];
    rc = MPI_Irecv(any_buffer(into), counts[in], type, prev, tag, comm, &r[0]);
    if (rc == MPI_SUCCESS)
      rc = MPI_Isend(any_buffer(const_cast<std::byte*>(base + at[static_cast<size_t>(out)])), counts[out], type, next,
                     tag, comm, &r[1]);
    if (rc == MPI_SUCCESS) rc = MPI_Waitall(2, r, MPI_STATUSES_IGNORE);
    untimed_scope charged;
    charge_compute(add_seconds(counts[in], size));
  }
  return rc;
}

}  // namespace overlap::mpi
