#pragma once
/// @file
/// Implementation of layers/transformer.hpp.

#include <algorithm>
#include <exception>
#include <limits>
#include <new>
#include <utility>

#include "overlap/layers/transformer.hpp"

namespace overlap::layers {
namespace detail {

template <class To, class From>
To cast(From v) {
  if constexpr (std::is_same_v<To, From>)
    return v;
  else if constexpr (std::is_same_v<To, bfloat16>)
    return bfloat16(static_cast<float>(v));
  else if constexpr (std::is_same_v<From, bfloat16>)
    return static_cast<To>(static_cast<float>(v));
  else
    return static_cast<To>(v);
}

/// v's values as A: v itself when T is A, else a converted copy in tmp.
template <class A, class T>
const A* widen(const std::vector<T>& v, std::vector<A>& tmp) {
  if constexpr (std::is_same_v<A, T>) {
    return v.data();
  } else {
    tmp.resize(v.size());
    std::transform(v.begin(), v.end(), tmp.begin(), [](T x) { return cast<A>(x); });
    return tmp.data();
  }
}

template <class T, class A>
void narrow(const std::vector<A>& v, std::vector<T>& out) {
  out.resize(v.size());
  std::transform(v.begin(), v.end(), out.begin(), [](A x) { return cast<T>(x); });
}

/// out[j] += sum over the rows of m.
template <class A>
void add_column_sums(matrix_view<const A> m, std::vector<A>& out) {
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

/// A phase of the layer on the trace's layer track (nothing when off).
class phase_span {
 public:
  phase_span(engine::trace_recorder* r, const char* name) : r_(r), name_(name), t0_(r ? r->now() : 0) {}
  phase_span(const phase_span&) = delete;
  phase_span& operator=(const phase_span&) = delete;
  ~phase_span() {
    if (r_ == nullptr) return;
    try {
      r_->span(name_, "layer", engine::trace_recorder::track::layer, t0_, r_->now());
    } catch (const std::exception&) {  // a timeline is not worth a crash
    }
  }

 private:
  engine::trace_recorder* r_;
  const char* name_;
  double t0_;
};

}  // namespace detail

template <class T>
transformer_block<T>::transformer_block(context& ctx, const block_shape& s, const block_options& opt)
    : ctx_(&ctx), comm_(mpi::communicator::borrow(ctx.comm()).dup()), opt_(opt) {
  const bool valid = s.seq > 0 && s.hidden > 0 && s.heads > 0 && s.ffn > 0 && s.hidden % s.heads == 0;
  agree(opt.attention_block > 0, "attention_block must be positive; got " + std::to_string(opt.attention_block));
  agree(valid, "the shape needs seq, hidden, heads, ffn > 0 and hidden divisible by heads; got seq " +
                   std::to_string(s.seq) + ", hidden " + std::to_string(s.hidden) + ", heads " +
                   std::to_string(s.heads) + ", ffn " + std::to_string(s.ffn));
  int64_t mine[4] = {s.seq, s.hidden, s.heads, s.ffn}, lo[4], hi[4];
  OVERLAP_MPI(MPI_Allreduce, mine, lo, 4, MPI_INT64_T, MPI_MIN, comm_.get());
  OVERLAP_MPI(MPI_Allreduce, mine, hi, 4, MPI_INT64_T, MPI_MAX, comm_.get());
  if (!std::equal(lo, lo + 4, hi))
    throw std::invalid_argument(
        "overlap::layers::transformer_block: the ranks give different shapes (seq, hidden, "
        "heads, ffn must agree)");
  std::string what;
  try {
    l_ = block_layout(s, ctx.size()).on_rank(ctx.rank());
    w_ = block_params<T>(l_);
    g_ = block_params<acc>(l_);
    const auto n = size_t(l_.rows()), d = size_t(s.hidden), S = size_t(s.seq), w = size_t(l_.width()),
               f = size_t(l_.ffn_width()), hr = size_t(l_.head_shards.size(l_.rank));
    for (auto* v : {&x_, &h_, &dh_, &dy_}) v->resize(n * d);
    for (auto* v : {&mean1_, &stat1_, &mean2_, &stat2_}) v->resize(n);
    for (auto* v : {&y1_, &a_t_, &y2_, &z_t_, &dz_t_, &dy_t_, &dh_t_}) v->resize(n * d);
    for (auto* v : {&y1g_, &y2g_, &dzg_t_, &dhg_t_}) v->resize(S * d);
    for (auto* v : {&qkv_t_, &dqkv_t_}) v->resize(S * 3 * w);
    for (auto* v : {&o_t_, &do_t_}) v->resize(S * w);
    for (auto* v : {&upre_t_, &u_t_, &du_t_}) v->resize(S * f);
    for (auto* v : {&qkv_, &dqkv_}) v->resize(S * 3 * w);
    for (auto* v : {&o_, &do_}) v->resize(S * w);
    for (auto* v : {&upre_, &du_}) v->resize(S * f);
    for (auto* v : {&lse_, &amax_, &asum_, &delta_}) v->resize(hr * S);
    for (auto* v : {&conv_a_, &conv_b_}) v->resize(S * std::max({d, f, 3 * w}));
    if constexpr (!std::is_same_v<acc, double>) {
      for (auto* v : {&ln_y_, &ln_dx_}) v->resize(n * d);
      for (auto* v : {&ln_g_, &ln_b_, &ln_dg_, &ln_db_}) v->resize(d);
    }
    size_t replicated = 0;
    g_.each([&](const char*, std::vector<acc>& v, bool r) { replicated += r ? v.size() : 0; });
    packed_.resize(replicated);
  } catch (const std::bad_alloc&) {
    what = "cannot allocate the block's activations and scratch (std::bad_alloc)";
  }
  agree(what.empty(), what);
}

template <class T>
void transformer_block<T>::agree(bool ok, const std::string& what) const {
  using overlap::detail::failure;
  overlap::detail::agree_on(*ctx_, ok ? failure() : failure(failure::kind::invalid_argument, what),
                            "overlap::layers::transformer_block");
}

template <class T>
template <class Options>
Options transformer_block<T>::options(bool transpose_b) const {
  Options o;  // the defaults: lhs_rows (all-gather), rows (reduce-scatter)
  o.strategy = opt_.strategy;
  o.transpose_b = transpose_b;
  return o;
}

template <class T>
pending transformer_block<T>::reduce_scatter(bool started, matrix_view<const T> a, matrix_view<const T> b,
                                             matrix_view<T> c) {
  const rs_options o = options<rs_options>(true);
  if (started) return start_matmul_reduce_scatter<T>(*ctx_, a, b, c, o);
  matmul_reduce_scatter<T>(*ctx_, a, b, c, o);
  return {};
}

template <class T>
void transformer_block<T>::forward(matrix_view<const T> x, matrix_view<T> out) {
  const int64_t n = l_.rows(), d = l_.shape.hidden, S = l_.shape.seq, w = l_.width();
  agree(detail::fits(x, n, d) && detail::fits(out, n, d), "forward: x and out must be " + std::to_string(n) + " x " +
                                                              std::to_string(d) + " (ld >= hidden); got x " +
                                                              detail::dims(x) + ", out " + detail::dims(out));
  have_forward_ = false;
  engine::trace_recorder* tr = ctx_->tracer();
  {
    detail::phase_span ph(tr, "layer norm 1");
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < d; ++j) x_[size_t(i * d + j)] = detail::cast<acc>(x(i, j));
    norm_forward(x_, w_.ln1_g, w_.ln1_b, y1_, mean1_, stat1_);
  }
  {
    detail::phase_span ph(tr, "QKV projection (all-gather matmul)");
    ag_options o = options<ag_options>(false);
    o.epilogue.bias = static_cast<const T*>(w_.bqkv.data());
    all_gather_matmul<T>(*ctx_, {y1_.data(), n, d}, {w_.wqkv.data(), d, 3 * w}, {qkv_t_.data(), S, 3 * w},
                         {y1g_.data(), S, d}, o);
  }
  attention_forward();
  {
    detail::phase_span ph(tr, "output projection (matmul reduce-scatter)");
    rs_options o = options<rs_options>(false);
    o.epilogue.bias = static_cast<const T*>(w_.bo.data());
    matmul_reduce_scatter<T>(*ctx_, {o_t_.data(), S, w}, {w_.wo.data(), w, d}, {a_t_.data(), n, d}, o);
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
  detail::phase_span ph(ctx_->tracer(), "attention (local heads)");
  const attention::dims dd = attention_dims();
  const int64_t S = l_.shape.seq, w = dd.width();
  const acc* qkv = detail::widen(qkv_t_, qkv_);  // kept in qkv_ (bf16) for the backward pass
  std::fill(o_.begin(), o_.end(), acc(0));
  std::fill(amax_.begin(), amax_.end(), -std::numeric_limits<acc>::infinity());
  std::fill(asum_.begin(), asum_.end(), acc(0));
  const attention::online_softmax<acc> st{o_.data(), amax_.data(), asum_.data(), S};
  // Causal attention of the whole sequence is one diagonal tile of ring attention's.
  tiles_.forward(dd, {qkv, 3 * w}, {qkv + w, qkv + 2 * w, 3 * w}, {0, S, 0, S, true}, st);
  attention::normalise(dd, st, lse_.data());
  detail::narrow(o_, o_t_);
}

template <class T>
void transformer_block<T>::mlp_forward(matrix_view<T> out) {
  const int64_t n = l_.rows(), d = l_.shape.hidden, S = l_.shape.seq, f = l_.ffn_width();
  engine::trace_recorder* tr = ctx_->tracer();
  {
    detail::phase_span ph(tr, "MLP up projection (all-gather matmul)");
    ag_options o = options<ag_options>(false);
    o.epilogue.bias = static_cast<const T*>(w_.b1.data());
    all_gather_matmul<T>(*ctx_, {y2_.data(), n, d}, {w_.w1.data(), d, f}, {upre_t_.data(), S, f}, {y2g_.data(), S, d},
                         o);
  }
  {
    detail::phase_span ph(tr, "GELU");
    const acc* pre = detail::widen(upre_t_, upre_);  // kept in upre_ (bf16) for the backward pass
    if constexpr (std::is_same_v<acc, double>) {
      for (size_t i = 0; i < u_t_.size(); ++i) u_t_[i] = math::gelu(pre[i]);
    } else if constexpr (std::is_same_v<T, float>) {
      prims_.gelu(pre, u_t_.data(), int64_t(u_t_.size()));
    } else {
      prims_.gelu(pre, du_.data(), int64_t(u_t_.size()));  // du_ is free until the backward pass
      detail::narrow(du_, u_t_);
    }
  }
  {
    detail::phase_span ph(tr, "MLP down projection (matmul reduce-scatter)");
    rs_options o = options<rs_options>(false);
    o.epilogue.bias = static_cast<const T*>(w_.b2.data());
    matmul_reduce_scatter<T>(*ctx_, {u_t_.data(), S, f}, {w_.w2.data(), f, d}, {z_t_.data(), n, d}, o);
  }
  detail::phase_span ph(tr, "residual");
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < d; ++j)
      out(i, j) = detail::cast<T>(acc(h_[size_t(i * d + j)] + detail::cast<acc>(z_t_[size_t(i * d + j)])));
}

template <class T>
template <class Op, class Local>
void transformer_block<T>::overlapped(Op&& op, Local&& local) {
  if (opt_.strategy == strategy::bulk || !opt_.overlap_weight_gradients) {
    op(false);
    local();
    return;
  }
  pending started = op(true);
  local();  // on an exception, started's destructor waits for the op
  started.wait();
}

template <class T>
void transformer_block<T>::backward(matrix_view<const T> dout, matrix_view<T> dx) {
  const int64_t n = l_.rows(), d = l_.shape.hidden;
  const bool shapes = detail::fits(dout, n, d) && detail::fits(dx, n, d);
  agree(have_forward_ && shapes, !have_forward_ ? "backward before forward (or after a forward that failed)"
                                                : "backward: dout and dx must be " + std::to_string(n) + " x " +
                                                      std::to_string(d) + " (ld >= hidden); got dout " +
                                                      detail::dims(dout) + ", dx " + detail::dims(dx));
  g_.each([](const char*, std::vector<acc>& v, bool) { std::fill(v.begin(), v.end(), acc(0)); });
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
  sum_replicated_grads();
}

template <class T>
void transformer_block<T>::mlp_backward() {
  const int64_t n = l_.rows(), d = l_.shape.hidden, S = l_.shape.seq, f = l_.ffn_width();
  engine::trace_recorder* tr = ctx_->tracer();
  {
    detail::phase_span ph(tr, "MLP down backward (all-gather matmul)");
    all_gather_matmul<T>(*ctx_, {dz_t_.data(), n, d}, {w_.w2.data(), f, d}, {du_t_.data(), S, f}, {dzg_t_.data(), S, d},
                         options<ag_options>(true));
  }
  {
    detail::phase_span ph(tr, "GELU backward");
    const acc* pre = std::is_same_v<T, acc> ? reinterpret_cast<const acc*>(upre_t_.data()) : upre_.data();
    if constexpr (std::is_same_v<acc, double>) {
      for (size_t i = 0; i < du_.size(); ++i) du_[i] = detail::cast<acc>(du_t_[i]) * math::gelu_grad(pre[i]);
    } else {
      prims_.gelu_backward(pre, detail::widen(du_t_, du_), du_.data(), int64_t(du_.size()));
    }
    detail::narrow(du_, du_t_);  // the pre-activation's gradient, input of the reduce-scatter
  }
  auto op = [&](bool started) {
    detail::phase_span ph(
        tr, started ? "MLP up backward (started matmul reduce-scatter)" : "MLP up backward (matmul reduce-scatter)");
    return reduce_scatter(started, {du_t_.data(), S, f}, {w_.w1.data(), d, f}, {dy_t_.data(), n, d});
  };
  overlapped(op, [&] {
    detail::phase_span ph(tr, "MLP down weight gradient");
    const acc* u = detail::widen(u_t_, conv_a_);
    const acc* dzg = detail::widen(dzg_t_, conv_b_);
    gemm_.run(product::atb, f, d, S, {u, f, dzg, d, g_.w2.data(), d});  // dW2 = u^T dZ
    detail::add_column_sums<acc>({du_.data(), S, f}, g_.b1);
  });
  detail::phase_span ph(tr, "layer norm 2 backward");
  const acc* dy = detail::widen(dy_t_, dy_);
  norm_backward(h_, dy, w_.ln2_g, w_.ln2_b, mean2_, stat2_, g_.ln2_g, g_.ln2_b);
}

template <class T>
void transformer_block<T>::attention_backward() {
  const int64_t n = l_.rows(), d = l_.shape.hidden, S = l_.shape.seq, w = l_.width();
  engine::trace_recorder* tr = ctx_->tracer();
  detail::narrow(dh_, dh_t_);
  auto gather = [&](bool started) {
    detail::phase_span ph(tr, started ? "output projection backward (started all-gather matmul)"
                                      : "output projection backward (all-gather matmul)");
    const matrix_view<const T> a{dh_t_.data(), n, d}, b{w_.wo.data(), w, d};
    const matrix_view<T> c{do_t_.data(), S, w}, out{dhg_t_.data(), S, d};
    const ag_options o = options<ag_options>(true);
    if (started) return start_all_gather_matmul<T>(*ctx_, a, b, c, out, o);
    all_gather_matmul<T>(*ctx_, a, b, c, out, o);
    return pending{};
  };
  overlapped(gather, [&] {  // the MLP up projection's weight gradient meanwhile
    detail::phase_span ph(tr, "MLP up weight gradient");
    const int64_t f = l_.ffn_width();
    const acc* y2g = detail::widen(y2g_, conv_a_);
    gemm_.run(product::atb, d, f, S, {y2g, d, du_.data(), f, g_.w1.data(), f});  // dW1 = y2^T dU
  });
  {
    detail::phase_span ph(tr, "attention backward (local heads)");
    const attention::dims dd = attention_dims();
    const acc* d_o = detail::widen(do_t_, do_);
    const acc* qkv = std::is_same_v<T, acc> ? reinterpret_cast<const acc*>(qkv_t_.data()) : qkv_.data();  // forward's
    attention::softmax_deltas(
        dd, S, d_o, [&](int64_t i, int64_t j) { return o_[size_t(i * w + j)]; }, delta_.data());
    std::fill(dqkv_.begin(), dqkv_.end(), acc(0));
    const attention::backward_rows<acc> in{{qkv, 3 * w}, d_o, lse_.data(), delta_.data(), S};
    acc* g = dqkv_.data();
    tiles_.backward(dd, in, {qkv + w, qkv + 2 * w, 3 * w}, {0, S, 0, S, true}, {g, 3 * w, g + w, g + 2 * w, 3 * w});
    detail::narrow(dqkv_, dqkv_t_);
  }
  auto op = [&](bool started) {
    detail::phase_span ph(
        tr, started ? "QKV backward (started matmul reduce-scatter)" : "QKV backward (matmul reduce-scatter)");
    return reduce_scatter(started, {dqkv_t_.data(), S, 3 * w}, {w_.wqkv.data(), d, 3 * w}, {dy_t_.data(), n, d});
  };
  overlapped(op, [&] {
    detail::phase_span ph(tr, "attention weight gradients");
    const acc* dhg = detail::widen(dhg_t_, conv_a_);
    gemm_.run(product::atb, w, d, S, {o_.data(), w, dhg, d, g_.wo.data(), d});  // dWo = o^T dA
    const acc* y1g = detail::widen(y1g_, conv_b_);
    gemm_.run(product::atb, d, 3 * w, S, {y1g, d, dqkv_.data(), 3 * w, g_.wqkv.data(), 3 * w});  // dWqkv = y1^T dQKV
    detail::add_column_sums<acc>({dqkv_.data(), S, 3 * w}, g_.bqkv);
  });
}

template <class T>
void transformer_block<T>::sum_replicated_grads() {
  size_t at = 0;  // into packed_, sized by the constructor: no allocation per step
  g_.each([&](const char*, std::vector<acc>& v, bool replicated) {
    if (replicated) at = size_t(std::copy(v.begin(), v.end(), packed_.begin() + long(at)) - packed_.begin());
  });
  const MPI_Datatype type = std::is_same_v<acc, double> ? MPI_DOUBLE : MPI_FLOAT;
  OVERLAP_MPI(MPI_Allreduce, MPI_IN_PLACE, packed_.data(), int(packed_.size()), type, MPI_SUM, comm_.get());
  at = 0;
  g_.each([&](const char*, std::vector<acc>& v, bool replicated) {
    if (!replicated) return;
    std::copy(packed_.begin() + long(at), packed_.begin() + long(at + v.size()), v.begin());
    at += v.size();
  });
}

template <class T>
void transformer_block<T>::norm_forward(const std::vector<acc>& x, const std::vector<T>& g, const std::vector<T>& b,
                                        std::vector<T>& y, std::vector<acc>& mean, std::vector<acc>& stat) {
  const int64_t n = l_.rows(), d = l_.shape.hidden;
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
}

template <class T>
void transformer_block<T>::norm_backward(const std::vector<acc>& x, const acc* dy, const std::vector<T>& g,
                                         const std::vector<T>& b, std::vector<acc>& mean, std::vector<acc>& stat,
                                         std::vector<acc>& gg, std::vector<acc>& gb) {
  const int64_t n = l_.rows(), d = l_.shape.hidden;
  if constexpr (std::is_same_v<acc, double>) {
    math::layer_norm_backward<acc, T>({x.data(), n, d}, dy, g.data(), {mean.data(), stat.data()}, dh_.data(),
                                      {gg.data(), gb.data()});
  } else {
    const norm_rows r{x.data(), n, d, detail::widen(g, ln_g_), detail::widen(b, ln_b_), mean.data(), stat.data()};
    prims_.layer_norm_backward(r, dy, ln_dx_.data(), {ln_dg_.data(), ln_db_.data()});
    for (size_t i = 0; i < ln_dx_.size(); ++i) dh_[i] += ln_dx_[i];
    for (size_t j = 0; j < ln_dg_.size(); ++j) gg[j] += ln_dg_[j], gb[j] += ln_db_[j];
  }
}

}  // namespace overlap::layers
