#pragma once
/// @file
/// The cost model: what one candidate schedule does on the busiest rank
/// (work), and its predicted time from a calibration. Ring: the pieces'
/// GEMMs (slowed by the transfers running meanwhile) against the transfers,
/// plus the piece that nothing overlaps; bulk: the collectives (at the rates
/// measured for them) and the GEMMs one after the other. docs/design.md
/// ("Choosing a schedule") derives it.

#include <algorithm>
#include <cstdint>
#include <vector>

#include "overlap/schedule/calibration.hpp"
#include "overlap/schedule/schedule.hpp"

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
  /// The other-operands algorithm: the first own_gemms (this rank's own
  /// block) run while the input collectives move data, and when the
  /// all-to-all carries the output blocks (alltoall_out) each leaves once
  /// computed, while the next are computed. The gathered operand may travel
  /// in `pieces`, the products of each following its arrival.
  bool pipelined = false;
  bool alltoall_out = false;
  int own_gemms = 1;
  int pieces = 1;
  // Ring.
  bool ring = false;
  int steps = 0;           ///< ring steps (ranks x chunks)
  int transfer_steps = 0;  ///< steps whose pieces arrive from a neighbour
  int lanes = 1;
  double step_bytes = 0;  ///< per lane and step
  gemm_work piece;        ///< per lane and step
  /// After the ring: an all-gather of blocks this large (bytes) that nothing
  /// overlaps (matmul_all_reduce's last group).
  double tail_allgather_block = 0;
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

/// What every ring candidate does per rank: R rounds of `chunks` steps on
/// one lane, or two (bidirectional); every round but the first receives its
/// pieces from a neighbour. The op adds its piece's GEMM and bytes.
inline work ring_work(const candidate& c, int R) {
  work w;
  w.ring = true;
  w.lanes = c.strategy == strategy::bidirectional ? 2 : 1;
  w.steps = R * c.chunks;
  w.transfer_steps = (R - 1) * c.chunks;
  return w;
}

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

/// Predicted seconds of a ring `w` (w.ring) over links `l` with GEMM rates `g`.
inline double predict_ring(const link_rates& l, const gemm_rates& g, const work& w) {
  const double piece = w.lanes * gemm_seconds(g, w.piece);
  const double rate = w.lanes == 2 ? l.bytes_per_s_both : l.bytes_per_s;
  const double compute = w.steps * piece;
  if (w.transfer_steps == 0) return compute;
  const double comm = w.transfer_steps * (l.latency_s + w.step_bytes / rate);
  // GEMMs lose time for every byte the rank sends and receives meanwhile,
  // at most the transfers' own time (the cores cannot spend longer moving
  // the bytes than the transfers last). One piece's product is never
  // overlapped (all-gather: the last one after its transfer;
  // reduce-scatter: the first one before any).
  const double moved = 2.0 * w.transfer_steps * w.lanes * w.step_bytes;
  return std::max(compute + std::min(moved * seconds_per_byte(l), comm), comm + piece);
}

/// The parts of a non-ring schedule, in seconds at the calibrated rates:
/// this rank's own GEMMs, the others, and each collective alone.
struct phase_seconds {
  double own = 0, rest = 0, gather = 0, reduce = 0, alltoall = 0;
};

/// Predicted seconds of an other-operands schedule `w` (w.pipelined) on R
/// ranks, from its phases alone.
inline double predict_others(const link_rates& l, int R, const work& w, const phase_seconds& t) {
  // Bytes each phase moves to and from this rank, while products are computed.
  const double k = seconds_per_byte(l), gathered = 2.0 * (R - 1) * w.allgather_block;
  const double exchanged = 2.0 * w.alltoall_bytes;
  const double inputs = t.gather + (w.alltoall_out ? 0 : t.alltoall);
  const double in_bytes = gathered + (w.alltoall_out ? 0 : exchanged);
  // What the GEMMs lose to the inputs and the outputs (at most their transfer time, as for a ring).
  const double lost_in = std::min(k * in_bytes, inputs), lost_out = std::min(k * exchanged, t.alltoall);
  const double pieces = std::max(w.pieces, 1);
  if (!w.alltoall_out) {
    // The exchange and the gather's first piece travel together; each later
    // piece travels while the products of the one before it are computed
    // (others_runner posts a piece once the one before it arrived), so a
    // piece's products start when it arrived and the ones before it were
    // computed; they lose lost_in / pieces to its transfer. One piece: the
    // inputs, then every product.
    const double per_piece = t.gather / pieces, product = t.rest / pieces, slowed = lost_in / pieces;
    const double start = std::max(per_piece + t.alltoall, t.own + slowed);
    return start + (pieces - 1) * std::max(product + slowed, per_piece) + product + t.reduce;
  }
  // The peers' products of a piece start once it arrived (the first after
  // inputs / pieces), and output blocks leave as they are computed: each
  // after its own product, the last after the last product (with 2 ranks
  // and one piece the only block, so nothing hides its transfer). Both
  // phases use the same links.
  const double blocks = std::max<double>(double(w.gemms.size()) - w.own_gemms, 1);
  const double start = std::max(inputs / pieces, t.own + lost_in / pieces);
  const double slowed = lost_in * (1 - 1 / pieces) + lost_out * (1 - 1 / blocks);
  const double first_block = t.rest / blocks, last_block = t.alltoall / blocks;
  return std::max({start + t.rest + slowed + last_block, start + first_block + t.alltoall,
                   inputs + t.rest / pieces + last_block, inputs + t.alltoall}) +
         t.reduce;
}

/// Predicted seconds of `w` on R ranks over links `l` with GEMM rates `g`.
inline double predict(const link_rates& l, const gemm_rates& g, int R, const work& w) {
  const double hops = R - 1;
  if (w.ring)
    return predict_ring(l, g, w) +
           (R > 1 && w.tail_allgather_block > 0 ? hops * (l.latency_s + w.tail_allgather_block / l.bytes_per_s) : 0);
  phase_seconds t;
  for (size_t i = 0; i < w.gemms.size(); ++i)
    (i < static_cast<size_t>(w.own_gemms) ? t.own : t.rest) += gemm_seconds(g, w.gemms[i]);
  // The collectives at their measured rates where the calibration has them for
  // R ranks, else as R - 1 hops over one link.
  const bool measured = l.collectives.ranks == R;
  auto rate = [&](const collective_rate& c, double bytes) {
    return measured && !c.empty() ? c.at(bytes) : l.bytes_per_s;
  };
  if (R > 1) {
    const collective_rate& ag = w.pipelined ? l.collectives.iallgather : l.collectives.allgather;
    if (w.allgather_block > 0) t.gather = hops * (l.latency_s + w.allgather_block / rate(ag, w.allgather_block));
    if (w.reduce_scatter_block > 0)
      t.reduce =
          hops * (l.latency_s + w.reduce_scatter_block / rate(l.collectives.reduce_scatter, w.reduce_scatter_block));
    if (w.alltoall_bytes > 0)
      t.alltoall = hops * l.latency_s + w.alltoall_bytes / rate(l.collectives.alltoall, w.alltoall_bytes);
  }
  if (w.pipelined) return predict_others(l, R, w, t);
  return t.own + t.rest + t.gather + t.reduce + t.alltoall;
}

}  // namespace overlap::detail
