#pragma once
/// @file
/// The cost model: what one candidate schedule does on the busiest rank
/// (work), and its predicted time from a calibration. Ring: the pieces'
/// GEMMs (slowed by the transfers running meanwhile) against the transfers,
/// plus the piece that nothing overlaps; bulk: the collectives and the GEMMs
/// one after the other. docs/design.md ("Choosing a schedule") derives it.

#include <algorithm>
#include <cstdint>
#include <vector>

#include "overlap/schedule/calibration.hpp"

namespace overlap::detail {

struct gemm_work {
  int64_t m = 0, n = 0, k = 0;
};

/// One candidate's work on the busiest rank.
struct work {
  // Bulk: collectives and local GEMMs, one after the other.
  std::vector<gemm_work> gemms;
  double allgather_block = 0;       ///< bytes of the largest block a rank contributes
  double reduce_scatter_block = 0;  ///< bytes of the largest block a rank gets
  double alltoall_bytes = 0;        ///< the most bytes one rank sends or receives
  /// The other-operands algorithm: gemms[0] (this rank's own block) runs
  /// while the input collectives move data, and when the all-to-all carries
  /// the output blocks (alltoall_out) each leaves once computed, while the
  /// next are computed.
  bool pipelined = false;
  bool alltoall_out = false;
  // Ring.
  bool ring = false;
  int steps = 0;           ///< ring steps (ranks x chunks)
  int transfer_steps = 0;  ///< steps whose pieces arrive from a neighbour
  int lanes = 1;
  double step_bytes = 0;  ///< per lane and step
  gemm_work piece;        ///< per lane and step
};

/// The most elements one rank sends to or receives from the others when rank
/// p sends elems(p, q) to rank q.
template <class F>
double alltoall_max(int R, F&& elems) {
  double most = 0;
  for (int p = 0; p < R; ++p) {
    double out = 0, in = 0;
    for (int q = 0; q < R; ++q)
      if (q != p) out += double(elems(p, q)), in += double(elems(q, p));
    most = std::max({most, out, in});
  }
  return most;
}

/// ceil(a / b) for b > 0.
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// Seconds of one GEMM at the calibrated rate of its shape.
inline double gemm_seconds(const gemm_rates& g, const gemm_work& w) {
  if (w.m <= 0 || w.n <= 0 || w.k <= 0) return 0;
  return 2.0 * double(w.m) * double(w.n) * double(w.k) / g.at(w.m, w.n, w.k);
}

/// The share of the links' both-ways capacity over a GEMM's time that the
/// transfers carry when the slowdown is measured (measure_slowdown).
inline constexpr double slowdown_link_share = 0.5;

/// GEMM seconds lost per byte a rank sends or receives while it computes
/// (the cores also move the data: TCP stacks, shared-memory copies). From the
/// calibration: a GEMM and transfers of slowdown_link_share of the links'
/// capacity over its time (4 streams: both neighbours, both ways, at
/// bytes_per_s_both each), run at once, took gemm_slowdown times the GEMM.
inline double seconds_per_byte(const link_rates& l) {
  if (l.gemm_slowdown <= 1) return 0;
  return (l.gemm_slowdown - 1) / (4 * slowdown_link_share * l.bytes_per_s_both);
}

/// The gemm_slowdown that seconds_per_byte reads as `per_byte` seconds.
inline double slowdown_from_seconds_per_byte(double per_byte, double bytes_per_s_both) {
  return 1 + per_byte * 4 * slowdown_link_share * bytes_per_s_both;
}

/// Predicted seconds of `w` on R ranks over links `l` with GEMM rates `g`.
inline double predict(const link_rates& l, const gemm_rates& g, int R, const work& w) {
  const double hops = R - 1;
  if (w.ring) {
    const double piece = w.lanes * gemm_seconds(g, w.piece);
    const double rate = w.lanes == 2 ? l.bytes_per_s_both : l.bytes_per_s;
    const double compute = w.steps * piece;
    if (w.transfer_steps == 0) return compute;
    const double comm = w.transfer_steps * (l.latency_s + w.step_bytes / rate);
    // GEMMs lose time for every byte the rank sends and receives meanwhile.
    // One piece's product is never overlapped (all-gather: the last one after
    // its transfer; reduce-scatter: the first one before any).
    const double moved = 2.0 * w.transfer_steps * w.lanes * w.step_bytes;
    return std::max(compute + moved * seconds_per_byte(l), comm + piece);
  }
  double own = 0, rest = 0;
  for (size_t i = 0; i < w.gemms.size(); ++i) (i == 0 ? own : rest) += gemm_seconds(g, w.gemms[i]);
  double gather = 0, reduce = 0, alltoall = 0;
  if (R > 1) {
    if (w.allgather_block > 0) gather = hops * (l.latency_s + w.allgather_block / l.bytes_per_s);
    if (w.reduce_scatter_block > 0) reduce = hops * (l.latency_s + w.reduce_scatter_block / l.bytes_per_s);
    if (w.alltoall_bytes > 0) alltoall = hops * l.latency_s + w.alltoall_bytes / l.bytes_per_s;
  }
  if (!w.pipelined) return own + rest + gather + reduce + alltoall;
  // Bytes each phase moves to and from this rank, while products are computed.
  const double k = seconds_per_byte(l), gathered = 2.0 * hops * w.allgather_block, exchanged = 2.0 * w.alltoall_bytes;
  const double inputs = gather + (w.alltoall_out ? 0 : alltoall);
  const double in_bytes = gathered + (w.alltoall_out ? 0 : exchanged);
  // Output blocks leave as they are computed: the first only after its own
  // product (with 2 ranks the only one, so nothing hides its transfer).
  const double first_block = w.gemms.size() > 1 ? rest / double(w.gemms.size() - 1) : 0;
  const double after = w.alltoall_out ? std::max(rest + k * exchanged, first_block + alltoall) : rest;
  return std::max(inputs, own + k * in_bytes) + after + reduce;
}

}  // namespace overlap::detail
