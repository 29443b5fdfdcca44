#pragma once
/// @file
/// The shapes, shards and parameters of the tensor-parallel transformer
/// block (layers/transformer.hpp).

#include <cstdint>
#include <string>
#include <vector>

#include "overlap/attention/causal_split.hpp"
#include "overlap/core/matrix.hpp"
#include "overlap/mpi/workspace_allocator.hpp"

namespace overlap::layers {

/// The global sizes of one block: seq tokens of width hidden, `heads`
/// attention heads of width hidden / heads, an MLP of width ffn.
struct block_shape {
  int64_t seq = 2048;     ///< tokens
  int64_t hidden = 1024;  ///< the model's width
  int64_t heads = 16;     ///< attention heads (hidden / heads each)
  int64_t ffn = 4096;     ///< the MLP's width
};

/// How a block's ranks are arranged: `tp` ranks share the tensor-parallel
/// products (the block's context), and `cp` context-parallel shares of the
/// sequence (causal_split over cp ranks; ring attention between them) each
/// have such a group. This rank is `cp_rank` along the cp axis.
struct block_axes {
  int tp = 1;       ///< ranks of the tensor-parallel context
  int cp = 1;       ///< context-parallel shares of the sequence
  int cp_rank = 0;  ///< this rank's share (0 .. cp - 1)
  /// Megatron-style sequence parallelism: between the tensor-parallel
  /// regions each rank holds its own tokens of the share (the ops all-gather
  /// and reduce-scatter). Without it every tp rank holds all of the share's
  /// tokens (the local products need no gather and the row-parallel ones are
  /// all-reduced: matmul_all_reduce).
  bool sequence_parallel = true;
};

/// How one rank's shards sit in the global block. The sequence is first
/// split into axes.cp shares (causal_split: two chunks each, one early and
/// one late); the share's tokens are rows of every tp rank, or, with
/// sequence parallelism, split over them: rank p holds seq_shards.size(p)
/// consecutive rows of the share between the tensor-parallel regions. Rank p
/// holds heads().size(p) heads of attention (columns of Q, K, V, rows of the
/// output projection) and ffn().size(p) columns of the MLP's up projection
/// (rows of its down projection). Balanced: sizes differ by at most one, and
/// may be 0.
struct block_layout {
  block_shape shape;         ///< the global sizes
  block_axes axes;           ///< tp, cp, this rank's share, sequence parallelism
  int rank = 0;              ///< whose shards (along tp) the accessors below describe
  causal_split split{0, 1};  ///< the sequence's shares over the cp axis
  ///@{
  /// How the share's tokens (sequence parallel), heads and MLP columns are
  /// split over the tp ranks.
  shard_layout seq_shards, head_shards, ffn_shards;
  ///@}

  block_layout() = default;
  /// The shards of `ranks` tensor-parallel ranks (sequence parallel, no cp
  /// axis), as rank 0 sees them (on_rank(p) for p).
  block_layout(const block_shape& s, int ranks) : block_layout(s, block_axes{ranks}) {}
  /// The shards of axes.tp ranks in share axes.cp_rank, as rank 0 sees them.
  block_layout(const block_shape& s, const block_axes& a)
      : shape(s),
        axes(a),
        split(s.seq, a.cp),
        seq_shards(shard_layout::balanced(split.rows(a.cp_rank), a.tp)),
        head_shards(shard_layout::balanced(s.heads, a.tp)),
        ffn_shards(shard_layout::balanced(s.ffn, a.tp)) {}
  /// The same layout, seen from tp rank p.
  [[nodiscard]] block_layout on_rank(int p) const {
    block_layout l = *this;
    l.rank = p;
    return l;
  }

  /// The tokens of this rank's share of the sequence: the rows the
  /// tensor-parallel products gather and attention's queries (the whole
  /// sequence without a cp axis).
  [[nodiscard]] int64_t share_rows() const { return split.rows(axes.cp_rank); }
  /// The sequence position of local row i (0 <= i < rows()).
  [[nodiscard]] int64_t token(int64_t i) const {
    return split.position(axes.cp_rank, axes.sequence_parallel ? seq_shards.offset(rank) + i : i);
  }
  /// The width of one head.
  [[nodiscard]] int64_t head_dim() const { return shape.hidden / shape.heads; }
  ///@{
  /// This rank's tokens, attention width (local heads x head_dim) and MLP width.
  [[nodiscard]] int64_t rows() const { return axes.sequence_parallel ? seq_shards.size(rank) : share_rows(); }
  [[nodiscard]] int64_t width() const { return head_shards.size(rank) * head_dim(); }
  [[nodiscard]] int64_t ffn_width() const { return ffn_shards.size(rank); }
  ///@}
  /// Global column (of the hidden x 3*hidden [Wq | Wk | Wv]) of this rank's
  /// column c of its QKV weight (hidden x 3*width(), [Wq_r | Wk_r | Wv_r]).
  [[nodiscard]] int64_t qkv_column(int64_t c) const {
    const int64_t w = width(), part = c / w;
    return part * shape.hidden + head_shards.offset(rank) * head_dim() + c % w;
  }
  /// Global row of the hidden x hidden output projection of local row r.
  [[nodiscard]] int64_t out_row(int64_t r) const { return head_shards.offset(rank) * head_dim() + r; }
  /// Global column of this rank's first MLP column.
  [[nodiscard]] int64_t ffn_offset() const { return ffn_shards.offset(rank); }
};

/// One rank's parameters (or their gradients) of a block, row-major.
/// Replicated on every rank: the layer norms' gains and shifts, bo and b2
/// (their gradients are summed over the ranks). Sharded: wqkv (hidden x
/// 3*width), bqkv (3*width), wo (width x hidden), w1 (hidden x ffn_width),
/// b1 (ffn_width), w2 (ffn_width x hidden).
template <class U>
struct block_params {
  /// One tensor: shared by the simulated ranks in SMPI's timing-only runs
  /// (workspace_vector), as the rest of the block's buffers are.
  using tensor = workspace_vector<U>;
  ///@{
  /// The tensors, named and shaped as above (ln*_g: gain, ln*_b: shift).
  tensor ln1_g, ln1_b, wqkv, bqkv, wo, bo, ln2_g, ln2_b, w1, b1, w2, b2;
  ///@}

  block_params() = default;
  /// Sized (and zeroed) for layout l.
  explicit block_params(const block_layout& l) {
    const auto d = static_cast<size_t>(l.shape.hidden), w = static_cast<size_t>(l.width()),
               f = static_cast<size_t>(l.ffn_width());
    ln1_g.assign(d, U{}), ln1_b.assign(d, U{}), ln2_g.assign(d, U{}), ln2_b.assign(d, U{});
    wqkv.assign(d * 3 * w, U{}), bqkv.assign(3 * w, U{}), wo.assign(w * d, U{}), bo.assign(d, U{});
    w1.assign(d * f, U{}), b1.assign(f, U{}), w2.assign(f * d, U{}), b2.assign(d, U{});
  }
  /// f(name, tensor, replicated) for every tensor, always in this order.
  template <class F>
  void each(F&& f) {
    f("ln1_g", ln1_g, true), f("ln1_b", ln1_b, true), f("wqkv", wqkv, false), f("bqkv", bqkv, false);
    f("wo", wo, false), f("bo", bo, true), f("ln2_g", ln2_g, true), f("ln2_b", ln2_b, true);
    f("w1", w1, false), f("b1", b1, false), f("w2", w2, false), f("b2", b2, true);
  }
  /// The same, read-only.
  template <class F>
  void each(F&& f) const {
    const_cast<block_params*>(this)->each([&](const char* name, const tensor& v, bool r) { f(name, v, r); });
  }
};

/// f(name, value, i, j) for every entry of p, with (i, j) its place in the
/// global tensor: hidden x 3*hidden for wqkv ([Wq | Wk | Wv]), hidden x
/// hidden for wo, hidden x ffn for w1, ffn x hidden for w2; vectors are
/// one row (i = 0). Fills a rank's shards from global values, or compares
/// them with a reference of the whole block.
template <class U, class F>
void visit(block_params<U>& p, const block_layout& l, F&& f) {
  const int64_t d = l.shape.hidden, w = l.width(), fw = l.ffn_width(), fo = l.ffn_offset();
  auto row = [&](const char* name, typename block_params<U>::tensor& v, auto col) {
    for (int64_t j = 0; j < int64_t(v.size()); ++j) f(name, v[size_t(j)], int64_t(0), col(j));
  };
  auto same = [](int64_t j) { return j; };
  row("ln1_g", p.ln1_g, same), row("ln1_b", p.ln1_b, same), row("ln2_g", p.ln2_g, same);
  row("ln2_b", p.ln2_b, same), row("bo", p.bo, same), row("b2", p.b2, same);
  row("bqkv", p.bqkv, [&](int64_t c) { return l.qkv_column(c); });
  row("b1", p.b1, [&](int64_t c) { return fo + c; });
  for (int64_t i = 0; i < d; ++i)
    for (int64_t c = 0; c < 3 * w; ++c) f("wqkv", p.wqkv[size_t(i * 3 * w + c)], i, l.qkv_column(c));
  for (int64_t r = 0; r < w; ++r)
    for (int64_t j = 0; j < d; ++j) f("wo", p.wo[size_t(r * d + j)], l.out_row(r), j);
  for (int64_t i = 0; i < d; ++i)
    for (int64_t c = 0; c < fw; ++c) f("w1", p.w1[size_t(i * fw + c)], i, fo + c);
  for (int64_t r = 0; r < fw; ++r)
    for (int64_t j = 0; j < d; ++j) f("w2", p.w2[size_t(r * d + j)], fo + r, j);
}

}  // namespace overlap::layers
