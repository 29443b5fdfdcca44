#pragma once
/// @file
/// Ring attention's backward pass (attention/ring_attention.hpp). K and V
/// travel as in the forward pass; the gradients of each block's keys and
/// values travel one step behind them: a rank adds its share of a block's
/// gradients to what the previous holders collected just before passing
/// them on, and after a full round they reach the block's own rank.
///
/// The message of step t (sent to the previous rank on the ring) is one
/// contiguous run of its slot: the key/value gradients of the block computed
/// at step t - 1 (in A, ending where the slot's K/V region starts) followed
/// by the K/V block of step t (in T). Either part is absent where the ring
/// has none: no gradients at step 0, no K/V from step ranks - 1 on.

#include <vector>

#include "overlap/attention/ring_attention_problem.hpp"
#include "overlap/engine/tags.hpp"
#include "overlap/mpi/timing_only.hpp"

namespace overlap::layers::attention::detail {

/// The key/value gradients of a block of `rows` tokens as they travel:
/// dK then dV, dense, in the type attention computes in.
template <class A>
int64_t dkv_bytes(int64_t rows, int64_t width) {
  return padded(2 * rows * width * int64_t(sizeof(A)));
}

/// What the backward pass allocates once the ranks agreed on the problem.
template <class T>
struct backward_state {
  using A = attention_acc_t<T>;  ///< the type attention computes in
  // Shared by the simulated ranks in SMPI's timing-only runs (workspace_vector).
  workspace_vector<A> q, d_o, lse, delta, dq;  ///< this rank's rows, dense (backward_rows; dq accumulates)
  workspace_vector<A> partial;                 ///< this rank's share of one block's dK, dV
  workspace_vector<A> wide;                    ///< a received block widened to A (bf16 only)
  byte_buffer slots;                           ///< ring: two slots of [gradients | K/V]; bulk: every rank's K/V
  int64_t grad_bytes = 0;                      ///< ring: bytes of a slot's gradient region
  int64_t slot_bytes = 0;                      ///< ring: bytes per slot
  std::vector<int64_t> offsets;                ///< bulk: where rank r's K/V block starts
  workspace_vector<A> all_grads;               ///< bulk: every block's gradients, in rank order

  /// Sizes everything for pb, computes delta, and packs this rank's K and V
  /// where they leave from; called again with a cached plan, it allocates
  /// nothing (the sizes are the same).
  void allocate(const problem& pb, const attention_inputs<T>& in, const attention_saved<T>& fwd,
                matrix_view<const T> d_out) {
    const int64_t n = in.q.rows, w = pb.d.width(), H = pb.d.heads;
    dense_copy(in.q, q);
    dense_copy(d_out, d_o);
    lse.resize(size_t(H * n)), delta.resize(size_t(H * n));
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < n; ++i) lse[size_t(h * n + i)] = fwd.lse(h, i);
    softmax_deltas(
        pb.d, n, d_o.data(), [&](int64_t i, int64_t j) { return widen<A>(fwd.o(i, j)); }, delta.data());
    dq.assign(size_t(n * w), A(0));
    partial.assign(size_t(2 * pb.max_rows() * w), A(0));
    if constexpr (!std::is_same_v<A, T>) wide.resize(size_t(2 * pb.max_rows() * w));  // sized here, not in the ring
    offsets.assign(size_t(pb.ranks) + 1, 0);
    for (int r = 0; r < pb.ranks; ++r) offsets[size_t(r) + 1] = offsets[size_t(r)] + kv_bytes<T>(pb.rows(r), w);
    if (pb.ring) {
      grad_bytes = dkv_bytes<A>(pb.max_rows(), w);
      slot_bytes = grad_bytes + kv_bytes<T>(pb.max_rows(), w);
      slots.resize(2 * slot_bytes);
      pack_kv(in, reinterpret_cast<T*>(slots.at(grad_bytes)));
    } else {
      slots.resize(offsets.back());
      pack_kv(in, reinterpret_cast<T*>(slots.at(offsets[size_t(pb.rank)])));
      all_grads.assign(size_t(2 * pb.split.seq() * w), A(0));
    }
  }

  /// Adds this rank's share of the gradients for rank src's block (at
  /// `at`) to dq and to dkv (dK then dV, dense).
  void fold(const problem& pb, tile_math<A>& math, int src, const void* at, A* dkv) {
    const int64_t w = pb.d.width(), rows = pb.rows(src);
    const kv_block<A> kv = as_acc<A, T>(at, rows, w, wide);
    const backward_rows<A> in{{q.data(), w}, d_o.data(), lse.data(), delta.data(), int64_t(q.size()) / w};
    const tile_grads<A> g{dq.data(), w, dkv, dkv + rows * w, w};
    each_tile(pb, src, [&](const tile& x) { math.backward(pb.d, in, kv, x, g); });
  }
};

/// The ring pattern of the backward pass. Steps 0 .. ranks - 1 compute on
/// block src(t) into `partial`; the send of step t + 1 adds `partial` to the
/// gradients that arrived for that block and passes them on; step ranks + 1
/// receives this rank's own block's gradients, complete. One rank: one step.
template <class T>
struct backward_pattern {
  using A = attention_acc_t<T>;  ///< the type attention computes in
  const problem& pb;             ///< the agreed call
  backward_state<T>& s;          ///< its buffers
  tile_math<A>& math;            ///< the tiles' GEMMs
  const unit& u;                 ///< what messages count

  /// A step per block, one to pass the last gradients on, one to receive this rank's.
  static int step_count(const problem& pb) { return pb.ranks == 1 ? 1 : pb.ranks + 2; }
  [[nodiscard]] int steps() const { return step_count(pb); }
  /// As the forward pass's.
  [[nodiscard]] engine::ring_window window() const { return {1, 0}; }
  /// The slot step t receives into and computes on.
  [[nodiscard]] char* slot(int t) const { return s.slots.at((t % 2) * s.slot_bytes); }
  /// Bytes of the gradients of block src(t) as they travel.
  static int64_t grads_of(const problem& pb, int t) { return dkv_bytes<A>(pb.rows(pb.src(t)), pb.d.width()); }
  /// Which parts a message of step t carries: the gradients of block
  /// src(t - 1), the K/V block src(t).
  struct parts {
    bool grads = false, kv = false;
  };
  /// Received for step t: sent by the next rank at its step t - 1.
  static parts received(const problem& pb, int t) { return {t >= 2, t >= 1 && t <= pb.ranks - 1}; }
  /// Sent at step t.
  static parts sent(const problem& pb, int t) { return {t >= 1 && t <= pb.ranks, t <= pb.ranks - 2}; }
  /// Bytes of step t's message of parts `m`.
  static int64_t message_bytes(const problem& pb, int t, parts m) {
    return (m.grads ? grads_of(pb, t - 1) : 0) + (m.kv ? kv_bytes<T>(pb.rows(pb.src(t)), pb.d.width()) : 0);
  }
  /// Bytes step t receives and sends (the cost model's, pass_work).
  static int64_t received_bytes(const problem& pb, int t) { return message_bytes(pb, t, received(pb, t)); }
  static int64_t sent_bytes(const problem& pb, int t) { return message_bytes(pb, t, sent(pb, t)); }
  /// The message of step t of parts `m`, in its slot.
  [[nodiscard]] engine::transfer message(int t, parts m) const {
    if (!m.grads && !m.kv) return {};
    const int64_t begin = s.grad_bytes - (m.grads ? grads_of(pb, t - 1) : 0);
    return {slot(t) + begin, u.type, u.count(message_bytes(pb, t, m))};
  }
  /// Received for step t (received()).
  [[nodiscard]] engine::transfer recv(int t, int /*lane*/) const { return message(t, received(pb, t)); }
  /// Sent at step t (sent()), after adding this rank's share to the
  /// gradients of block src(t - 1) (the first holder after the block's rank
  /// copies it).
  [[nodiscard]] engine::transfer send(int t, int /*lane*/) {
    const parts m = sent(pb, t);
    if (m.grads) {
      A* to = reinterpret_cast<A*>(slot(t) + s.grad_bytes - grads_of(pb, t - 1));
      const size_t n = size_t(2 * pb.rows(pb.src(t - 1)) * pb.d.width());
      if (t == 1)
        std::copy(s.partial.begin(), s.partial.begin() + long(n), to);
      else
        for (size_t i = 0; i < n; ++i) to[i] += s.partial[i];
    }
    return message(t, m);
  }
  /// Steps 0 .. ranks - 1: this rank's share of block src(t)'s gradients.
  void compute(int t) {
    if (t >= pb.ranks) return;
    const int src = pb.src(t);
    std::fill(s.partial.begin(), s.partial.begin() + long(2 * pb.rows(src) * pb.d.width()), A(0));
    s.fold(pb, math, src, slot(t) + s.grad_bytes, s.partial.data());
  }
  /// This rank's own block's gradients, complete, after the ring.
  [[nodiscard]] const A* own_grads() const {
    if (pb.ranks == 1) return s.partial.data();
    return reinterpret_cast<const A*>(slot(pb.ranks + 1) + s.grad_bytes - grads_of(pb, pb.ranks));
  }
};

/// grads = dq and this rank's keys' and values' gradients (dkv: dK then dV, dense).
template <class T>
void finish_backward(const problem& pb, const backward_state<T>& s, const attention_acc_t<T>* dkv,
                     const attention_grads<T>& g) {
  const int64_t n = g.dq.rows, w = pb.d.width();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < w; ++j) {
      g.dq(i, j) = narrow<T>(s.dq[size_t(i * w + j)]);
      g.dk(i, j) = narrow<T>(dkv[i * w + j]);
      g.dv(i, j) = narrow<T>(dkv[(n + i) * w + j]);
    }
}

/// The backward pass on this rank as the cost model prices it: the ring's
/// steps, or the baseline's gather, products and reduce-scatter (pass_work).
template <class T>
overlap::detail::work backward_work(const problem& pb, bool ring) {
  overlap::detail::work w = pass_work<backward_pattern<T>>(pb, true, ring);
  if (!ring) {
    w.allgather_block = double(kv_bytes<T>(pb.max_rows(), pb.d.width()));
    w.reduce_scatter_block = double(2 * pb.max_rows() * pb.d.width() * int64_t(sizeof(attention_acc_t<T>)));
  }
  return w;
}

/// The baseline's backward pass: gather every K/V block, compute this
/// rank's share of every block's gradients, sum them onto their ranks
/// (MPI_Reduce_scatter into s.partial).
template <class T>
void bulk_backward(context& ctx, const overlap::detail::plan_base& plan, const problem& pb, backward_state<T>& s,
                   tile_math<attention_acc_t<T>>& math) {
  using A = attention_acc_t<T>;
  const int64_t w = pb.d.width();
  std::vector<int> grad_counts(size_t(pb.ranks));
  std::vector<int64_t> grad_at(size_t(pb.ranks) + 1, 0);
  for (int r = 0; r < pb.ranks; ++r) {
    grad_counts[size_t(r)] = mpi::detail::to_count(2 * pb.rows(r) * w, "ring attention gradient block");
    grad_at[size_t(r) + 1] = grad_at[size_t(r)] + 2 * pb.rows(r) * w;
  }
  gather_blocks(ctx, plan, pb, s.offsets, s.slots);
  overlap::detail::run_local_step(ctx, plan, [&] {
    for (int t = 0; t < pb.ranks; ++t) {  // in the ring's order, as the ring computes dq
      const int src = pb.src(t);
      s.fold(pb, math, src, s.slots.at(s.offsets[size_t(src)]), s.all_grads.data() + grad_at[size_t(src)]);
    }
  });
  const MPI_Datatype type = mpi_type_of(dtype_of<A>());
  // Timing only under SMPI (shared buffers of garbage): the collective's ring
  // pattern, its sums charged, not SimGrid's MPI_Reduce_scatter, which
  // allocates every rank's whole input (mpi/timing_only.hpp).
  const bool pattern_only = mpi::timing_only_buffers();
  const mpi::ring_blocks pattern{s.all_grads.data(), grad_counts.data(), type,
                                 engine::tag_value(engine::message_tag::timing_ring)};
  overlap::detail::run_collective(
      ctx, plan, "MPI_Reduce_scatter",
      [&] {
        return pattern_only ? mpi::timing_reduce_scatter(pattern, ctx.comm())
                            : MPI_Reduce_scatter(s.all_grads.data(), s.partial.data(), grad_counts.data(), type,
                                                 MPI_SUM, ctx.comm());
      },
      [&](MPI_Request* r) {
        if (!pattern_only)
          return MPI_Ireduce_scatter(s.all_grads.data(), s.partial.data(), grad_counts.data(), type, MPI_SUM,
                                     ctx.comm(), r);
        *r = MPI_REQUEST_NULL;  // done before the watchdog waits
        return mpi::timing_reduce_scatter(pattern, ctx.comm());
      });
}

}  // namespace overlap::layers::attention::detail

namespace overlap {

template <class T>
void ring_attention_backward(context& ctx, const attention_inputs<T>& in, const attention_saved<T>& fwd,
                             matrix_view<const T> d_o, const attention_grads<T>& grads, const attention_options& opt) {
  using namespace layers::attention;
  using namespace layers::attention::detail;
  using A = attention_acc_t<T>;
  const int64_t n = in.q.rows, w = in.q.cols;
  auto local = [&] {
    std::string why = input_errors(in);
    expect_view(why, "the forward output o", fwd.o, n, w);
    expect_view(why, "the log-sum-exp lse (heads x rows)", fwd.lse, opt.heads, n);
    expect_view(why, "d_o", d_o, n, w);
    expect_view(why, "dq", grads.dq, n, w);
    expect_view(why, "dk", grads.dk, n, w);
    expect_view(why, "dv", grads.dv, n, w);
    expect_apart(why, {{"dq", grads.dq}, {"dk", grads.dk}, {"dv", grads.dv}},
                 {{"q", in.q}, {"k", in.k}, {"v", in.v}, {"o", fwd.o}, {"lse", fwd.lse}, {"d_o", d_o}});
    return why;
  };
  using od_id = overlap::detail::op_id;
  const prepared<backward_state<T>> p = prepare<od_id::ring_attention_backward, T, backward_state<T>>(
      ctx, "backward", row_of(in, opt), opt, local,
      [](const problem& pb, bool ring) { return backward_work<T>(pb, ring); },
      [&](const problem& pb, backward_state<T>& s) { s.allocate(pb, in, fwd, d_o); });
  const problem& pb = p.plan.pb;
  backward_state<T>& s = p.plan.s;
  if (!p.built) s.allocate(pb, in, fwd, d_o);  // this call's inputs, in the cached buffers (nothing allocated)
  tile_math<A> math;
  math.sample_with(backend::work_sampler(ctx.config().sim, ctx.config().sim_samples));
  poll_while_computing(ctx, pb, math);
  const overlap::detail::plan_base& plan = p.plan;
  if (pb.ring) {
    const unit u(s.slot_bytes);
    backward_pattern<T> pattern{pb, s, math, u};
    overlap::detail::run_on_ring(ctx, plan, pattern, overlap::detail::op_info<od_id::ring_attention_backward>::tags, 1);
    finish_backward(pb, s, pattern.own_grads(), grads);
    return;
  }
  bulk_backward(ctx, plan, pb, s, math);
  finish_backward(pb, s, s.partial.data(), grads);
}

}  // namespace overlap
