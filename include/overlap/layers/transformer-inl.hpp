#pragma once
/// @file
/// Implementation of layers/transformer.hpp.

#include <algorithm>
#include <exception>
#include <limits>
#include <new>
#include <utility>

#include "overlap/layers/transformer.hpp"
#include "overlap/runtime/agreement.hpp"

namespace overlap::layers {
namespace detail {

/// v's values as tmp's type A: v itself when its type is A, else a converted copy in tmp.
template <class V, class W>
const typename W::value_type* widen(const V& v, W& tmp) {
  using T = typename V::value_type;
  using A = typename W::value_type;
  if constexpr (std::is_same_v<A, T>) {
    return v.data();
  } else {
    tmp.resize(v.size());
    std::transform(v.begin(), v.end(), tmp.begin(), [](T x) { return cast<A>(x); });
    return tmp.data();
  }
}

/// out = v converted to out's element type.
template <class V, class W>
void narrow(const V& v, W& out) {
  using T = typename W::value_type;
  out.resize(v.size());
  std::transform(v.begin(), v.end(), out.begin(), [](auto x) { return cast<T>(x); });
}

/// out[j] += sum over the rows of m.
template <class A, class V>
void add_column_sums(matrix_view<const A> m, V& out) {
  for (int64_t i = 0; i < m.rows; ++i)
    for (int64_t j = 0; j < m.cols; ++j) out[size_t(j)] += m(i, j);
}

template <class V>
bool fits(const V& v, int64_t rows, int64_t cols) {
  return v.rows == rows && v.cols == cols && v.ld >= cols && (rows * cols == 0 || v.data != nullptr);
}
template <class V>
std::string dims(const V& v) {
  return std::to_string(v.rows) + " x " + std::to_string(v.cols) + " (ld " + std::to_string(v.ld) + ")";
}

}  // namespace detail

template <class T>
transformer_block<T>::transformer_block(context& ctx, const block_shape& s, const block_options& opt)
    : ctx_(&ctx), comm_(mpi::communicator::borrow(ctx.comm()).dup()), opt_(opt) {
  setup(s);
}

template <class T>
transformer_block<T>::transformer_block(context& tp, context& cp, const block_shape& s, const block_options& opt)
    : ctx_(&tp), cp_(&cp), comm_(mpi::communicator::borrow(tp.comm()).dup()), opt_(opt) {
  setup(s);
}

template <class T>
void transformer_block<T>::setup(const block_shape& s) {
  sampler_ = backend::work_sampler(ctx_->config().sim, ctx_->config().sim_samples);
  const bool valid = s.seq > 0 && s.hidden > 0 && s.heads > 0 && s.ffn > 0 && s.hidden % s.heads == 0;
  agree(opt_.attention_block > 0, "attention_block must be positive; got " + std::to_string(opt_.attention_block));
  agree(valid, "the shape needs seq, hidden, heads, ffn > 0 and hidden divisible by heads; got seq " +
                   std::to_string(s.seq) + ", hidden " + std::to_string(s.hidden) + ", heads " +
                   std::to_string(s.heads) + ", ffn " + std::to_string(s.ffn));
  // What must agree: the shape and the mode on every rank, and along cp the
  // tp rank and size (the shares' tp groups line up).
  // The weight gradients' mode too: a started op's first call agrees on the
  // context's worker, a collective that blocking calls do not make.
  const std::vector<int64_t> mine{s.seq,
                                  s.hidden,
                                  s.heads,
                                  s.ffn,
                                  opt_.sequence_parallel ? 1 : 0,
                                  opt_.overlap_weight_gradients ? 1 : 0,
                                  opt_.weight_gradients_in_waits ? 1 : 0};
  const char* who = "overlap::layers::transformer_block";
  bool same = overlap::detail::same_everywhere(*ctx_, mine, who);
  if (cp_ != nullptr) {
    std::vector<int64_t> along_cp = mine;
    along_cp.insert(along_cp.end(), {ctx_->size(), ctx_->rank()});
    same = overlap::detail::same_everywhere(*cp_, along_cp, who) && same;
  }
  agree(same,
        "the ranks give different shapes or modes (seq, hidden, heads, ffn, sequence_parallel, "
        "overlap_weight_gradients and weight_gradients_in_waits must agree, "
        "and the cp context's ranks must have the same tp rank and size)");
  std::string what;
  try {
    allocate(s);
  } catch (const std::bad_alloc&) {
    what = "cannot allocate the block's activations and scratch (std::bad_alloc)";
  }
  agree(what.empty(), what);
}

template <class T>
void transformer_block<T>::allocate(const block_shape& s) {
  const int cp = cp_ != nullptr ? cp_->size() : 1, cp_rank = cp_ != nullptr ? cp_->rank() : 0;
  l_ = block_layout(s, block_axes{ctx_->size(), cp, cp_rank, opt_.sequence_parallel}).on_rank(ctx_->rank());
  w_ = block_params<T>(l_);
  g_ = block_params<acc>(l_);
  const auto n = size_t(l_.rows()), d = size_t(s.hidden), S = size_t(l_.share_rows()), w = size_t(l_.width()),
             f = size_t(l_.ffn_width()), hr = size_t(l_.head_shards.size(l_.rank));
  for (auto* v : {&x_, &h_, &dh_}) v->resize(n * d);
  for (auto* v : {&mean1_, &stat1_, &mean2_, &stat2_}) v->resize(n);
  for (auto* v : {&y1_, &a_t_, &y2_, &z_t_, &dz_t_, &dy_t_, &dh_t_}) v->resize(n * d);
  if (opt_.sequence_parallel)  // else the share's rows are the local ones (share_of)
    for (auto* v : {&y1g_, &y2g_, &dzg_t_, &dhg_t_}) v->resize(S * d);
  for (auto* v : {&qkv_t_, &dqkv_t_}) v->resize(S * 3 * w);
  for (auto* v : {&o_t_, &do_t_}) v->resize(S * w);
  for (auto* v : {&upre_t_, &u_t_, &du_t_}) v->resize(S * f);
  du_.resize(S * f);
  // The acc copies only where something reads them: at seq 2048, hidden 1024
  // and tp 2 the unread ones of an f32 block came to 36 MiB.
  constexpr bool widened = !std::is_same_v<T, acc>;         // else detail::widen reads the T buffers themselves
  const bool local = cp_ == nullptr;                        // else ring attention reads and writes the T buffers
  const bool tiles = local && std::is_same_v<acc, double>;  // no oneDNN in double: the online softmax's state
  if (widened) {
    qkv_.resize(S * 3 * w), do_.resize(S * w), upre_.resize(S * f), dy_.resize(n * d);
  }
  if (local || widened) o_.resize(S * w), dqkv_.resize(S * 3 * w);
  if (!local || tiles) lse_.resize(hr * S);
  if (tiles)
    for (auto* v : {&amax_, &asum_, &delta_}) v->resize(hr * S);
  for (auto* v : {&conv_a_, &conv_b_}) v->resize(S * std::max({d, f, 3 * w}));
  if constexpr (!std::is_same_v<acc, double>) {
    for (auto* v : {&ln_y_, &ln_dx_}) v->resize(n * d);
    for (auto* v : {&ln_g_, &ln_b_, &ln_dg_, &ln_db_}) v->resize(d);
  }
  size_t replicated = 0;
  g_.each([&](const char*, const buf<acc>& v, bool r) { replicated += r ? v.size() : 0; });
  packed_.resize(replicated);
}

template <class T>
void transformer_block<T>::agree(bool ok, const std::string& what) const {
  using overlap::detail::failure;
  const char* who = "overlap::layers::transformer_block";
  failure mine = ok ? failure() : failure(failure::kind::invalid_argument, what);
  if (cp_ == nullptr) {
    overlap::detail::agree_on(*ctx_, mine, who);
    return;
  }
  // Along tp, then along cp: a failure in one tp group reaches every group,
  // since every cp group holds a rank of each.
  try {
    overlap::detail::agree_on(*ctx_, mine, who);
  } catch (const std::invalid_argument& e) {
    mine = failure(failure::kind::invalid_argument, e.what());
  }
  overlap::detail::agree_on(*cp_, mine, who);
}

template <class T>
template <class Options>
Options transformer_block<T>::options(bool transpose_b) const {
  Options o;  // the defaults: lhs_rows (all-gather), rows (reduce-scatter, all-reduce)
  o.strategy = opt_.strategy;
  o.transpose_b = transpose_b;
  return o;
}

template <class T>
void transformer_block<T>::project_in(const buf<T>& y, matrix_view<const T> w, const T* bias, buf<T>& out,
                                      T* gathered) {
  const int64_t n = l_.rows(), d = l_.shape.hidden, S = l_.share_rows(), cols = w.cols;
  if (!opt_.sequence_parallel) {
    sampler_("local product", {S, cols, d, 0}, [&] {
      gemm_.template run_typed<T>(product::ab, S, cols, d, {y.data(), d, w.data, cols, out.data(), cols, bias});
    });
    return;
  }
  ag_options o = options<ag_options>(false);
  o.epilogue.bias = bias;
  all_gather_matmul<T>(*ctx_, {y.data(), n, d}, w, {out.data(), S, cols}, {gathered, S, d}, o);
}

template <class T>
void transformer_block<T>::project_out(const buf<T>& in, matrix_view<const T> w, const T* bias, buf<T>& out) {
  const int64_t n = l_.rows(), d = l_.shape.hidden, S = l_.share_rows();
  const matrix_view<const T> a{in.data(), S, w.rows};
  const matrix_view<T> c{out.data(), n, d};
  if (!opt_.sequence_parallel) {
    ar_options o = options<ar_options>(false);
    o.epilogue.bias = bias;
    matmul_all_reduce<T>(*ctx_, a, w, c, o);
    return;
  }
  rs_options o = options<rs_options>(false);
  o.epilogue.bias = bias;
  matmul_reduce_scatter<T>(*ctx_, a, w, c, o);
}

template <class T>
pending transformer_block<T>::gradient_in(bool started, const buf<T>& dout, matrix_view<const T> w, buf<T>& din,
                                          T* gathered) {
  const int64_t n = l_.rows(), d = l_.shape.hidden, S = l_.share_rows(), cols = w.rows;
  if (!opt_.sequence_parallel) {  // every rank holds dout's rows: a local product
    sampler_("local product, B transposed", {S, cols, d, 0}, [&] {
      gemm_.template run_typed<T>(product::abt, S, cols, d, {dout.data(), d, w.data, d, din.data(), cols, nullptr});
    });
    return {};
  }
  const matrix_view<const T> a{dout.data(), n, d}, b = w;
  const matrix_view<T> c{din.data(), S, cols}, out{gathered, S, d};
  const ag_options o = options<ag_options>(true);
  if (started) return start_all_gather_matmul<T>(*ctx_, a, b, c, out, o);
  all_gather_matmul<T>(*ctx_, a, b, c, out, o);
  return {};
}

template <class T>
pending transformer_block<T>::gradient_out(bool started, matrix_view<const T> a, matrix_view<const T> b,
                                           matrix_view<T> c) {
  if (!opt_.sequence_parallel) {
    const ar_options o = options<ar_options>(true);
    if (started) return start_matmul_all_reduce<T>(*ctx_, a, b, c, o);
    matmul_all_reduce<T>(*ctx_, a, b, c, o);
    return {};
  }
  const rs_options o = options<rs_options>(true);
  if (started) return start_matmul_reduce_scatter<T>(*ctx_, a, b, c, o);
  matmul_reduce_scatter<T>(*ctx_, a, b, c, o);
  return {};
}

template <class T>
attention_options transformer_block<T>::ring_options() const {
  attention_options o;
  o.heads = l_.head_shards.size(l_.rank);
  o.causal = true;
  o.block = opt_.attention_block;
  // Ring attention has one decomposed schedule: the ring.
  o.strategy = opt_.strategy == strategy::bidirectional ? strategy::ring : opt_.strategy;
  return o;
}

template <class T>
void transformer_block<T>::forward(matrix_view<const T> x, matrix_view<T> out) {
  const int64_t n = l_.rows(), d = l_.shape.hidden;
  agree(detail::fits(x, n, d) && detail::fits(out, n, d), "forward: x and out must be " + std::to_string(n) + " x " +
                                                              std::to_string(d) + " (ld >= hidden); got x " +
                                                              detail::dims(x) + ", out " + detail::dims(out));
  have_forward_ = false;
  engine::trace_recorder* tr = ctx_->tracer();
  const char* const in = opt_.sequence_parallel ? "QKV projection (all-gather matmul)" : "QKV projection (local)";
  const char* const out_proj =
      opt_.sequence_parallel ? "output projection (matmul reduce-scatter)" : "output projection (matmul all-reduce)";
  {
    detail::phase_span ph(tr, "layer norm 1");
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < d; ++j) x_[size_t(i * d + j)] = detail::cast<acc>(x(i, j));
    norm_forward(x_, w_.ln1_g, w_.ln1_b, y1_, mean1_, stat1_);
  }
  {
    detail::phase_span ph(tr, in);
    project_in(y1_, {w_.wqkv.data(), d, 3 * l_.width()}, w_.bqkv.data(), qkv_t_, y1g_.data());
  }
  attention_forward();
  {
    detail::phase_span ph(tr, out_proj);
    project_out(o_t_, {w_.wo.data(), l_.width(), d}, w_.bo.data(), a_t_);
  }
  {
    detail::phase_span ph(tr, "residual, layer norm 2");
    for (size_t i = 0; i < h_.size(); ++i) h_[i] = x_[i] + detail::cast<acc>(a_t_[i]);
    norm_forward(h_, w_.ln2_g, w_.ln2_b, y2_, mean2_, stat2_);
  }
  mlp_forward(out);
  have_forward_ = true;
}

template <class T>
attention::dims transformer_block<T>::attention_dims() const {
  return {l_.head_shards.size(l_.rank), l_.head_dim(), opt_.attention_block};
}

template <class T>
void transformer_block<T>::attention_forward() {
  const attention::dims dd = attention_dims();
  const int64_t S = l_.share_rows(), w = dd.width();
  if (cp_ != nullptr) {
    detail::phase_span ph(ctx_->tracer(), "attention (ring over the cp axis)");
    if (dd.heads > 0) {  // the same on every rank of cp (one tp rank's heads)
      const T* qkv = qkv_t_.data();
      ring_attention<T>(*cp_, {{qkv, S, w, 3 * w}, {qkv + w, S, w, 3 * w}, {qkv + 2 * w, S, w, 3 * w}},
                        {{o_t_.data(), S, w}, {lse_.data(), dd.heads, S}}, ring_options());
    }
    if constexpr (!std::is_same_v<T, acc>) detail::widen(o_t_, o_);  // the weight gradient's operand
    return;
  }
  detail::phase_span ph(ctx_->tracer(), "attention (local heads)");
  sampler_("attention", {dd.heads, dd.dh, S, dd.block}, [&] {
    const acc* qkv = detail::widen(qkv_t_, qkv_);  // kept in qkv_ (bf16) for the backward pass
    if constexpr (std::is_same_v<acc, float>) {
      softmax_.forward(dd, S, {qkv, 3 * w}, {qkv + w, qkv + 2 * w, 3 * w}, o_.data());
    } else {  // no oneDNN in double: ring attention's online softmax, one diagonal tile of the whole sequence
      std::fill(o_.begin(), o_.end(), acc(0));
      std::fill(amax_.begin(), amax_.end(), -std::numeric_limits<acc>::infinity());
      std::fill(asum_.begin(), asum_.end(), acc(0));
      const attention::online_softmax<acc> st{o_.data(), amax_.data(), asum_.data(), S};
      tiles_.forward(dd, {qkv, 3 * w}, {qkv + w, qkv + 2 * w, 3 * w}, {0, S, 0, S, true}, st);
      attention::normalise(dd, st, lse_.data());
    }
    detail::narrow(o_, o_t_);
  });
}

template <class T>
const typename transformer_block<T>::acc* transformer_block<T>::attention_output() const {
  if constexpr (std::is_same_v<T, acc>)
    if (cp_ != nullptr) return o_t_.data();  // ring attention wrote it; o_ is unused
  return o_.data();
}

template <class T>
void transformer_block<T>::mlp_forward(matrix_view<T> out) {
  const int64_t n = l_.rows(), d = l_.shape.hidden;
  engine::trace_recorder* tr = ctx_->tracer();
  {
    detail::phase_span ph(
        tr, opt_.sequence_parallel ? "MLP up projection (all-gather matmul)" : "MLP up projection (local)");
    project_in(y2_, {w_.w1.data(), d, l_.ffn_width()}, w_.b1.data(), upre_t_, y2g_.data());
  }
  {
    detail::phase_span ph(tr, "GELU");
    sampler_("GELU", {int64_t(u_t_.size()), 0, 0, 0}, [&] {
      const acc* pre = detail::widen(upre_t_, upre_);  // kept in upre_ (bf16) for the backward pass
      if constexpr (std::is_same_v<acc, double>) {
        for (size_t i = 0; i < u_t_.size(); ++i) u_t_[i] = math::gelu(pre[i]);
      } else if constexpr (std::is_same_v<T, float>) {
        prims_.gelu(pre, u_t_.data(), int64_t(u_t_.size()));
      } else {
        prims_.gelu(pre, du_.data(), int64_t(u_t_.size()));  // du_ is free until the backward pass
        detail::narrow(du_, u_t_);
      }
    });
  }
  {
    detail::phase_span ph(tr, opt_.sequence_parallel ? "MLP down projection (matmul reduce-scatter)"
                                                     : "MLP down projection (matmul all-reduce)");
    project_out(u_t_, {w_.w2.data(), l_.ffn_width(), d}, w_.b2.data(), z_t_);
  }
  detail::phase_span ph(tr, "residual");
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < d; ++j)
      out(i, j) = detail::cast<T>(acc(h_[size_t(i * d + j)] + detail::cast<acc>(z_t_[size_t(i * d + j)])));
}

template <class T>
template <class Op>
void transformer_block<T>::overlapped(Op&& op, engine::side_work& local) {
  if (opt_.strategy == strategy::bulk || !opt_.overlap_weight_gradients) {
    op(false);
    local.run_rest();
    return;
  }
  if (opt_.weight_gradients_in_waits) {
    {
      engine::filling_waits fill(ctx_->requests(), local);
      (void)op(false);
    }
    local.run_rest();  // what the op's waits left
    return;
  }
  pending started = op(true);
  local.run_rest();  // on an exception, started's destructor waits for the op
  started.wait();
}

template <class T>
void transformer_block<T>::weight_gradient(engine::side_work& work, const char* name, gradient_dims dims,
                                           const typename local_gemm<acc>::operands& x) {
  // Pieces of c's rows (columns of a): each is a GEMM of its own, as
  // efficient as the whole down to a few dozen rows, and short enough that a
  // wait's transfer completing meanwhile is not kept waiting long.
  engine::for_row_runs(dims.m, engine::row_split{}, [&](int64_t first, int64_t rows) {
    work.add([this, name, first, rows, dims, x] {
      detail::phase_span ph(ctx_->tracer(), name);
      // Added: backward zeroed the gradients, and dW2 comes in parts of its sum.
      sampler_("weight gradient", {rows, dims.n, dims.k, 0}, [&] {
        gemm_.run(product::atb, rows, dims.n, dims.k, {x.a + first, x.lda, x.b, x.ldb, x.c + first * x.ldc, x.ldc},
                  into::add);
      });
    });
  });
}

template <class T>
void transformer_block<T>::backward(matrix_view<const T> dout, matrix_view<T> dx) {
  const int64_t n = l_.rows(), d = l_.shape.hidden;
  const bool shapes = detail::fits(dout, n, d) && detail::fits(dx, n, d);
  agree(have_forward_ && shapes, !have_forward_ ? "backward before forward (or after a forward that failed)"
                                                : "backward: dout and dx must be " + std::to_string(n) + " x " +
                                                      std::to_string(d) + " (ld >= hidden); got dout " +
                                                      detail::dims(dout) + ", dx " + detail::dims(dx));
  g_.each([](const char*, buf<acc>& v, bool) { std::fill(v.begin(), v.end(), acc(0)); });
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < d; ++j) {
      dz_t_[size_t(i * d + j)] = dout(i, j);
      dh_[size_t(i * d + j)] = detail::cast<acc>(dout(i, j));
    }
  detail::add_column_sums<acc>({dh_.data(), n, d}, g_.b2);
  mlp_backward();  // dh_ holds dout: the layer norm 2 backward adds to it
  detail::add_column_sums<acc>({dh_.data(), n, d}, g_.bo);
  attention_backward();
  {
    detail::phase_span ph(ctx_->tracer(), "layer norm 1 backward, residual");
    const acc* dy = detail::widen(dy_t_, dy_);
    norm_backward(x_, dy, w_.ln1_g, w_.ln1_b, mean1_, stat1_, g_.ln1_g, g_.ln1_b);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < d; ++j) dx(i, j) = detail::cast<T>(dh_[size_t(i * d + j)]);
  }
  // Without sequence parallelism every rank saw every token of the share:
  // its replicated gradients are already whole.
  if (opt_.sequence_parallel) sum_replicated_grads();
  if (ready_) ready_(gradients_ready::all);
}

template <class T>
void transformer_block<T>::mlp_backward() {
  const int64_t n = l_.rows(), d = l_.shape.hidden, S = l_.share_rows(), f = l_.ffn_width();
  const bool sp = opt_.sequence_parallel;
  engine::trace_recorder* tr = ctx_->tracer();
  // dW2 = u^T dZ over the share's tokens. This rank's own tokens need only
  // its own dZ: their part runs while dZ is gathered, the rest after.
  const acc* u = detail::widen(u_t_, conv_a_);
  const int64_t own = sp ? l_.seq_shards.offset(l_.rank) : 0, mine = sp ? n : 0;
  engine::side_work early;
  if (mine > 0)
    weight_gradient(early, "MLP down weight gradient", {f, d, mine},
                    {u + own * f, f, detail::widen(dz_t_, dz_), d, g_.w2.data(), d});
  auto gather = [&](bool started) {
    detail::phase_span ph(tr, !sp       ? "MLP down backward (local)"
                              : started ? "MLP down backward (started all-gather matmul)"
                                        : "MLP down backward (all-gather matmul)");
    return gradient_in(started && sp, dz_t_, {w_.w2.data(), f, d}, du_t_, dzg_t_.data());
  };
  overlapped(gather, early);
  gelu_backward();
  auto op = [&](bool started) {
    detail::phase_span ph(
        tr, started ? (sp ? "MLP up backward (started matmul reduce-scatter)"
                          : "MLP up backward (started matmul all-reduce)")
                    : (sp ? "MLP up backward (matmul reduce-scatter)" : "MLP up backward (matmul all-reduce)"));
    return gradient_out(started, {du_t_.data(), S, f}, {w_.w1.data(), d, f}, {dy_t_.data(), n, d});
  };
  engine::side_work local;
  const acc* dzg = detail::widen(share_of(dz_t_, dzg_t_), conv_b_);
  for (const auto& [first, rows] : {std::pair{int64_t(0), own}, std::pair{own + mine, S - own - mine}})
    if (rows > 0)
      weight_gradient(local, "MLP down weight gradient", {f, d, rows},
                      {u + first * f, f, dzg + first * d, d, g_.w2.data(), d});
  local.add([this, S, f] { detail::add_column_sums<acc>({du_.data(), S, f}, g_.b1); });
  overlapped(op, local);
  if (ready_) ready_(gradients_ready::mlp_down);
  detail::phase_span ph(tr, "layer norm 2 backward");
  const acc* dy = detail::widen(dy_t_, dy_);
  norm_backward(h_, dy, w_.ln2_g, w_.ln2_b, mean2_, stat2_, g_.ln2_g, g_.ln2_b);
}

template <class T>
void transformer_block<T>::gelu_backward() {
  detail::phase_span ph(ctx_->tracer(), "GELU backward");
  sampler_("GELU backward", {int64_t(du_.size()), 0, 0, 0}, [&] {
    const acc* pre = std::is_same_v<T, acc> ? reinterpret_cast<const acc*>(upre_t_.data()) : upre_.data();
    if constexpr (std::is_same_v<acc, double>) {
      for (size_t i = 0; i < du_.size(); ++i) du_[i] = detail::cast<acc>(du_t_[i]) * math::gelu_grad(pre[i]);
    } else {
      prims_.gelu_backward(pre, detail::widen(du_t_, du_), du_.data(), int64_t(du_.size()));
    }
    detail::narrow(du_, du_t_);  // the pre-activation's gradient, input of the reduce-scatter
  });
}

template <class T>
void transformer_block<T>::attention_backward() {
  const int64_t n = l_.rows(), d = l_.shape.hidden, S = l_.share_rows(), w = l_.width();
  const bool sp = opt_.sequence_parallel;
  engine::trace_recorder* tr = ctx_->tracer();
  detail::narrow(dh_, dh_t_);
  auto gather = [&](bool started) {
    detail::phase_span ph(tr, !sp       ? "output projection backward (local)"
                              : started ? "output projection backward (started all-gather matmul)"
                                        : "output projection backward (all-gather matmul)");
    return gradient_in(started && sp, dh_t_, {w_.wo.data(), w, d}, do_t_, dhg_t_.data());
  };
  {  // the MLP up projection's weight gradient meanwhile
    engine::side_work local;
    const int64_t f = l_.ffn_width();
    const acc* y2g = detail::widen(share_of(y2_, y2g_), conv_a_);
    weight_gradient(local, "MLP up weight gradient", {d, f, S},
                    {y2g, d, du_.data(), f, g_.w1.data(), f});  // dW1 = y2^T dU
    overlapped(gather, local);
  }
  if (ready_) ready_(gradients_ready::mlp_up);
  const acc* dqkv = attention_core_backward();
  auto op = [&](bool started) {
    detail::phase_span ph(
        tr, started ? (sp ? "QKV backward (started matmul reduce-scatter)" : "QKV backward (started matmul all-reduce)")
                    : (sp ? "QKV backward (matmul reduce-scatter)" : "QKV backward (matmul all-reduce)"));
    return gradient_out(started, {dqkv_t_.data(), S, 3 * w}, {w_.wqkv.data(), d, 3 * w}, {dy_t_.data(), n, d});
  };
  engine::side_work local;
  const acc* dhg = detail::widen(share_of(dh_t_, dhg_t_), conv_a_);
  const acc* y1g = detail::widen(share_of(y1_, y1g_), conv_b_);
  weight_gradient(local, "attention weight gradients", {w, d, S},
                  {attention_output(), w, dhg, d, g_.wo.data(), d});  // dWo = o^T dA
  weight_gradient(local, "attention weight gradients", {d, 3 * w, S},
                  {y1g, d, dqkv, 3 * w, g_.wqkv.data(), 3 * w});  // dWqkv = y1^T dQKV
  local.add([this, dqkv, S, w] { detail::add_column_sums<acc>({dqkv, S, 3 * w}, g_.bqkv); });
  overlapped(op, local);
}

template <class T>
const typename transformer_block<T>::acc* transformer_block<T>::attention_core_backward() {
  const int64_t S = l_.share_rows(), w = l_.width();
  engine::trace_recorder* tr = ctx_->tracer();
  if (cp_ != nullptr) {
    detail::phase_span ph(tr, "attention backward (ring over the cp axis)");
    const attention_options ao = ring_options();
    if (ao.heads > 0) {
      const T* qkv = qkv_t_.data();
      T* g = dqkv_t_.data();
      ring_attention_backward<T>(*cp_, {{qkv, S, w, 3 * w}, {qkv + w, S, w, 3 * w}, {qkv + 2 * w, S, w, 3 * w}},
                                 {{o_t_.data(), S, w}, {lse_.data(), ao.heads, S}}, {do_t_.data(), S, w},
                                 {{g, S, w, 3 * w}, {g + w, S, w, 3 * w}, {g + 2 * w, S, w, 3 * w}}, ao);
    }
    return detail::widen(dqkv_t_, dqkv_);
  }
  detail::phase_span ph(tr, "attention backward (local heads)");
  const attention::dims dd = attention_dims();
  sampler_("attention backward", {dd.heads, dd.dh, S, dd.block}, [&] {
    const acc* d_o = detail::widen(do_t_, do_);
    const acc* qkv = std::is_same_v<T, acc> ? reinterpret_cast<const acc*>(qkv_t_.data()) : qkv_.data();  // forward's
    acc* g = dqkv_.data();
    if constexpr (std::is_same_v<acc, float>) {
      softmax_.backward(dd, S, {qkv, 3 * w}, {qkv + w, qkv + 2 * w, 3 * w}, d_o, {g, 3 * w, g + w, g + 2 * w, 3 * w});
    } else {
      attention::softmax_deltas(
          dd, S, d_o, [&](int64_t i, int64_t j) { return o_[size_t(i * w + j)]; }, delta_.data());
      std::fill(dqkv_.begin(), dqkv_.end(), acc(0));
      const attention::backward_rows<acc> in{{qkv, 3 * w}, d_o, lse_.data(), delta_.data(), S};
      tiles_.backward(dd, in, {qkv + w, qkv + 2 * w, 3 * w}, {0, S, 0, S, true}, {g, 3 * w, g + w, g + 2 * w, 3 * w});
    }
    detail::narrow(dqkv_, dqkv_t_);
  });
  return dqkv_.data();
}

template <class T>
void transformer_block<T>::sum_replicated_grads() {
  size_t at = 0;  // into packed_, sized by the constructor: no allocation per step
  g_.each([&](const char*, const buf<acc>& v, bool replicated) {
    if (replicated) at = size_t(std::copy(v.begin(), v.end(), packed_.begin() + long(at)) - packed_.begin());
  });
  const MPI_Datatype type = std::is_same_v<acc, double> ? MPI_DOUBLE : MPI_FLOAT;
  OVERLAP_MPI(MPI_Allreduce, MPI_IN_PLACE, packed_.data(), int(packed_.size()), type, MPI_SUM, comm_.get());
  at = 0;
  g_.each([&](const char*, buf<acc>& v, bool replicated) {
    if (!replicated) return;
    std::copy(packed_.begin() + long(at), packed_.begin() + long(at + v.size()), v.begin());
    at += v.size();
  });
}

template <class T>
void transformer_block<T>::norm_forward(const buf<acc>& x, const buf<T>& g, const buf<T>& b, buf<T>& y, buf<acc>& mean,
                                        buf<acc>& stat) {
  const int64_t n = l_.rows(), d = l_.shape.hidden;
  sampler_("layer norm", {n, d, 0, 0}, [&] {
    if constexpr (std::is_same_v<acc, double>) {
      math::layer_norm<acc, T>({x.data(), n, d}, {g.data(), b.data()}, y.data(), {mean.data(), stat.data()});
    } else {
      const norm_rows r{x.data(), n, d, detail::widen(g, ln_g_), detail::widen(b, ln_b_), mean.data(), stat.data()};
      if constexpr (std::is_same_v<T, float>) {
        prims_.layer_norm(r, y.data());
      } else {
        prims_.layer_norm(r, ln_y_.data());
        detail::narrow(ln_y_, y);
      }
    }
  });
}

template <class T>
void transformer_block<T>::norm_backward(const buf<acc>& x, const acc* dy, const buf<T>& g, const buf<T>& b,
                                         buf<acc>& mean, buf<acc>& stat, buf<acc>& gg, buf<acc>& gb) {
  const int64_t n = l_.rows(), d = l_.shape.hidden;
  sampler_("layer norm backward", {n, d, 0, 0}, [&] {
    if constexpr (std::is_same_v<acc, double>) {
      math::layer_norm_backward<acc, T>({x.data(), n, d}, dy, g.data(), {mean.data(), stat.data()}, dh_.data(),
                                        {gg.data(), gb.data()});
    } else {
      const norm_rows r{x.data(), n, d, detail::widen(g, ln_g_), detail::widen(b, ln_b_), mean.data(), stat.data()};
      prims_.layer_norm_backward(r, dy, ln_dx_.data(), {ln_dg_.data(), ln_db_.data()});
      for (size_t i = 0; i < ln_dx_.size(); ++i) dh_[i] += ln_dx_[i];
      for (size_t j = 0; j < ln_dg_.size(); ++j) gg[j] += ln_dg_[j], gb[j] += ln_db_[j];
    }
  });
}

}  // namespace overlap::layers
