#pragma once
/// @file
/// The cost model: what one candidate schedule's plan does on one rank
/// (work: its products and transfers, listed from the plan built dry,
/// ops/pipeline.hpp `priced`), and its predicted time from a calibration.
/// Ring: the steps' GEMMs (slowed by the transfers running meanwhile)
/// against the transfers, plus the step that nothing overlaps; bulk: the
/// collectives (at the rates measured for them) and the GEMMs one after the
/// other. The ranks take the slowest rank's time (choose.hpp).
/// docs/design.md ("Choosing a schedule") derives it.

#include <algorithm>
#include <cstdint>
#include <vector>

#include "overlap/schedule/calibration.hpp"
#include "overlap/schedule/schedule.hpp"

namespace overlap::detail {

/// A product of the plan: `times` GEMMs of m x n x k (a batch's members).
struct gemm_work {
  int64_t m = 0, n = 0, k = 0;
  int64_t times = 1;
  friend bool operator==(const gemm_work& x, const gemm_work& y) {
    return x.m == y.m && x.n == y.n && x.k == y.k && x.times == y.times;
  }
};

/// One step of a ring plan on this rank: the products it computes (every
/// lane's) and its transfers' bytes.
struct ring_step_work {
  std::vector<gemm_work> products;
  double recv = 0;   ///< bytes the busiest lane receives
  double moved = 0;  ///< bytes sent and received, all lanes together
  friend bool operator==(const ring_step_work& x, const ring_step_work& y) {
    return x.products == y.products && x.recv == y.recv && x.moved == y.moved;
  }
};

/// One candidate's plan on one rank, as the model prices it.
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
  int lanes = 1;
  std::vector<ring_step_work> ring_steps;
  /// The ring moves the output (partial sums leave once computed: the first
  /// step's products are not overlapped), else an input (pieces are
  /// computed once arrived: the last step's are not).
  bool output_moves = false;
  /// After the ring: an all-gather of blocks this large (bytes) that nothing
  /// overlaps (matmul_all_reduce's last group).
  double tail_allgather_block = 0;

  friend bool operator==(const work& x, const work& y) {
    return x.gemms == y.gemms && x.allgather_block == y.allgather_block &&
           x.reduce_scatter_block == y.reduce_scatter_block && x.alltoall_bytes == y.alltoall_bytes &&
           x.pipelined == y.pipelined && x.alltoall_out == y.alltoall_out && x.own_gemms == y.own_gemms &&
           x.pieces == y.pieces && x.ring == y.ring && x.lanes == y.lanes && x.ring_steps == y.ring_steps &&
           x.output_moves == y.output_moves && x.tail_allgather_block == y.tail_allgather_block;
  }
};

/// ceil(a / b) for b > 0.
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// Seconds of a product (all its `times`) at the calibrated rate of its shape.
inline double gemm_seconds(const gemm_rates& g, const gemm_work& w) {
  if (w.m <= 0 || w.n <= 0 || w.k <= 0) return 0;
  return double(w.times) * 2.0 * double(w.m) * double(w.n) * double(w.k) / g.at(w.m, w.n, w.k);
}
inline double gemm_seconds(const gemm_rates& g, const std::vector<gemm_work>& ws) {
  double s = 0;
  for (const gemm_work& w : ws) s += gemm_seconds(g, w);
  return s;
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
  const double rate = w.lanes == 2 ? l.bytes_per_s_both : l.bytes_per_s;
  double compute = 0, comm = 0, moved = 0;
  for (const ring_step_work& st : w.ring_steps) {
    compute += gemm_seconds(g, st.products);
    if (st.recv > 0) comm += l.latency_s + st.recv / rate;
    moved += st.moved;
  }
  if (comm == 0 || w.ring_steps.empty()) return compute;
  // GEMMs lose time for every byte the rank sends and receives meanwhile,
  // at most the transfers' own time (the cores cannot spend longer moving
  // the bytes than the transfers last). One step's products are never
  // overlapped (an input's ring: the last, after its transfer; the
  // output's: the first, before any).
  const double exposed = gemm_seconds(g, (w.output_moves ? w.ring_steps.front() : w.ring_steps.back()).products);
  return std::max(compute + std::min(moved * seconds_per_byte(l), comm), comm + exposed);
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
