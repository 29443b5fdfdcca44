#pragma once
/// @file
/// What the two all-to-all ops share (ops/all_to_all_matmul.hpp: dispatch,
/// then the experts' product; ops/matmul_all_to_all.hpp: the experts'
/// product, then combine): a token exchange whose blocks name their peers.
///
/// Rows are grouped by peer q, then by local expert e (expert_counts). The
/// products are always computed on the rows this rank received in dispatch,
/// in that order (recv counts): block (q, e) is multiplied by expert e's
/// weight. What travels is the op's (`travels`, ops/plan.hpp):
/// - travels::input (dispatch): the input's rows go to their expert's rank,
///   and each block is computed once it arrived;
/// - travels::output (combine): each block is computed, then returned to
///   the rank its tokens came from.
///
/// Strategies: bulk runs MPI_Alltoallv and the GEMMs one after the other;
/// pairwise runs the exchange on the ring engine, one distance s per step
/// (rank p sends to p + s and p - s and receives from both: pairwise_peers),
/// each distance's blocks computed while the next distance's travel; automatic prices
/// both plans for the call's counts with the cost model.
///
/// A call is prepared in three collective steps: the common agreement on
/// the cached plan (sizes that stay fixed from call to call: experts and
/// widths), then the call's counts, checked against the peers' (one
/// MPI_Alltoall), and, for automatic, the slowest rank's prices.

#include <mpi.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "overlap/backend/gemm.hpp"
#include "overlap/calibrate/measure.hpp"
#include "overlap/core/matrix.hpp"
#include "overlap/engine/ring.hpp"
#include "overlap/mpi/datatype.hpp"
#include "overlap/ops/call_agreement.hpp"
#include "overlap/ops/checks.hpp"
#include "overlap/ops/choose.hpp"
#include "overlap/ops/expert_counts.hpp"
#include "overlap/ops/op_id.hpp"
#include "overlap/ops/options.hpp"
#include "overlap/ops/pending.hpp"
#include "overlap/ops/plan.hpp"
#include "overlap/ops/run.hpp"
#include "overlap/ops/site.hpp"
#include "overlap/runtime/agreement.hpp"
#include "overlap/runtime/context.hpp"
#include "overlap/schedule/model.hpp"

namespace overlap::detail {

/// One call of an all-to-all op in the exchange's terms.
template <class T>
struct exchange_args {
  matrix_view<const T> in;  ///< the rows this rank holds (dispatch: by send counts; combine: by recv counts)
  /// The local experts' weights, stacked: expert e's k x n weight is rows
  /// [e * k, (e + 1) * k) (k = in.cols, n = out.cols), or with transpose_w
  /// its n x k transpose is rows [e * n, (e + 1) * n).
  matrix_view<const T> w;
  matrix_view<T> out;    ///< the products' rows (dispatch: by recv counts; combine: by send counts)
  matrix_view<T> moved;  ///< dispatch: where the received rows land, when has_moved
  bool has_moved = false;
  const expert_counts* counts = nullptr;
  bool transpose_w = false;
};

/// What an all-to-all op tells the shared code about itself, as a traits
/// type `Op` (its file defines it): `id` (op_info<id> holds its names and
/// tags), `what` (what travels), and how messages name its views
/// (`in_name`, `out_name`).

/// What the ranks exchange on a plan miss: the sizes that stay fixed from
/// call to call (the rows change with every routing and are checked per
/// call).
struct exchange_row {
  int64_t experts, k, n, strategy, phases, automatic;
  static constexpr std::array<agreed_field<exchange_row>, 6> agreed{{
      {"expert_counts.experts", &exchange_row::experts, field_scope::plain},
      {"the width of the input (its cols)", &exchange_row::k, field_scope::plain},
      {"the width of the output (its cols)", &exchange_row::n, field_scope::plain},
      {"strategy", &exchange_row::strategy},
      {"phases", &exchange_row::phases, field_scope::setting},
      {"automatic", &exchange_row::automatic, field_scope::setting},
  }};
  static constexpr std::array<agreed_field<exchange_row>, 0> more_agreed{};
};

/// Rows of width `cols`, `ld` apart, as MPI moves them: `cols` values of
/// the base type per row where the rows are dense (one contiguous message),
/// else one row of a derived type (resized to the leading dimension).
class row_layout {
 public:
  row_layout() = default;
  row_layout(int64_t cols, int64_t ld, MPI_Datatype base) : per_row_(cols), base_(base) {
    if (ld == cols) return;
    MPI_Datatype row = MPI_DATATYPE_NULL, resized = MPI_DATATYPE_NULL;
    OVERLAP_MPI(MPI_Type_contiguous, mpi::detail::to_count(cols, "row length"), base, &row);
    const mpi::datatype owned_row(row);
    int size = 0;
    OVERLAP_MPI(MPI_Type_size, base, &size);
    OVERLAP_MPI(MPI_Type_create_resized, row, 0, static_cast<MPI_Aint>(ld) * size, &resized);
    type_ = mpi::datatype(resized);
    OVERLAP_MPI(MPI_Type_commit, &resized);
    per_row_ = 1;
  }
  [[nodiscard]] MPI_Datatype type() const { return type_.get() != MPI_DATATYPE_NULL ? type_.get() : base_; }
  /// The count of type() that carries `rows` rows (checked against MPI's int).
  [[nodiscard]] int count(int64_t rows) const { return mpi::detail::to_count(rows * per_row_, "message elements"); }

 private:
  int64_t per_row_ = 0;
  MPI_Datatype base_ = MPI_DATATYPE_NULL;
  mpi::datatype type_;
};

/// The offsets of one call's blocks: by peer (sum over the peer's experts)
/// and by (peer, expert), for both sides of the counts.
struct block_offsets {
  int ranks = 1, experts = 1;
  std::vector<int64_t> send, recv;  ///< R * E + 1 prefix sums of the counts
  void set(const expert_counts& c, int R) {
    ranks = R, experts = c.experts;
    auto prefix = [](const std::vector<int64_t>& v, std::vector<int64_t>& out) {
      out.assign(v.size() + 1, 0);
      for (size_t i = 0; i < v.size(); ++i) out[i + 1] = out[i] + v[i];
    };
    prefix(c.send, send);
    prefix(c.recv, recv);
  }
  /// The first row of peer q's block, and its rows, on one side.
  [[nodiscard]] static int64_t at(const std::vector<int64_t>& side, int q, int E) {
    return side[size_t(q) * size_t(E)];
  }
  [[nodiscard]] static int64_t rows(const std::vector<int64_t>& side, int q, int E) {
    return side[size_t(q + 1) * size_t(E)] - side[size_t(q) * size_t(E)];
  }
};

/// A plan of an all-to-all op: what stays fixed across calls (sizes, the
/// datatypes of rows, the cost model's rates, the kernels by shape) and
/// what one call sets (its offsets and its schedule).
template <class T>
struct exchange_plan final : plan_base {
  int ranks = 1, rank = 0, experts = 1;
  int64_t k = 0, n = 0;
  bool transpose_w = false;
  overlap::strategy asked = overlap::strategy::automatic;
  bool automatic_is_bulk = true;
  std::optional<link_rates> links;  ///< automatic's model inputs (none: automatic is bulk)
  std::optional<gemm_rates> gemms;
  row_layout in_rows, out_rows, moved_rows, staged_rows;
  std::vector<T> moved, staged;  ///< the received rows (dispatch, without moved), the products that leave (combine)
  /// Kernels by (m, lda, ldc): a routing's counts vary, so shapes do; kept
  /// up to kernel_bound (then dropped together: the backend caches its own).
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::shared_ptr<const gemm_kernel>> kernels;
  static constexpr size_t kernel_bound = 1024;
  // The call in flight.
  block_offsets off;
  std::vector<int64_t> theirs;  ///< the peers' send counts for this rank
  overlap::strategy runs = overlap::strategy::bulk;
};

/// C (m x n, ldc) = A (m x k, lda) @ B (k x n), with this plan's kernel for the shape.
template <class T>
void expert_gemm(context& ctx, exchange_plan<T>& plan, int64_t m, const T* a, int64_t lda, const T* b, int64_t ldb,
                 T* c, int64_t ldc) {
  if (m == 0 || plan.n == 0) return;
  gemm_desc d = gemm_desc::shape(m, plan.n, plan.k).strides(lda, ldb, ldc).transposed(false, plan.transpose_w);
  d.types(dtype_of<T>(), dtype_of<T>());
  const gemm_operands io = gemm_operands().a(a).b(b).c(c);
  if (run_degenerate(d, io)) return;
  auto& slot = plan.kernels[{m, lda, ldc}];
  if (!slot) {
    if (plan.kernels.size() > exchange_plan<T>::kernel_bound) {
      plan.kernels.clear();
      return expert_gemm(ctx, plan, m, a, lda, b, ldb, c, ldc);
    }
    slot = make_step_kernel(ctx, d);
  }
  slot->run(io);
}

/// The products of peer q's blocks: block (q, e) of `src` (rows by the
/// recv counts, from row `src_row0` on) times expert e's weight, into
/// `dst` from row `dst_row0` on.
template <class T>
void peer_products(context& ctx, exchange_plan<T>& plan, const exchange_args<T>& x, int q, const T* src, int64_t src_ld,
                   int64_t src_row0, T* dst, int64_t dst_ld, int64_t dst_row0) {
  const int E = plan.experts;
  const int64_t first = plan.off.recv[size_t(q) * size_t(E)];
  for (int e = 0; e < E; ++e) {
    const int64_t r0 = plan.off.recv[size_t(q) * size_t(E) + size_t(e)] - first;
    const int64_t m = plan.off.recv[size_t(q) * size_t(E) + size_t(e) + 1] - first - r0;
    const int64_t w_rows = plan.transpose_w ? plan.n : plan.k;  // rows of one expert's block of w
    expert_gemm(ctx, plan, m, src + (src_row0 + r0) * src_ld, src_ld, x.w.data + int64_t(e) * w_rows * x.w.ld, x.w.ld,
                dst + (dst_row0 + r0) * dst_ld, dst_ld);
  }
}

/// Where dispatch's received rows live: the caller's `moved`, or the plan's.
template <class T>
matrix_view<T> moved_rows(exchange_plan<T>& plan, const exchange_args<T>& x) {
  if (x.has_moved) return x.moved;
  return {plan.moved.data(), plan.off.recv.back(), plan.k, plan.k};
}

/// The peers of a pairwise exchange's step: at distance s, lane 0 sends to
/// rank p + s and receives from p - s, lane 1 the other way, so that both
/// directions of every link of a ring (or torus) carry data at every step;
/// on a switch each rank sends two blocks and receives two. Distances
/// 1 .. R / 2 cover every peer; where p + s is p - s (R even, s = R / 2)
/// lane 1 has nothing to move.
struct pairwise_peers {
  int ranks = 1, rank = 0;
  [[nodiscard]] int distances() const { return ranks / 2; }
  [[nodiscard]] int at(int offset) const { return ((rank + offset) % ranks + ranks) % ranks; }
  /// Whether lane l moves a block at distance s.
  [[nodiscard]] bool active(int s, int l) const { return s >= 1 && s <= distances() && (l == 0 || 2 * s != ranks); }
  [[nodiscard]] int to(int s, int l) const { return at(l == 0 ? s : -s); }
  [[nodiscard]] int from(int s, int l) const { return at(l == 0 ? -s : s); }
};

/// The pairwise exchange on the ring engine (engine/ring.hpp): 1 + R / 2
/// steps, every transfer naming its peer (pairwise_peers: two lanes, one
/// per direction). Dispatch: step 0 computes this rank's own block, read in
/// place; step s computes the blocks from ranks p - s and p + s, whose
/// receives were posted a step ahead, and sends the blocks for distance
/// s + 1. Combine: step t computes the blocks for ranks p + t + 1 and
/// p - t - 1 and sends them at the next step; the last step computes this
/// rank's own, straight into the output, and the returned blocks complete
/// by the end. No buffer is rewritten while it travels (each peer's block
/// has rows of its own), so sends may stay in flight to the end.
template <class T>
class pairwise_pattern {
 public:
  pairwise_pattern(context& ctx, exchange_plan<T>& plan, const exchange_args<T>& x, travels what)
      : ctx_(ctx),
        plan_(plan),
        x_(x),
        what_(what),
        peers_{plan.ranks, plan.rank},
        moved_(what == travels::input ? moved_rows(plan, x) : matrix_view<T>{}) {}
  [[nodiscard]] int steps() const { return 1 + peers_.distances(); }
  [[nodiscard]] engine::ring_window window() const { return {1, steps()}; }
  [[nodiscard]] engine::transfer recv(int u, int lane) const {
    if (!peers_.active(u, lane)) return {};
    const int q = peers_.from(u, lane), E = plan_.experts;
    if (what_ == travels::input) {
      const int64_t rows = block_offsets::rows(plan_.off.recv, q, E);
      if (rows == 0) return {};
      return {moved_.data + block_offsets::at(plan_.off.recv, q, E) * moved_.ld, plan_.moved_rows.type(),
              plan_.moved_rows.count(rows), q};
    }
    const int64_t rows = block_offsets::rows(plan_.off.send, q, E);
    if (rows == 0) return {};
    // Nothing computes on a returned block: it completes by the end.
    return {x_.out.data + block_offsets::at(plan_.off.send, q, E) * x_.out.ld, plan_.out_rows.type(),
            plan_.out_rows.count(rows), q, steps()};
  }
  // (t, lane): the engine's pattern interface (engine/ring.hpp).
  [[nodiscard]] engine::transfer send(int t, int lane) {  // NOLINT(bugprone-easily-swappable-parameters)
    const int E = plan_.experts;
    // Dispatch sends what the peer computes at step t + 1; combine what this rank computed at step t - 1.
    const int s = what_ == travels::input ? t + 1 : t;
    if (!peers_.active(s, lane)) return {};
    const int q = peers_.to(s, lane);
    if (what_ == travels::input) {
      const int64_t rows = block_offsets::rows(plan_.off.send, q, E);
      if (rows == 0) return {};
      return {const_cast<T*>(x_.in.data) + block_offsets::at(plan_.off.send, q, E) * x_.in.ld, plan_.in_rows.type(),
              plan_.in_rows.count(rows), q};
    }
    const int64_t rows = block_offsets::rows(plan_.off.recv, q, E);
    if (rows == 0) return {};
    return {plan_.staged.data() + block_offsets::at(plan_.off.recv, q, E) * plan_.n, plan_.staged_rows.type(),
            plan_.staged_rows.count(rows), q};
  }
  void compute(int t) {
    const int E = plan_.experts, p = plan_.rank;
    const bool own = what_ == travels::input ? t == 0 : t == steps() - 1;
    if (own) {
      // This rank's own block is read where it is (dispatch: in x, whose copy goes to the caller's moved).
      const int64_t sent_at = block_offsets::at(plan_.off.send, p, E),
                    recv_at = block_offsets::at(plan_.off.recv, p, E);
      const int64_t in_at = what_ == travels::input ? sent_at : recv_at;
      const int64_t out_at = what_ == travels::input ? recv_at : sent_at;
      const int64_t own_rows = block_offsets::rows(plan_.off.send, p, E);
      if (what_ == travels::input && x_.has_moved)
        copy_rows(x_.in.block(sent_at, 0, own_rows, x_.in.cols), moved_.block(recv_at, 0, own_rows, moved_.cols));
      peer_products(ctx_, plan_, x_, p, x_.in.data + in_at * x_.in.ld, x_.in.ld, 0, x_.out.data + out_at * x_.out.ld,
                    x_.out.ld, 0);
      return;
    }
    const int s = what_ == travels::input ? t : t + 1;
    for (int l = 0; l < 2; ++l) {
      if (!peers_.active(s, l)) continue;
      if (what_ == travels::input) {
        const int q = peers_.from(s, l);
        const int64_t at = block_offsets::at(plan_.off.recv, q, E);
        peer_products(ctx_, plan_, x_, q, static_cast<const T*>(moved_.data), moved_.ld, at, x_.out.data, x_.out.ld,
                      at);
      } else {
        const int q = peers_.to(s, l);
        const int64_t at = block_offsets::at(plan_.off.recv, q, E);
        peer_products(ctx_, plan_, x_, q, x_.in.data, x_.in.ld, at, plan_.staged.data(), plan_.n, at);
      }
    }
  }

  /// src's rows into dst's (the same shape).
  template <class U>
  static void copy_rows(const matrix_view<const U>& src, const matrix_view<U>& dst) {
    for (int64_t i = 0; i < src.rows; ++i)
      std::memcpy(dst.data + i * dst.ld, src.data + i * src.ld, size_t(src.cols) * sizeof(U));
  }

 private:
  context& ctx_;
  exchange_plan<T>& plan_;
  const exchange_args<T>& x_;
  travels what_;
  pairwise_peers peers_;
  matrix_view<T> moved_;
};

/// Alltoallv's counts and displacements (in `layout`'s units) of one side
/// (send or recv, of `o`) of the call's blocks.
struct alltoallv_side {
  std::vector<int> counts, displs;
  void set(const block_offsets& o, const std::vector<int64_t>& side, const row_layout& layout) {
    counts.resize(size_t(o.ranks)), displs.resize(size_t(o.ranks));
    for (int q = 0; q < o.ranks; ++q) {
      counts[size_t(q)] = layout.count(block_offsets::rows(side, q, o.experts));
      displs[size_t(q)] = layout.count(block_offsets::at(side, q, o.experts));
    }
  }
};

/// Bulk: MPI_Alltoallv and the experts' GEMMs, one after the other.
template <class T>
void run_bulk_exchange(context& ctx, exchange_plan<T>& plan, const exchange_args<T>& x, travels what) {
  const int R = plan.ranks, E = plan.experts;
  alltoallv_side out, in;
  auto alltoallv = [&](const void* sbuf, const row_layout& sl, const std::vector<int64_t>& sside, void* rbuf,
                       const row_layout& rl, const std::vector<int64_t>& rside) {
    out.set(plan.off, sside, sl);
    in.set(plan.off, rside, rl);
    const MPI_Datatype st = sl.type(), rt = rl.type();
    void* sb = mpi::any_buffer(const_cast<void*>(sbuf));
    run_collective(
        ctx, plan, "MPI_Alltoallv",
        [&] {
          return MPI_Alltoallv(sb, out.counts.data(), out.displs.data(), st, mpi::any_buffer(rbuf), in.counts.data(),
                               in.displs.data(), rt, ctx.comm());
        },
        [&](MPI_Request* r) {
          return MPI_Ialltoallv(sb, out.counts.data(), out.displs.data(), st, mpi::any_buffer(rbuf), in.counts.data(),
                                in.displs.data(), rt, ctx.comm(), r);
        });
  };
  if (what == travels::input) {
    const matrix_view<T> moved = moved_rows(plan, x);
    alltoallv(x.in.data, plan.in_rows, plan.off.send, moved.data, plan.moved_rows, plan.off.recv);
    run_local_step(ctx, plan, [&] {
      for (int q = 0; q < R; ++q) {
        const int64_t at = block_offsets::at(plan.off.recv, q, E);
        peer_products(ctx, plan, x, q, static_cast<const T*>(moved.data), moved.ld, at, x.out.data, x.out.ld, at);
      }
    });
    return;
  }
  run_local_step(ctx, plan, [&] {
    for (int q = 0; q < R; ++q) {
      const int64_t at = block_offsets::at(plan.off.recv, q, E);
      peer_products(ctx, plan, x, q, x.in.data, x.in.ld, at, plan.staged.data(), plan.n, at);
    }
  });
  alltoallv(plan.staged.data(), plan.staged_rows, plan.off.recv, x.out.data, plan.out_rows, plan.off.send);
}

/// A call's blocks as the cost model reads them on this rank: the
/// products of each peer's block, and the bytes each block moves.
template <class T>
struct exchange_blocks {
  const exchange_plan<T>& plan;
  travels what;
  /// The products of the blocks this rank received from q (one per expert).
  [[nodiscard]] std::vector<gemm_work> products(int q) const {
    const int E = plan.experts;
    std::vector<gemm_work> g;
    g.reserve(size_t(E));
    for (int e = 0; e < E; ++e) {
      const size_t i = size_t(q) * size_t(E) + size_t(e);
      const int64_t m = plan.off.recv[i + 1] - plan.off.recv[i];
      if (m > 0) g.push_back({m, plan.n, plan.k, 1});
    }
    return g;
  }
  /// Bytes this rank sends q and gets from q: dispatch moves the input's
  /// rows out by send counts and in by recv counts, combine the products
  /// the other way.
  [[nodiscard]] double sent(int q) const { return rows(what == travels::input ? plan.off.send : plan.off.recv, q); }
  [[nodiscard]] double got(int q) const { return rows(what == travels::input ? plan.off.recv : plan.off.send, q); }

 private:
  [[nodiscard]] double rows(const std::vector<int64_t>& side, int q) const {
    const int64_t width = what == travels::input ? plan.k : plan.n;
    return double(block_offsets::rows(side, q, plan.experts)) * double(width * int64_t(sizeof(T)));
  }
};

/// Bulk on this rank, as the cost model prices it: the exchange (the most
/// bytes it sends or receives), and the GEMMs, this rank's own block first.
template <class T>
work bulk_exchange_work(const exchange_blocks<T>& b) {
  const int R = b.plan.ranks, p = b.plan.rank;
  work w;
  w.gemms = b.products(p);
  double out = 0, in = 0;
  for (int q = 0; q < R; ++q) {
    if (q == p) continue;
    out += b.sent(q), in += b.got(q);
    for (const gemm_work& g : b.products(q)) w.gemms.push_back(g);
  }
  w.alltoall_bytes = std::max(out, in);
  return w;
}

/// The pairwise steps on this rank, as the cost model prices a ring's
/// (schedule/model.hpp): each step's products (dispatch: the blocks that
/// arrived; combine: the blocks that leave at the next step), and the
/// bytes its transfers move on the two lanes.
template <class T>
work pairwise_exchange_work(const exchange_blocks<T>& b) {
  const pairwise_peers peers{b.plan.ranks, b.plan.rank};
  const bool dispatch = b.what == travels::input;
  work w;
  w.ring = true;
  w.lanes = b.plan.ranks >= 3 ? 2 : 1;
  w.output_moves = !dispatch;
  const int steps = 1 + peers.distances();
  for (int t = 0; t < steps; ++t) {
    ring_step_work st;
    const bool own = dispatch ? t == 0 : t == steps - 1;
    if (own) st.products = b.products(b.plan.rank);
    const int computed = dispatch ? t : t + 1, leaving = dispatch ? t + 1 : t;
    for (int l = 0; l < 2; ++l) {
      if (!own && peers.active(computed, l))
        for (const gemm_work& g : b.products(dispatch ? peers.from(computed, l) : peers.to(computed, l)))
          st.products.push_back(g);
      if (peers.active(leaving, l)) st.moved += b.sent(peers.to(leaving, l));
      if (peers.active(t, l)) {
        const double in = b.got(peers.from(t, l));
        st.recv = std::max(st.recv, in), st.moved += in;
      }
    }
    w.ring_steps.push_back(std::move(st));
  }
  return w;
}

/// The strategy this call runs: a forced one as asked; automatic is bulk
/// where the context allows nothing else (allowed(): one rank, or one node
/// without a calibration), else the simplest of bulk and pairwise that the
/// cost model predicts within its margin of the faster, for this call's
/// counts, at the slowest rank's prices. Collective where it prices.
template <class T>
overlap::strategy choose_exchange(context& ctx, exchange_plan<T>& plan, travels what) {
  if (plan.asked != strategy::automatic) return plan.asked;
  if (plan.automatic_is_bulk) return strategy::bulk;
  std::vector<schedule> options(2);
  options[0].strategy = strategy::bulk, options[1].strategy = strategy::pairwise;
  options[1].chunks = 1;
  predict_slowest(ctx, *plan.links, *plan.gemms, options, [&](const schedule& s) {
    const exchange_blocks<T> b{plan, what};
    return s.strategy == strategy::pairwise ? pairwise_exchange_work(b) : bulk_exchange_work(b);
  });
  const schedule chosen = model_choice(options);
  plan.schedule_words = to_string(chosen);
  return chosen.strategy;
}

/// This rank's checks of an all-to-all call's counts: sized ranks x
/// experts, none negative, and what it sends its own experts is what it
/// receives from itself.
inline void check_counts(const context& ctx, arg_checks& checks, const expert_counts& c) {
  const int R = ctx.size(), E = c.experts;
  const size_t want = size_t(R) * size_t(std::max(E, 0));
  checks.require(E > 0, [&] { return "expert_counts.experts must be positive; got " + std::to_string(E); });
  checks.require(c.send.size() == want && c.recv.size() == want, [&] {
    return "expert_counts.send and .recv must hold ranks x experts = " + std::to_string(R) + " x " + std::to_string(E) +
           " counts; they hold " + std::to_string(c.send.size()) + " and " + std::to_string(c.recv.size());
  });
  if (checks.failed()) return;
  for (size_t i = 0; i < want; ++i)
    checks.require(c.send[i] >= 0 && c.recv[i] >= 0, [&] {
      return "expert_counts entry " + std::to_string(i) + " is negative (send " + std::to_string(c.send[i]) +
             ", recv " + std::to_string(c.recv[i]) + ")";
    });
  for (size_t i = size_t(ctx.rank()) * size_t(E); i < size_t(ctx.rank() + 1) * size_t(E); ++i)
    checks.require(c.send[i] == c.recv[i], [&] {
      return "expert_counts: this rank sends " + std::to_string(c.send[i]) + " rows to its own expert " +
             std::to_string(i % size_t(E)) + " but receives " + std::to_string(c.recv[i]) + " from itself";
    });
}

/// This rank's checks of a call (before any agreement): the options, the
/// views, the counts, and the views' shapes against the counts.
template <class Op, class T>
void check_exchange(const context& ctx, arg_checks& checks, const exchange_args<T>& x, const a2a_options& opt) {
  checks.valid("a2a_options", ".strategy", opt.strategy);
  checks.require(
      opt.strategy == strategy::bulk || opt.strategy == strategy::pairwise || opt.strategy == strategy::automatic, [&] {
        return std::string("a2a_options.strategy must be bulk, pairwise or automatic; got ") + to_string(opt.strategy);
      });
  checks.view(Op::in_name, x.in);
  checks.view("w", x.w);
  checks.view(Op::out_name, x.out);
  if (x.has_moved) checks.view("dispatched_out", x.moved);
  checks.disjoint(Op::out_name, x.out, Op::in_name, x.in);
  checks.disjoint(Op::out_name, x.out, "w", x.w);
  if (x.has_moved) {
    checks.disjoint("dispatched_out", x.moved, Op::in_name, x.in);
    checks.disjoint("dispatched_out", x.moved, "w", x.w);
    checks.disjoint("dispatched_out", x.moved, Op::out_name, x.out);
  }
  if (checks.failed()) return;
  const expert_counts& c = *x.counts;
  check_counts(ctx, checks, c);
  if (checks.failed()) return;
  const bool dispatch = Op::what == travels::input;
  const int64_t in_rows = dispatch ? c.sent_rows() : c.received_rows();
  const int64_t out_rows = dispatch ? c.received_rows() : c.sent_rows();
  const int64_t k = x.in.cols, n = x.out.cols, E = c.experts;
  auto shape = [&](const char* name, const auto& v, int64_t rows, int64_t cols, const char* why) {
    checks.require(v.rows == rows && v.cols == cols, [&] {
      return std::string(name) + " must be " + std::to_string(rows) + " x " + std::to_string(cols) + " (" + why +
             "); got " + std::to_string(v.rows) + " x " + std::to_string(v.cols);
    });
  };
  shape(Op::in_name, x.in, in_rows, k, dispatch ? "the rows the counts send" : "the rows the counts receive");
  if (x.transpose_w)
    shape("w", x.w, E * n, k, "transpose_w: experts stacked, each output width x input width");
  else
    shape("w", x.w, E * k, n, "experts stacked, each input width x output width");
  shape(Op::out_name, x.out, out_rows, n, dispatch ? "the rows the counts receive" : "the rows the counts send");
  if (x.has_moved) shape("dispatched_out", x.moved, out_rows, k, "the rows the counts receive");
}

/// Collective: the call's counts against the peers' (rank q's send counts
/// for this rank must be this rank's recv counts from q). A disagreement
/// raises std::invalid_argument on every rank, naming the lowest rank that
/// saw one; so does `local`, this rank's failure so far.
inline void agree_on_counts(context& ctx, const std::string& op, const expert_counts& c, std::vector<int64_t>& theirs,
                            failure local) {
  const int E = c.experts, R = ctx.size();
  theirs.assign(c.send.size(), 0);
  watched_collective(
      ctx, "MPI_Alltoall",
      [&] { return MPI_Alltoall(c.send.data(), E, MPI_INT64_T, theirs.data(), E, MPI_INT64_T, ctx.comm()); },
      [&](MPI_Request* r) {
        return MPI_Ialltoall(c.send.data(), E, MPI_INT64_T, theirs.data(), E, MPI_INT64_T, ctx.comm(), r);
      },
      [&] { return op + " (comparing the expert counts)"; });
  for (int q = 0; q < R && !local.failed(); ++q)
    for (int e = 0; e < E; ++e) {
      const size_t i = size_t(q) * size_t(E) + size_t(e);
      if (theirs[i] == c.recv[i]) continue;
      local = failure(failure::kind::invalid_argument,
                      "expert_counts disagree: " + ctx.rank_name(q) + " sends " + std::to_string(theirs[i]) +
                          " rows to expert " + std::to_string(e) + " of " + ctx.rank_name(ctx.rank()) +
                          ", whose recv count from it is " + std::to_string(c.recv[i]) +
                          " (exchange_expert_counts makes recv from the send counts)");
      break;
    }
  agree_on(ctx, local, op);
}

/// Collective on a plan miss (every rank missed): the plan of op `Op` for
/// the agreed sizes, its row types (their failure agreed) and, for
/// automatic where the model chooses, the calibration (measured where the
/// context lacks one).
template <class Op, class T>
std::unique_ptr<exchange_plan<T>> build_exchange_plan(context& ctx, const arg_checks& checks, const exchange_args<T>& x,
                                                      const a2a_options& opt, const exchange_row& row,
                                                      uint64_t fingerprint) {
  const dtype t = dtype_of<T>();
  auto built = std::make_unique<exchange_plan<T>>();
  exchange_plan<T>& b = *built;
  b.ranks = ctx.size(), b.rank = ctx.rank(), b.experts = static_cast<int>(row.experts), b.k = row.k, b.n = row.n;
  b.asked = opt.strategy;
  b.transpose_w = x.transpose_w;
  schedule_request req;
  req.strategy = opt.strategy;
  b.automatic_is_bulk = allowed(ctx, req).automatic_is_bulk;
  b.fingerprint = fingerprint;
  b.summary = checks.op() + " " + to_string(t) + " on " + std::to_string(b.ranks) +
              " ranks: " + to_string(opt.strategy) + ", " + std::to_string(b.experts) + " experts per rank, " +
              std::to_string(b.k) + " -> " + std::to_string(b.n);
  b.automatic = opt.strategy == strategy::automatic;
  b.schedule_words = b.automatic && b.automatic_is_bulk
                         ? "bulk (automatic: one rank, or one node without a calibration)"
                         : to_string(opt.strategy);
  if (b.automatic && !b.automatic_is_bulk) {
    calibration& cal = ctx.calibration_to_complete();
    measure_missing(ctx, cal, ctx.links(), t);
    b.links = cal.links.at(ctx.links());
    b.gemms = cal.gemm.at(t);
  }
  const MPI_Datatype base = mpi_type_of(t);
  build_agreed(ctx, checks.op(), [&] {
    b.in_rows = row_layout(b.k, x.in.ld, base);
    b.out_rows = row_layout(b.n, x.out.ld, base);
    b.moved_rows = row_layout(b.k, x.has_moved ? x.moved.ld : b.k, base);
    b.staged_rows = row_layout(b.n, b.n, base);
    return 0;
  });
  return built;
}

/// This call's offsets and the buffers its counts need (they only grow;
/// dispatch's received rows only where the caller gave no dispatched_out:
/// `own_moved`), and its messages' counts against MPI's int: this rank's
/// failure, for the agreement on the counts.
template <class Op, class T>
failure prepare_call_buffers(exchange_plan<T>& plan, const expert_counts& counts, bool own_moved) {
  try {
    plan.off.set(counts, plan.ranks);
    const int64_t received = plan.off.recv.back();
    if (Op::what == travels::input && own_moved && int64_t(plan.moved.size()) < received * plan.k)
      plan.moved.resize(size_t(received * plan.k));
    if (Op::what == travels::output && int64_t(plan.staged.size()) < received * plan.n)
      plan.staged.resize(size_t(received * plan.n));
    for (const row_layout* l : {&plan.in_rows, &plan.out_rows, &plan.moved_rows, &plan.staged_rows})
      (void)l->count(std::max(plan.off.send.back(), received));
  } catch (...) {
    return failure::capture(std::current_exception());
  }
  return {};
}

/// Collective: a call of op `Op` prepared: this rank's checks, the
/// agreement on the cached plan (built on a miss anywhere), the counts
/// agreed with the peers (with the buffers this call's counts need), and
/// the strategy it runs. Bad input on any rank raises
/// std::invalid_argument on every rank before any transfer.
template <class Op, class T>
exchange_plan<T>& prepare_exchange(context& ctx, const exchange_args<T>& x, const a2a_options& opt) {
  const dtype t = dtype_of<T>();
  arg_checks checks(Op::id, op_info<Op::id>::names, t, to_string(opt.strategy));
  check_exchange<Op>(ctx, checks, x, opt);
  const int backend = checked_backend<T>(ctx, checks);
  const exchange_row mine{x.counts->experts,
                          x.in.cols,
                          x.out.cols,
                          static_cast<int64_t>(opt.strategy),
                          static_cast<int64_t>(ctx.config().phases),
                          static_cast<int64_t>(ctx.config().automatic)};
  plan_key& key = ctx.scratch().key;
  key.clear();
  append_values(key, mine);
  // The leading dimensions are this rank's own: its datatypes and kernels.
  key.insert(key.end(), {static_cast<int64_t>(Op::id), static_cast<int64_t>(t), backend, x.in.ld, x.w.ld, x.out.ld,
                         x.has_moved ? x.moved.ld : -1, x.transpose_w ? 1 : 0});
  const agreement<exchange_row> agreed_on = agree_or_exchange(ctx, checks, key, mine);
  auto* plan = static_cast<exchange_plan<T>*>(agreed_on.cached);
  if (plan == nullptr) {
    const plan_key stored = key;  // the scratch is the next call's
    plan = static_cast<exchange_plan<T>*>(
        ctx.store_plan(stored, build_exchange_plan<Op>(ctx, checks, x, opt, mine, agreed_on.fingerprint(Op::id))));
  }
  agree_on_counts(ctx, checks.op(), *x.counts, plan->theirs, prepare_call_buffers<Op>(*plan, *x.counts, !x.has_moved));
  plan->runs = choose_exchange(ctx, *plan, Op::what);
  return *plan;
}

/// Runs a prepared call: the pairwise exchange on the ring engine, or bulk.
template <class Op, class T>
void run_exchange(context& ctx, exchange_plan<T>& plan, const exchange_args<T>& x) {
  if (plan.runs == strategy::pairwise) {
    pairwise_pattern<T> pattern(ctx, plan, x, Op::what);
    run_on_ring(ctx, plan, pattern, op_info<Op::id>::tags, 2);
    return;
  }
  run_bulk_exchange(ctx, plan, x, Op::what);
}

/// The call: prepared and run on this thread. Collective over ctx.
template <class Op, class T>
void exchange_call(context& ctx, const exchange_args<T>& x, const a2a_options& opt) {
  ctx.check_usable(op_info<Op::id>::names.call);
  exchange_plan<T>& plan = prepare_exchange<Op>(ctx, x, opt);
  run_exchange<Op>(ctx, plan, x);
}

/// The call, started: prepared here (collective), run as the context's
/// worker's job; the views must stay valid until pending::wait. The counts
/// are read here only.
template <class Op, class T>
pending exchange_start(context& ctx, const exchange_args<T>& x, const a2a_options& opt) {
  const char* name = op_info<Op::id>::names.start;
  ctx.check_usable(name);
  engine::worker& w = ctx.start_worker(name);
  exchange_plan<T>& plan = prepare_exchange<Op>(ctx, x, opt);
  exchange_args<T> y = x;
  y.counts = nullptr;
  w.post([&ctx, &plan, y] { run_exchange<Op>(ctx, plan, y); });
  return pending(&w);
}

}  // namespace overlap::detail
