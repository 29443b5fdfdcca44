#pragma once
/// @file
/// Bulk collectives as their message pattern alone, for SMPI's timing-only
/// runs (sim_compute::skipped or calibrated, whose buffers are shared by the
/// simulated ranks and hold garbage). SimGrid's own MPI_Reduce_scatter and
/// MPI_Allreduce allocate every rank's whole input and really sum it, in
/// memory that shared malloc never reaches: about 64 GiB at 1024 ranks for
/// a 4096^2 f32 product. Here the same ring moves the same bytes between
/// the same ranks from and into the shared buffers, and each step's sum is
/// charged, not computed.

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <vector>

#include "overlap/mpi/datatype.hpp"
#include "overlap/mpi/simulator.hpp"

namespace overlap::mpi {

/// The best of 3 real-clock timings of `burst` (SMPI's timers are
/// simulated), in seconds.
template <class Burst>
[[nodiscard]] double best_of_3(Burst burst) {
  double best = 1e30;
  for (int run = 0; run < 3; ++run) {
    const auto t0 = std::chrono::steady_clock::now();
    burst();
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - t0;
    best = std::min(best, took.count());
  }
  return best;
}

/// A rate of this machine (seconds per byte) that `measure` times: measured
/// once per simulation, untimed by SMPI, and kept for every rank under
/// `name` (mpi::process_wide; once per process on a real MPI). Every rank
/// measuring its own would cost R times the real time and memory (at 1024
/// ranks of 64 MiB copies: 35 s of a 64-rank run went to page faults).
template <class Measure>
[[nodiscard]] double measured_once(const char* name, Measure measure) {
  double& seconds_per_byte = process_wide<double>(name);
  if (seconds_per_byte > 0) return seconds_per_byte;
  // Ending the timed burst is a simcall: the other ranks run meanwhile and
  // may have measured by the time this one resumes, so ask again.
  untimed_scope measuring;
  if (seconds_per_byte <= 0) seconds_per_byte = measure();
  return seconds_per_byte;
}

/// Seconds this machine takes to add n elements of `size` bytes into
/// others: the rate of a float add over two 4 MiB arrays (the best of 3
/// runs, measured_once). What a timing-only step charges for the sum it
/// skips, scaled like any measured time.
[[nodiscard]] inline double add_seconds(long long n, int size) {
  const double seconds_per_byte = measured_once("overlap/add-seconds-per-byte", [] {
    constexpr size_t count = size_t{1} << 20;
    std::vector<float> x(count, 1.0f), y(count, 2.0f);
    const double best = best_of_3([&] {
      for (size_t i = 0; i < count; ++i) y[i] += x[i];
    });
    volatile float keep = y[count / 2];  // the adds are used
    (void)keep;
    return best / static_cast<double>(count * sizeof(float));
  });
  return seconds_per_byte * static_cast<double>(n) * size;
}

/// Seconds this machine takes to copy `bytes`: the rate of a memcpy between
/// two 64 MiB arrays (beyond the caches, as a shard's copy is; the best of 3
/// runs, measured_once).
[[nodiscard]] inline double copy_seconds(double bytes) {
  const double seconds_per_byte = measured_once("overlap/copy-seconds-per-byte", [] {
    constexpr size_t count = size_t{64} << 20;
    std::vector<std::byte> from(count, std::byte{1}), to(count, std::byte{2});
    const double best = best_of_3([&] { std::memcpy(to.data(), from.data(), count); });
    volatile std::byte keep = to[count / 2];  // the copy is used
    (void)keep;
    return best / static_cast<double>(count);
  });
  return seconds_per_byte * bytes;
}

/// Whether this is one of SMPI's timing-only runs, whose workspaces are
/// garbage shared by every simulated rank. There a local copy or
/// element-wise pass over matrix data is skipped and charged instead (at
/// 1024 ranks of a dp x tp mesh, tp 8, the 65536 x 8192 all-gather, bulk's
/// copy of each rank's 256 MiB shard into the gathered buffer was 95% of
/// the simulation's real time), and bulk's reduce-scatter and all-reduce
/// run the ring's message pattern with its sums charged
/// (timing_reduce_scatter, timing_all_reduce) rather than SimGrid's
/// collectives, which allocate and sum whole buffers on every rank.
[[nodiscard]] inline bool timing_only_buffers() noexcept { return simulated && shared_workspaces(); }

/// Charges a skipped copy of `bytes` to this rank's simulated clock, as
/// SMPI would have charged the copy's real time.
inline void charge_copy(double bytes) {
  untimed_scope charged;
  charge_compute(copy_seconds(bytes));
}

/// Charges a skipped element-wise pass that adds n elements of `size`
/// bytes into others (add_seconds), as SMPI would have charged its real
/// time.
inline void charge_add(long long n, int size) {
  untimed_scope charged;
  charge_compute(add_seconds(n, size));
}

/// A ring collective's buffer: R blocks in rank order, counts[q] elements
/// of `type` each, contiguous from `data`, and the tag of its messages.
struct ring_blocks {
  void* data;         ///< the blocks, one after the other (shared garbage)
  const int* counts;  ///< R counts, in elements
  MPI_Datatype type;  ///< the elements' type
  int tag;            ///< engine::message_tag::timing_ring
};

namespace detail {

/// R - 1 steps of a ring over x's blocks: at step s rank p sends block
/// p - s - lag to rank p + 1, receives block p - s - lag - 1 from rank p - 1
/// into its own copy of that block (no other buffer is as large as every
/// block) and, where `sums`, is charged the add it skips.
inline int ring_pass(const ring_blocks& x, MPI_Comm comm, int lag, bool sums) {
  int R = 1, p = 0, size = 0;
  MPI_Comm_size(comm, &R);
  MPI_Comm_rank(comm, &p);
  MPI_Type_size(x.type, &size);
  std::vector<std::ptrdiff_t> at(static_cast<size_t>(R) + 1, 0);  // block offsets, in bytes
  for (int q = 0; q < R; ++q)
    at[static_cast<size_t>(q) + 1] = at[static_cast<size_t>(q)] + std::ptrdiff_t{x.counts[q]} * size;
  auto* base = static_cast<std::byte*>(x.data);
  const int next = (p + 1) % R, prev = (p + R - 1) % R;
  const auto block = [R](int b) { return ((b % R) + R) % R; };
  int rc = MPI_SUCCESS;
  for (int s = 0; s < R - 1 && rc == MPI_SUCCESS; ++s) {
    const int out = block(p - s - lag), in = block(p - s - lag - 1);
    MPI_Request r[2];
    rc = MPI_Irecv(any_buffer(base + at[static_cast<size_t>(in)]), x.counts[in], x.type, prev, x.tag, comm, &r[0]);
    if (rc == MPI_SUCCESS)
      rc = MPI_Isend(any_buffer(base + at[static_cast<size_t>(out)]), x.counts[out], x.type, next, x.tag, comm, &r[1]);
    if (rc == MPI_SUCCESS) rc = MPI_Waitall(2, r, MPI_STATUSES_IGNORE);
    if (sums) charge_add(x.counts[in], size);
  }
  return rc;
}

}  // namespace detail

/// The ring reduce-scatter's pattern (Open MPI's choice for large blocks):
/// R - 1 steps; at step s rank p sends its partial block p - s - 1 to rank
/// p + 1, receives block p - s - 2 from rank p - 1 and adds it (charged).
/// Rank p ends holding block p. Returns MPI_SUCCESS or the first MPI error.
/// Collective over comm; blocking; the counts must agree across the ranks.
/// Only for buffers whose contents do not matter: nothing is summed, each
/// received block overwrites the buffer's copy, and no result buffer is
/// written.
inline int timing_reduce_scatter(const ring_blocks& x, MPI_Comm comm) { return detail::ring_pass(x, comm, 1, true); }

/// The ring all-gather's pattern: R - 1 steps; at step s rank p sends block
/// p - s to rank p + 1 and receives block p - s - 1 from rank p - 1 in
/// place. As timing_reduce_scatter, for garbage only; nothing is charged.
inline int timing_all_gather(const ring_blocks& x, MPI_Comm comm) { return detail::ring_pass(x, comm, 0, false); }

/// The ring all-reduce's pattern (Open MPI's tuned choice for messages
/// beyond its small-message algorithms, and what SimGrid's ompi selector
/// runs for them): `count` elements in R blocks of count / R (the first
/// count % R one more), timing_reduce_scatter, then timing_all_gather.
/// SimGrid's own MPI_Allreduce allocates buffers of the whole size on every
/// rank and really sums them. As timing_reduce_scatter, for garbage only.
inline int timing_all_reduce(void* data, int count, MPI_Datatype type, int tag, MPI_Comm comm) {
  int R = 1;
  MPI_Comm_size(comm, &R);
  std::vector<int> counts(static_cast<size_t>(R), count / R);
  for (int q = 0; q < count % R; ++q) ++counts[static_cast<size_t>(q)];
  const ring_blocks x{data, counts.data(), type, tag};
  const int rc = timing_reduce_scatter(x, comm);
  return rc == MPI_SUCCESS ? timing_all_gather(x, comm) : rc;
}

}  // namespace overlap::mpi
