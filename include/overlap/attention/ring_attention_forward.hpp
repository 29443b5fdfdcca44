#pragma once
/// @file
/// Ring attention's forward pass (attention/ring_attention.hpp): every step
/// folds one rank's K/V block into the online softmax of this rank's
/// queries while the next block arrives.

#include <cmath>
#include <limits>
#include <vector>

#include "overlap/attention/ring_attention_problem.hpp"

namespace overlap::layers::attention::detail {

/// What the forward pass allocates once the ranks agreed on the problem.
template <class T>
struct forward_state {
  using A = attention_acc_t<T>;  ///< the type attention computes in
  // Shared by the simulated ranks in SMPI's timing-only runs (workspace_vector).
  workspace_vector<A> q;            ///< this rank's queries, dense
  workspace_vector<A> o, max, sum;  ///< the online softmax (online_softmax)
  workspace_vector<A> wide;         ///< a received block widened to A (bf16 only)
  byte_buffer slots;                ///< ring: two blocks; bulk: every rank's block
  int64_t slot_bytes = 0;           ///< ring: bytes per slot
  std::vector<int64_t> offsets;     ///< bulk: where rank r's block starts

  /// Sizes everything for pb and packs this rank's K and V where they leave
  /// from; called again with a cached plan, it allocates nothing (the
  /// sizes are the same).
  void allocate(const problem& pb, const attention_inputs<T>& in) {
    const int64_t n = in.q.rows, w = pb.d.width();
    if constexpr (!std::is_same_v<A, T>) wide.resize(size_t(2 * pb.max_rows() * w));  // sized here, not in the ring
    dense_copy(in.q, q);
    o.assign(size_t(n * w), A(0));
    max.assign(size_t(pb.d.heads * n), -std::numeric_limits<A>::infinity());
    sum.assign(size_t(pb.d.heads * n), A(0));
    offsets.assign(size_t(pb.ranks) + 1, 0);
    for (int r = 0; r < pb.ranks; ++r) offsets[size_t(r) + 1] = offsets[size_t(r)] + kv_bytes<T>(pb.rows(r), w);
    slot_bytes = kv_bytes<T>(pb.max_rows(), w);
    slots.resize(pb.ring ? 2 * slot_bytes : offsets.back());
    pack_kv(in, reinterpret_cast<T*>(slots.at(pb.ring ? 0 : offsets[size_t(pb.rank)])));
  }
};

/// The ring pattern of the forward pass (engine::run_ring): step t computes
/// on the block of src(t) in slot t % 2 while it goes on to the previous
/// rank and the next block arrives in the other slot.
template <class T>
struct forward_pattern {
  using A = attention_acc_t<T>;  ///< the type attention computes in
  const problem& pb;             ///< the agreed call
  forward_state<T>& s;           ///< its buffers
  tile_math<A>& math;            ///< the tiles' GEMMs
  const unit& u;                 ///< what messages count

  /// One step per rank's block.
  static int step_count(const problem& pb) { return pb.ranks; }
  [[nodiscard]] int steps() const { return step_count(pb); }
  /// A block is received one step ahead; a send completes before the next step's.
  [[nodiscard]] engine::ring_window window() const { return {1, 0}; }
  /// Bytes of the block of step t.
  static int64_t block_bytes(const problem& pb, int t) { return kv_bytes<T>(pb.rows(pb.src(t)), pb.d.width()); }
  /// Steps 1 .. ranks - 1 receive their block.
  static bool receives(const problem& pb, int t) { return t >= 1 && t < pb.ranks; }
  /// Every block but the last goes on to the previous rank.
  static bool sends(const problem& pb, int t) { return t < pb.ranks - 1; }
  /// Bytes step t receives and sends (the cost model's, pass_work).
  static int64_t received_bytes(const problem& pb, int t) { return receives(pb, t) ? block_bytes(pb, t) : 0; }
  static int64_t sent_bytes(const problem& pb, int t) { return sends(pb, t) ? block_bytes(pb, t) : 0; }
  /// The block of step t, in its slot.
  [[nodiscard]] engine::transfer block(int t) const {
    return {s.slots.at((t % 2) * s.slot_bytes), u.type, u.count(block_bytes(pb, t))};
  }
  /// The block step t receives (receives()).
  [[nodiscard]] engine::transfer recv(int t, int /*lane*/) const {
    return receives(pb, t) ? block(t) : engine::transfer{};
  }
  /// The block step t sends (sends()).
  [[nodiscard]] engine::transfer send(int t, int /*lane*/) const {
    return sends(pb, t) ? block(t) : engine::transfer{};
  }
  /// Folds step t's block into the online softmax.
  void compute(int t) { fold(pb, s, math, pb.src(t), s.slots.at((t % 2) * s.slot_bytes)); }

  /// Folds rank src's block (at `at`) into the online softmax.
  static void fold(const problem& pb, forward_state<T>& s, tile_math<A>& math, int src, const void* at) {
    const kv_block<A> kv = as_acc<A, T>(at, pb.rows(src), pb.d.width(), s.wide);
    const online_softmax<A> st{s.o.data(), s.max.data(), s.sum.data(), int64_t(s.q.size()) / pb.d.width()};
    each_tile(pb, src, [&](const tile& x) { math.forward(pb.d, {s.q.data(), pb.d.width()}, kv, x, st); });
  }
};

/// The forward pass on this rank as the cost model prices it: the ring's
/// steps, or the baseline's gather and products (pass_work).
template <class T>
overlap::detail::work forward_work(const problem& pb, bool ring) {
  overlap::detail::work w = pass_work<forward_pattern<T>>(pb, false, ring);
  if (!ring) w.allgather_block = double(kv_bytes<T>(pb.max_rows(), pb.d.width()));
  return w;
}

/// out = the normalised output and the log-sum-exp of the online softmax.
template <class T>
void finish_forward(const problem& pb, forward_state<T>& s, const attention_outputs<T>& out) {
  using A = attention_acc_t<T>;
  const int64_t n = out.o.rows, w = pb.d.width();
  normalise<A>(pb.d, {s.o.data(), s.max.data(), s.sum.data(), n}, s.max.data());  // lse over max: read, then written
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < w; ++j) out.o(i, j) = narrow<T>(s.o[size_t(i * w + j)]);
  for (int64_t h = 0; h < pb.d.heads; ++h)
    for (int64_t i = 0; i < n; ++i) out.lse(h, i) = s.max[size_t(h * n + i)];
}

}  // namespace overlap::layers::attention::detail

namespace overlap {

template <class T>
void ring_attention(context& ctx, const attention_inputs<T>& in, const attention_outputs<T>& out,
                    const attention_options& opt) {
  using namespace layers::attention;
  using namespace layers::attention::detail;
  using A = attention_acc_t<T>;
  const int64_t n = in.q.rows, w = in.q.cols;
  auto local = [&] {
    std::string why = input_errors(in);
    expect_view(why, "the output o", out.o, n, w);
    expect_view(why, "the log-sum-exp lse (heads x rows)", out.lse, opt.heads, n);
    expect_apart(why, {{"o", out.o}, {"lse", out.lse}}, {{"q", in.q}, {"k", in.k}, {"v", in.v}});
    return why;
  };
  using od_id = overlap::detail::op_id;
  const prepared<forward_state<T>> p = prepare<od_id::ring_attention, T, forward_state<T>>(
      ctx, "forward", row_of(in, opt), opt, local,
      [](const problem& pb, bool ring) { return forward_work<T>(pb, ring); },
      [&](const problem& pb, forward_state<T>& s) { s.allocate(pb, in); });
  const problem& pb = p.plan.pb;
  forward_state<T>& s = p.plan.s;
  if (!p.built) s.allocate(pb, in);  // this call's inputs, in the cached buffers (sized alike: nothing allocated)
  tile_math<A> math;
  math.sample_with(backend::work_sampler(ctx.config().sim, ctx.config().sim_samples));
  poll_while_computing(ctx, pb, math);
  const overlap::detail::plan_base& plan = p.plan;
  if (pb.ring) {
    const unit u(s.slot_bytes);
    forward_pattern<T> pattern{pb, s, math, u};
    overlap::detail::run_on_ring(ctx, plan, pattern, overlap::detail::op_info<od_id::ring_attention>::tags, 1);
  } else {
    gather_blocks(ctx, plan, pb, s.offsets, s.slots);
    overlap::detail::run_local_step(ctx, plan, [&] {
      for (int t = 0; t < pb.ranks; ++t)  // in the ring's order: the same sums, the same bits
        forward_pattern<T>::fold(pb, s, math, pb.src(t), s.slots.at(s.offsets[size_t(pb.src(t))]));
    });
  }
  finish_forward(pb, s, out);
}

}  // namespace overlap
