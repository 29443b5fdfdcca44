#pragma once
/// @file
/// The transformer block's elementwise and row-wise local work on oneDNN's
/// primitives, in float: layer normalisation (`layer_normalization`) and
/// GELU (`eltwise`, gelu_erf), forward and backward, the softmax of whole
/// rows of attention scores (`softmax`), forward and backward, and the exp
/// of ring attention's online softmax (`eltwise`, exp). The block's double
/// path keeps the plain loops of kernels/local_math.hpp (oneDNN has no f64
/// primitives), which are also the reference these are measured against.

#include <oneapi/dnnl/dnnl.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>

#include "overlap/backend/onednn.hpp"
#include "overlap/kernels/local_math.hpp"

namespace overlap::layers {

/// A row-wise layer norm's operands: x is rows x n (dense), gain and bias n
/// values, mean and variance one per row (kept for the backward pass).
struct norm_rows {
  const float* x = nullptr;     ///< the input
  int64_t rows = 0;             ///< rows of x
  int64_t n = 0;                ///< columns of x (the normalised dimension)
  const float* gain = nullptr;  ///< n values
  /// n values. The backward pass does not need them, but oneDNN 2.6's
  /// backward primitive refuses to run without them when it computes the
  /// bias's gradient ("could not execute a primitive").
  const float* bias = nullptr;
  float* mean = nullptr;      ///< one per row
  float* variance = nullptr;  ///< one per row
};

namespace detail {
/// One row of softmax_backward in plain loops, the dot product in 16 lanes
/// (which the compiler vectorises).
inline void softmax_backward_row(const float* y, const float* dy, float* dx, int64_t n) {
  constexpr int lanes = 16;
  float acc[lanes] = {};
  const int64_t whole = n - n % lanes;  // the tail is its own loop, so no index runs past n
  for (int64_t j = 0; j < whole; j += lanes)
    for (int l = 0; l < lanes; ++l) acc[l] += y[j + l] * dy[j + l];
  for (int64_t j = whole; j < n; ++j) acc[0] += y[j] * dy[j];
  float dot = 0;
  for (float a : acc) dot += a;
  for (int64_t j = 0; j < n; ++j) dx[j] = y[j] * (dy[j] - dot);
}
}  // namespace detail

/// Layer norm, GELU, softmax and exp on oneDNN (f32). Primitives are cached by shape.
/// Local; not thread-safe: one caller at a time.
class local_primitives {
 public:
  /// y (dense, as x) = (x - mean) / sqrt(variance + eps) * gain + bias per
  /// row; writes each row's mean and variance.
  void layer_norm(const norm_rows& r, float* y) {
    backend::detail::onednn_call("dnnl::layer_normalization_forward", [&] {
      norm& k = norm_of(r.rows, r.n);
      std_args args{{DNNL_ARG_SRC, mem(k.data, r.x)},       {DNNL_ARG_DST, mem(k.data, y)},
                    {DNNL_ARG_MEAN, mem(k.stat, r.mean)},   {DNNL_ARG_VARIANCE, mem(k.stat, r.variance)},
                    {DNNL_ARG_SCALE, mem(k.param, r.gain)}, {DNNL_ARG_SHIFT, mem(k.param, r.bias)}};
      k.fwd.execute(*stream_, args);
      stream_->wait();
    });
  }
  /// Backward of layer_norm for dy (dense, as x): dx = d(loss)/dx, and the
  /// gain's and bias's gradients (n values each), all overwritten.
  void layer_norm_backward(const norm_rows& r, const float* dy, float* dx, math::norm_grads<float> grads) {
    backend::detail::onednn_call("dnnl::layer_normalization_backward", [&] {
      norm& k = norm_of(r.rows, r.n);
      std_args args{{DNNL_ARG_SRC, mem(k.data, r.x)},
                    {DNNL_ARG_DIFF_DST, mem(k.data, dy)},
                    {DNNL_ARG_MEAN, mem(k.stat, r.mean)},
                    {DNNL_ARG_VARIANCE, mem(k.stat, r.variance)},
                    {DNNL_ARG_SCALE, mem(k.param, r.gain)},
                    {DNNL_ARG_SHIFT, mem(k.param, r.bias)},
                    {DNNL_ARG_DIFF_SRC, mem(k.data, dx)},
                    {DNNL_ARG_DIFF_SCALE, mem(k.param, grads.gain)},
                    {DNNL_ARG_DIFF_SHIFT, mem(k.param, grads.bias)}};
      k.bwd.execute(*stream_, args);
      stream_->wait();
    });
  }
  /// y = gelu(x) (the erf form) for n values.
  void gelu(const float* x, float* y, int64_t n) {
    backend::detail::onednn_call("dnnl::eltwise_forward (gelu_erf)", [&] {
      gelu_kernels& k = gelu_of(n);
      k.fwd.execute(*stream_, {{DNNL_ARG_SRC, mem(k.data, x)}, {DNNL_ARG_DST, mem(k.data, y)}});
      stream_->wait();
    });
  }
  /// x[i] = exp(x[i]) for n values, in place.
  void exp(float* x, int64_t n) {
    backend::detail::onednn_call("dnnl::eltwise_forward (exp)", [&] {
      exp_kernel& k = exp_of(n);
      const dnnl::memory m = mem(k.data, x);
      k.fwd.execute(*stream_, {{DNNL_ARG_SRC, m}, {DNNL_ARG_DST, m}});
      stream_->wait();
    });
  }
  /// x = softmax(x) of each of `rows` dense rows of n values, in place
  /// (entries of -infinity get 0: a mask).
  void softmax(float* x, int64_t rows, int64_t n) {
    backend::detail::onednn_call("dnnl::softmax_forward", [&] {
      softmax_kernels& k = softmax_of(rows, n);
      const dnnl::memory m = mem(k.data, x);
      k.fwd.execute(*stream_, {{DNNL_ARG_SRC, m}, {DNNL_ARG_DST, m}});
      stream_->wait();
    });
  }
  /// Backward of softmax for its output y and dy = d(loss)/dy (rows x n,
  /// dense): dx = y * (dy - sum over the row of dy * y). dx may be dy.
  void softmax_backward(const float* y, const float* dy, float* dx, int64_t rows, int64_t n) {
    backend::detail::onednn_call("dnnl::softmax_backward", [&] {
      softmax_kernels& k = softmax_of(rows, n);
      if (!k.bwd_jit) {  // oneDNN 2.6 has no JIT kernel below AVX-512: its reference one is slower than a loop
        for (int64_t i = 0; i < rows; ++i) detail::softmax_backward_row(y + i * n, dy + i * n, dx + i * n, n);
        return;
      }
      k.bwd.execute(
          *stream_,
          {{DNNL_ARG_DST, mem(k.data, y)}, {DNNL_ARG_DIFF_DST, mem(k.data, dy)}, {DNNL_ARG_DIFF_SRC, mem(k.data, dx)}});
      stream_->wait();
    });
  }
  /// dx = dy * gelu'(x) for n values (dx may be dy).
  void gelu_backward(const float* x, const float* dy, float* dx, int64_t n) {
    backend::detail::onednn_call("dnnl::eltwise_backward (gelu_erf)", [&] {
      gelu_kernels& k = gelu_of(n);
      k.bwd.execute(
          *stream_,
          {{DNNL_ARG_SRC, mem(k.data, x)}, {DNNL_ARG_DIFF_DST, mem(k.data, dy)}, {DNNL_ARG_DIFF_SRC, mem(k.data, dx)}});
      stream_->wait();
    });
  }

 private:
  using std_args = std::unordered_map<int, dnnl::memory>;
  struct norm {
    dnnl::memory::desc data, stat, param;
    dnnl::layer_normalization_forward fwd;
    dnnl::layer_normalization_backward bwd;
  };
  struct gelu_kernels {
    dnnl::memory::desc data;
    dnnl::eltwise_forward fwd;
    dnnl::eltwise_backward bwd;
  };

  struct softmax_kernels {
    dnnl::memory::desc data;
    dnnl::softmax_forward fwd;
    dnnl::softmax_backward bwd;
    bool bwd_jit;  ///< bwd has a JIT kernel (not oneDNN's reference one)
  };
  struct exp_kernel {
    dnnl::memory::desc data;
    dnnl::eltwise_forward fwd;
  };

  const dnnl::engine& engine() {
    if (!engine_) {
      engine_ = std::make_unique<dnnl::engine>(dnnl::engine::kind::cpu, 0);
      stream_ = std::make_unique<dnnl::stream>(*engine_);
    }
    return *engine_;
  }
  dnnl::memory mem(const dnnl::memory::desc& md, const float* p) {
    return dnnl::memory(md, engine(),
                        const_cast<float*>(p));  // NOLINT(cppcoreguidelines-pro-type-const-cast): inputs are only read
  }

  norm& norm_of(int64_t rows, int64_t n) {
    auto it = norms_.find({rows, n});
    if (it != norms_.end()) return it->second;
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    const auto flags = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
    const dnnl::memory::desc data({rows, n}, dt::f32, tag::ab), stat({rows}, dt::f32, tag::a),
        param({n}, dt::f32, tag::a);
    const float eps = float(math::layer_norm_eps);
    const dnnl::layer_normalization_forward::primitive_desc fwd(
        dnnl::layer_normalization_forward::desc(dnnl::prop_kind::forward_training, data, stat, eps, flags), engine());
    const dnnl::layer_normalization_backward::primitive_desc bwd(
        dnnl::layer_normalization_backward::desc(dnnl::prop_kind::backward, data, data, stat, eps, flags), engine(),
        fwd);
    return norms_
        .emplace(std::make_pair(rows, n), norm{data, stat, param, dnnl::layer_normalization_forward(fwd),
                                               dnnl::layer_normalization_backward(bwd)})
        .first->second;
  }
  gelu_kernels& gelu_of(int64_t n) {
    auto it = gelus_.find(n);
    if (it != gelus_.end()) return it->second;
    const dnnl::memory::desc data({n}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::a);
    const auto alg = dnnl::algorithm::eltwise_gelu_erf;
    const dnnl::eltwise_forward::primitive_desc fwd(
        dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_training, alg, data, 0.f, 0.f), engine());
    const dnnl::eltwise_backward::primitive_desc bwd(dnnl::eltwise_backward::desc(alg, data, data, 0.f, 0.f), engine(),
                                                     fwd);
    return gelus_.emplace(n, gelu_kernels{data, dnnl::eltwise_forward(fwd), dnnl::eltwise_backward(bwd)}).first->second;
  }

  softmax_kernels& softmax_of(int64_t rows, int64_t n) {
    auto it = softmaxes_.find({rows, n});
    if (it != softmaxes_.end()) return it->second;
    if (softmaxes_.size() > 64) softmaxes_.clear();  // block shapes changed many times: start again
    const dnnl::memory::desc data({rows, n}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::ab);
    const dnnl::softmax_forward::primitive_desc fwd(
        dnnl::softmax_forward::desc(dnnl::prop_kind::forward_training, data, 1), engine());
    const dnnl::softmax_backward::primitive_desc bwd(dnnl::softmax_backward::desc(data, data, 1), engine(), fwd);
    const bool jit = std::string(bwd.impl_info_str()).rfind("ref", 0) != 0;
    return softmaxes_
        .emplace(std::make_pair(rows, n),
                 softmax_kernels{data, dnnl::softmax_forward(fwd), dnnl::softmax_backward(bwd), jit})
        .first->second;
  }
  exp_kernel& exp_of(int64_t n) {
    auto it = exps_.find(n);
    if (it != exps_.end()) return it->second;
    if (exps_.size() > 64) exps_.clear();  // tile shapes changed many times: start again
    const dnnl::memory::desc data({n}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::a);
    const dnnl::eltwise_forward::primitive_desc fwd(
        dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::eltwise_exp, data, 0.f, 0.f),
        engine());
    return exps_.emplace(n, exp_kernel{data, dnnl::eltwise_forward(fwd)}).first->second;
  }

  std::unique_ptr<dnnl::engine> engine_;
  std::unique_ptr<dnnl::stream> stream_;
  std::map<std::pair<int64_t, int64_t>, norm> norms_;
  std::map<int64_t, gelu_kernels> gelus_;
  std::map<std::pair<int64_t, int64_t>, softmax_kernels> softmaxes_;
  std::map<int64_t, exp_kernel> exps_;
};

}  // namespace overlap::layers
