#pragma once
/// @file
/// A Megatron-style sequence-parallel transformer block, forward and
/// backward, on the ranks of a context (docs/layer.md):
///
///   y1 = LN1(x)                                   local, this rank's tokens
///   [Q|K|V] = AG_rows(y1) @ Wqkv_r + bqkv_r         all_gather_matmul (y1 gathered kept)
///   o = causal softmax attention of the local heads  local
///   a = RS_rows(o @ Wo_r) + bo                     matmul_reduce_scatter
///   h = x + a;  y2 = LN2(h)                         local
///   u = gelu(AG_rows(y2) @ W1_r + b1_r)             all_gather_matmul (y2 gathered kept)
///   out = h + RS_rows(u @ W2_r) + b2                matmul_reduce_scatter
///
/// The backward pass runs through the transposed ops (the gradient of an
/// all-gather matmul is a reduce-scatter matmul and the other way round);
/// the weight gradients use the gathered activations kept by the forward
/// pass, and with a decomposed strategy they are computed while the data
/// gradients' ops run (started ops, or pieces in the ops' waits under
/// SMPI: block_options::weight_gradients_in_waits): dW2's part over this
/// rank's own tokens during the MLP down projection's all-gather of dZ and
/// the rest during the MLP up projection's reduce-scatter, dW1 during the
/// output projection's all-gather, dWo and dWqkv during the QKV
/// reduce-scatter.
///
/// Without sequence parallelism (block_options::sequence_parallel = false)
/// every rank holds all tokens: the AG_rows products are local and the
/// RS_rows ones are matmul_all_reduce. With a context-parallel axis (the
/// two-context constructor) the sequence is split into shares, the ops run
/// within a share and attention is ring attention between the shares.
///
/// It includes the backends (oneDNN, Eigen) for the local products. In the
/// compiled flavour (overlap::compiled) the library holds the block for
/// every element type (src/layers.cpp); header-only, this header includes
/// its implementation.

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "overlap/attention/attention_tiles.hpp"
#include "overlap/attention/ring_attention.hpp"
#include "overlap/attention/softmax_attention.hpp"
#include "overlap/backend/sampled_work.hpp"
#include "overlap/core/bfloat16.hpp"
#include "overlap/core/flavour.hpp"
#include "overlap/engine/side_work.hpp"
#include "overlap/engine/trace.hpp"
#include "overlap/kernels/element_cast.hpp"
#include "overlap/kernels/local_gemm.hpp"
#include "overlap/kernels/local_math.hpp"
#include "overlap/kernels/local_primitives.hpp"
#include "overlap/layers/block_params.hpp"
#include "overlap/layers/phase_span.hpp"
#include "overlap/mpi/communicator.hpp"
#include "overlap/mpi/simulator.hpp"
#include "overlap/mpi/workspace_allocator.hpp"
#include "overlap/ops/all_gather_matmul.hpp"
#include "overlap/ops/matmul_all_reduce.hpp"
#include "overlap/ops/matmul_reduce_scatter.hpp"
#include "overlap/runtime/context.hpp"

namespace overlap::layers {

/// How the block runs its six tensor-parallel products.
struct block_options {
  /// The strategy of every op (bulk: one collective and one GEMM each, the
  /// baseline; ring, bidirectional, automatic: decomposed where chosen).
  overlap::strategy strategy = overlap::strategy::automatic;
  /// Compute the weight gradients while the data gradients' ops run
  /// (started ops). Ignored with strategy bulk, which runs every step
  /// in turn (the baseline). Must agree across ranks.
  bool overlap_weight_gradients = true;
  /// Query rows per block of the causal attention: each block multiplies
  /// only the keys up to its last row. Local; must be positive.
  int64_t attention_block = 256;
  /// Megatron-style sequence parallelism (block_axes::sequence_parallel):
  /// the activations between the tensor-parallel regions are split over the
  /// ranks, and the ops are all_gather_matmul and matmul_reduce_scatter.
  /// false: every rank holds the activations of all tokens, the column-
  /// parallel products are local and the row-parallel ones are
  /// matmul_all_reduce. Must agree across ranks.
  bool sequence_parallel = true;
  /// With overlap_weight_gradients: run the weight gradients in pieces
  /// inside the data gradient op's waits for its transfers, on the caller's
  /// thread (engine/side_work.hpp), rather than beside a started op on the
  /// context's worker thread. The default under SimGrid SMPI, where a
  /// started op runs on the caller's thread and nothing would overlap it.
  /// Must agree across ranks, as overlap_weight_gradients must.
  bool weight_gradients_in_waits = mpi::simulated;
};

/// Which of a block's gradients backward() has finished, in the order it
/// finishes them (block_stack starts their data-parallel sums then).
enum class gradients_ready {
  mlp_down,  ///< w2 and b1 (after the MLP up projection's data gradient)
  mlp_up,    ///< w1 (after the output projection's data gradient)
  all,       ///< the rest: wqkv, bqkv, wo and the replicated ones (summed over tp)
};

/// One block on the ranks of a context. T: float, double or bfloat16 (the
/// type of the ops' operands); the local parts (layer norms, attention,
/// GELU, weight gradients) run in double for double, else in float.
///
/// Collective: the constructor, forward and backward are called by every
/// rank of the context, in the same order, with the same shape and options.
/// Not thread-safe; the context must not be used by others meanwhile.
template <class T>
class transformer_block {
 public:
  using acc = std::conditional_t<std::is_same_v<T, double>, double, float>;  ///< the type local math runs in

  /// Collective. Checks the shape (hidden divisible by heads, every size
  /// positive, the same on every rank) and allocates every buffer; a
  /// failure on any rank throws std::invalid_argument (or std::bad_alloc's
  /// message) on every rank.
  transformer_block(context& ctx, const block_shape& shape, const block_options& opt = {});
  /// Collective over tp and cp: the block with a context-parallel axis. The
  /// sequence is split into cp.size() shares (causal_split); the ranks of tp
  /// hold share cp.rank() and run the tensor-parallel products, and
  /// attention is ring attention between the shares (attention/ring_attention.hpp),
  /// over cp, for this rank's heads. tp and cp must be orthogonal axes of one
  /// mesh (mesh.context("tp"), mesh.context("cp")): every rank of cp has the
  /// same tp rank and size. grads() are then this share's: sum them over
  /// the cp axis (with the data-parallel sum) for the whole sequence's.
  /// Errors as above, on every rank of tp x cp.
  transformer_block(context& tp, context& cp, const block_shape& shape, const block_options& opt = {});

  /// Where this rank's shards sit in the global block.
  [[nodiscard]] const block_layout& layout() const noexcept { return l_; }
  /// This rank's parameters (set them before forward).
  [[nodiscard]] block_params<T>& params() noexcept { return w_; }
  /// This rank's gradients after backward. Replicated ones are summed over
  /// the tp ranks when sequence parallel (each rank saw its own tokens);
  /// without, every tp rank computes them whole. With a cp axis, this
  /// share's part (see the constructor).
  [[nodiscard]] const block_params<acc>& grads() const noexcept { return g_; }

  /// Collective. out = block(x) for this rank's tokens: x and out are
  /// layout().rows() x hidden (row-major, ld >= hidden; row i is token
  /// layout().token(i)); without sequence parallelism every tp rank passes
  /// the same x. Keeps what the backward pass needs.
  void forward(matrix_view<const T> x, matrix_view<T> out);
  /// Collective, after forward: dx = d(loss)/dx and grads() for dout =
  /// d(loss)/d(out), both rows() x hidden. Gradients are overwritten.
  void backward(matrix_view<const T> dout, matrix_view<T> dx);
  /// Calls f on the caller's thread as backward() finishes each group of
  /// gradients (gradients_ready), so that the caller can send them on while
  /// the rest of the backward pass computes. f may read grads() of that
  /// group; it must not call the block. Empty: none. Local.
  void on_gradients(std::function<void(gradients_ready)> f) { ready_ = std::move(f); }

 private:
  /// The block's buffers: shared by the simulated ranks in SMPI's
  /// timing-only runs (at 1024 ranks of the default block, 130 GiB
  /// otherwise), ordinary vectors elsewhere.
  template <class U>
  using buf = workspace_vector<U>;
  /// Collective over tp (and cp): checks the shape and options agree,
  /// sizes the buffers.
  void setup(const block_shape& s);
  /// Sizes the layout, parameters, activations and scratch (throws std::bad_alloc).
  void allocate(const block_shape& s);
  /// Collective over tp (and cp): throws std::invalid_argument on every
  /// rank, with the first failing rank's message, unless ok on every rank.
  void agree(bool ok, const std::string& what) const;
  /// The column-parallel product out = y @ w + bias (share rows): an
  /// all-gather matmul keeping the gathered y, or local.
  void project_in(const buf<T>& y, matrix_view<const T> w, const T* bias, buf<T>& out, T* gathered);
  /// The row-parallel product out = sum over tp of in @ w + bias (rows()):
  /// a matmul reduce-scatter or all-reduce.
  void project_out(const buf<T>& in, matrix_view<const T> w, const T* bias, buf<T>& out);
  /// A column-parallel product's data gradient din = dout @ w^T (share
  /// rows), started or blocking; gathered: dout of the share's rows.
  pending gradient_in(bool started, const buf<T>& dout, matrix_view<const T> w, buf<T>& din, T* gathered);
  /// The share's rows of a local activation: its gathered copy when
  /// sequence parallel, else itself.
  [[nodiscard]] const buf<T>& share_of(const buf<T>& local, const buf<T>& gathered) const {
    return opt_.sequence_parallel ? gathered : local;
  }
  /// Ring attention's options for this block (cp axis).
  [[nodiscard]] attention_options ring_options() const;
  void attention_forward();
  void mlp_forward(matrix_view<T> out);
  void mlp_backward();
  /// du_ = d(loss)/d(pre-activation) from du_t_ (GELU's backward), narrowed into du_t_.
  void gelu_backward();
  void attention_backward();
  /// dQKV of the attention (ring over cp, or local), as acc (share rows x 3 width).
  [[nodiscard]] const acc* attention_core_backward();
  void sum_replicated_grads();
  /// y = LN(x) with gain g and bias b; keeps each row's mean and statistic
  /// (the variance on oneDNN, in float; 1 / sqrt(var + eps) in double).
  void norm_forward(const buf<acc>& x, const buf<T>& g, const buf<T>& b, buf<T>& y, buf<acc>& mean, buf<acc>& stat);
  /// dh_ += d(loss)/dx of that layer norm for dy; gg, gb += its parameters' gradients.
  void norm_backward(const buf<acc>& x, const acc* dy, const buf<T>& g, const buf<T>& b, buf<acc>& mean, buf<acc>& stat,
                     buf<acc>& gg, buf<acc>& gb);
  /// The shapes of this rank's attention (its heads over the whole sequence).
  [[nodiscard]] attention::dims attention_dims() const;
  /// Runs op (its data gradient, started or blocking) and the weight
  /// gradients in `local` beside it, as the options say.
  template <class Op>
  void overlapped(Op&& op, engine::side_work& local);
  /// The extents of a weight gradient: c (m x n) = a^T b over k rows.
  struct gradient_dims {
    int64_t m, n, k;
  };
  /// Adds "c += a^T b" (a: k x m, b: k x n; c: m x n) to work, in pieces
  /// of c's rows, each traced as `name`.
  void weight_gradient(engine::side_work& work, const char* name, gradient_dims dims,
                       const typename local_gemm<acc>::operands& x);
  /// The ops' options: the block's strategy, B transposed or not.
  template <class Options>
  [[nodiscard]] Options options(bool transpose_b) const;
  /// The row-parallel data gradient c = sum over tp of a @ b^T (a
  /// reduce-scatter or all-reduce), started or blocking.
  pending gradient_out(bool started, matrix_view<const T> a, matrix_view<const T> b, matrix_view<T> c);
  /// The attention output o as acc (share rows x width): dWo's operand.
  [[nodiscard]] const acc* attention_output() const;

  context* ctx_;
  context* cp_ = nullptr;   ///< the context-parallel axis, or none
  mpi::communicator comm_;  ///< the layer's own duplicate: checks and gradient sums
  block_options opt_;
  block_layout l_;
  block_params<T> w_;
  block_params<acc> g_;
  local_gemm<acc> gemm_;
  attention::softmax_attention softmax_;  ///< attention in float: oneDNN's softmax over whole rows
  attention::tile_math<acc> tiles_;       ///< attention in double: ring attention's online softmax, on one rank
  local_primitives prims_;                ///< layer norms and GELU on oneDNN (float)
  /// The local work's charge under SMPI (sampled, then charged): the context's sim_compute.
  backend::work_sampler sampler_;
  bool have_forward_ = false;
  std::function<void(gradients_ready)> ready_;  ///< on_gradients's

  // Forward activations (S = seq, n = rows(), d = hidden, w = width(), f = ffn_width()).
  buf<acc> x_, mean1_, stat1_, h_, mean2_, stat2_;  // n x d, n
  buf<T> y1_, y1g_, qkv_t_, o_t_, a_t_, y2_, y2g_, upre_t_, u_t_, z_t_;
  buf<acc> qkv_, o_, lse_, upre_, amax_, asum_;  // qkv_, upre_: widened once (bf16), read again backward
  // Backward scratch.
  buf<acc> dh_, dy_, du_, dqkv_, do_, conv_a_, conv_b_, delta_, packed_;
  buf<acc> dz_;  ///< dout widened (bf16): this rank's rows of dW2's operand, before dZ is gathered
  buf<acc> ln_y_, ln_dx_, ln_g_, ln_b_, ln_dg_, ln_db_;  // the layer norms' float scratch
  buf<T> dz_t_, dzg_t_, du_t_, dy_t_, dh_t_, dhg_t_, do_t_, dqkv_t_;
};

#ifdef OVERLAP_COMPILED
/// Declares the compiled library's instantiation for element type T.
#define OVERLAP_TRANSFORMER_BLOCK(T) extern template class transformer_block<T>;
OVERLAP_FOR_EACH_ELEMENT(OVERLAP_TRANSFORMER_BLOCK)
#undef OVERLAP_TRANSFORMER_BLOCK
#endif

}  // namespace overlap::layers

#ifndef OVERLAP_COMPILED
#include "overlap/layers/transformer-inl.hpp"
#endif
