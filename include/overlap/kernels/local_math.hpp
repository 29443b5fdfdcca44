#pragma once
/// @file
/// The local (per-rank, communication-free) pieces of the transformer block
/// and their backward passes as plain loops: layer norm over rows and GELU.
/// Row-major, in float or double. The block runs them in double; in float
/// it runs oneDNN's primitives (kernels/local_primitives.hpp), measured
/// against these. Attention is ring attention's tiles (attention/attention_tiles.hpp).

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "overlap/core/matrix.hpp"

namespace overlap::layers::math {

/// The epsilon under the layer norms' square roots.
constexpr double layer_norm_eps = 1e-5;

/// A layer norm's learned gain and bias (n values each).
template <class G>
struct norm_params {
  const G* gain = nullptr;  ///< n values
  const G* bias = nullptr;  ///< n values
};
/// A layer norm's statistics per row, kept for its backward pass: the mean
/// and 1 / sqrt(var + eps).
template <class A>
struct norm_stats {
  A* mean = nullptr;  ///< one per row
  A* rstd = nullptr;  ///< 1 / sqrt(var + eps), one per row
};
/// The gradients of a layer norm's gain and bias (n values each).
template <class A>
struct norm_grads {
  A* gain = nullptr;  ///< n values
  A* bias = nullptr;  ///< n values
};

/// y (dense, as x) = (x - mean) / sqrt(var + eps) * gain + bias per row of
/// x (dense, rows x n); keeps the row statistics for the backward pass.
template <class A, class G, class Y>
void layer_norm(matrix_view<const A> x, norm_params<G> p, Y* y, norm_stats<A> stats) {
  const int64_t rows = x.rows, n = x.cols;
  const G *g = p.gain, *b = p.bias;
  A *mean = stats.mean, *rstd = stats.rstd;
  for (int64_t i = 0; i < rows; ++i) {
    const A* xi = x.data + i * n;
    double s = 0, s2 = 0;
    for (int64_t j = 0; j < n; ++j) s += xi[j];
    const double mu = s / double(n);
    for (int64_t j = 0; j < n; ++j) s2 += (xi[j] - mu) * (xi[j] - mu);
    const double r = 1.0 / std::sqrt(s2 / double(n) + layer_norm_eps);
    mean[i] = A(mu), rstd[i] = A(r);
    for (int64_t j = 0; j < n; ++j) y[i * n + j] = Y(A((xi[j] - mu) * r * double(g[j]) + double(b[j])));
  }
}

/// Backward of layer_norm: dx += d(loss)/dx for dy (dense, as x); grads +=
/// this rank's rows' share of the parameter gradients.
template <class A, class G>
void layer_norm_backward(matrix_view<const A> xv, const A* dy, const G* g, norm_stats<const A> stats, A* dx,
                         norm_grads<A> grads) {
  const int64_t rows = xv.rows, n = xv.cols;
  const A *x = xv.data, *mean = stats.mean, *rstd = stats.rstd;
  A *dg = grads.gain, *db = grads.bias;
  // Two passes per row, each recomputing x^ and dx^ (no scratch to allocate).
  auto xhat = [&](int64_t i, int64_t j) { return (x[i * n + j] - mean[i]) * double(rstd[i]); };
  auto dxhat = [&](int64_t i, int64_t j) { return double(dy[i * n + j]) * double(g[j]); };
  for (int64_t i = 0; i < rows; ++i) {
    double m1 = 0, m2 = 0;
    for (int64_t j = 0; j < n; ++j) {
      const double xh = xhat(i, j), dxh = dxhat(i, j);
      m1 += dxh, m2 += dxh * xh;
      dg[j] += A(dy[i * n + j] * xh);
      db[j] += dy[i * n + j];
    }
    m1 /= double(n), m2 /= double(n);
    for (int64_t j = 0; j < n; ++j) dx[i * n + j] += A(double(rstd[i]) * (dxhat(i, j) - m1 - xhat(i, j) * m2));
  }
}

/// GELU (the erf form, as the ops' epilogue) and its derivative, in A.
template <class A>
A gelu(A x) {
  return A(0.5) * x * (A(1) + std::erf(x * A(0.70710678118654752440)));
}
/// The derivative of gelu at x.
template <class A>
A gelu_grad(A x) {
  return A(0.5) * (A(1) + std::erf(x * A(0.70710678118654752440))) +
         x * std::exp(A(-0.5) * x * x) * A(0.39894228040143267794);
}

}  // namespace overlap::layers::math
