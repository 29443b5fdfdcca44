#pragma once
/// @file
/// The local (per-rank, communication-free) pieces of the transformer block
/// and their backward passes: layer norm over rows, GELU, causal softmax
/// attention over this rank's heads. Row-major, in float or double.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "overlap/layers/local_gemm.hpp"

namespace overlap::layers::math {

constexpr double layer_norm_eps = 1e-5;

/// y = (x - mean) / sqrt(var + eps) * g + b per row of x (rows x n); keeps
/// mean and 1/sqrt(var + eps) per row for the backward pass.
template <class A, class G, class Y>
void layer_norm(const A* x, int64_t rows, int64_t n, const G* g, const G* b, Y* y, A* mean, A* rstd) {
  for (int64_t i = 0; i < rows; ++i) {
    const A* xi = x + i * n;
    double s = 0, s2 = 0;
    for (int64_t j = 0; j < n; ++j) s += xi[j];
    const double mu = s / double(n);
    for (int64_t j = 0; j < n; ++j) s2 += (xi[j] - mu) * (xi[j] - mu);
    const double r = 1.0 / std::sqrt(s2 / double(n) + layer_norm_eps);
    mean[i] = A(mu), rstd[i] = A(r);
    for (int64_t j = 0; j < n; ++j) y[i * n + j] = Y(A((xi[j] - mu) * r * double(g[j]) + double(b[j])));
  }
}

/// Backward of layer_norm: dx += d(loss)/dx for dy; dg, db += this rank's
/// rows' share of the parameter gradients.
template <class A, class G>
void layer_norm_backward(const A* x, const A* dy, int64_t rows, int64_t n, const G* g, const A* mean, const A* rstd,
                         A* dx, A* dg, A* db) {
  std::vector<double> xhat(static_cast<size_t>(n)), dxhat(static_cast<size_t>(n));
  for (int64_t i = 0; i < rows; ++i) {
    double m1 = 0, m2 = 0;
    for (int64_t j = 0; j < n; ++j) {
      const size_t u = static_cast<size_t>(j);
      xhat[u] = (x[i * n + j] - mean[i]) * double(rstd[i]);
      dxhat[u] = double(dy[i * n + j]) * double(g[j]);
      m1 += dxhat[u], m2 += dxhat[u] * xhat[u];
      dg[j] += A(dy[i * n + j] * xhat[u]);
      db[j] += dy[i * n + j];
    }
    m1 /= double(n), m2 /= double(n);
    for (int64_t j = 0; j < n; ++j) {
      const size_t u = static_cast<size_t>(j);
      dx[i * n + j] += A(double(rstd[i]) * (dxhat[u] - m1 - xhat[u] * m2));
    }
  }
}

inline double gelu(double x) { return 0.5 * x * (1.0 + std::erf(x * 0.70710678118654752440)); }
inline double gelu_grad(double x) {
  return 0.5 * (1.0 + std::erf(x * 0.70710678118654752440)) + x * std::exp(-0.5 * x * x) * 0.39894228040143267794;
}

/// The shapes of this rank's attention: seq tokens, `heads` local heads of
/// width dh; qkv is seq x 3*heads*dh ([Q | K | V], head h at column h*dh of
/// each), o and do are seq x heads*dh.
struct attention_shape {
  int64_t seq = 0, heads = 0, dh = 0;
  [[nodiscard]] int64_t width() const { return heads * dh; }
  [[nodiscard]] double scale() const { return 1.0 / std::sqrt(double(dh)); }
};

/// Causal softmax attention of every local head. p is seq x seq scratch;
/// lse (heads x seq) keeps each row's log-sum-exp for the backward pass.
template <class A>
void attention(local_gemm<A>& gemm, const attention_shape& s, const A* qkv, A* o, A* lse, std::vector<A>& p) {
  const int64_t n = s.seq, w = s.width(), ld = 3 * w;
  p.resize(static_cast<size_t>(n * n));
  for (int64_t h = 0; h < s.heads; ++h) {
    const A* q = qkv + h * s.dh;
    gemm.run(false, true, n, n, s.dh, {q, ld, q + w, ld, p.data(), n});
    for (int64_t i = 0; i < n; ++i) {
      A* row = p.data() + i * n;
      double mx = -std::numeric_limits<double>::infinity(), sum = 0;
      for (int64_t j = 0; j <= i; ++j) mx = std::max(mx, double(row[j]) * s.scale());
      for (int64_t j = 0; j <= i; ++j) sum += std::exp(double(row[j]) * s.scale() - mx);
      lse[h * n + i] = A(mx + std::log(sum));
      for (int64_t j = 0; j <= i; ++j) row[j] = A(std::exp(double(row[j]) * s.scale() - mx) / sum);
      std::fill(row + i + 1, row + n, A(0));
    }
    gemm.run(false, false, n, s.dh, n, {p.data(), n, q + 2 * w, ld, o + h * s.dh, w});
  }
}

/// The probabilities of head h again, from Q, K and the saved log-sum-exp.
template <class A>
void attention_probabilities(local_gemm<A>& gemm, const attention_shape& s, const A* qkv, const A* lse, int64_t h,
                             A* p) {
  const int64_t n = s.seq, w = s.width(), ld = 3 * w;
  const A* q = qkv + h * s.dh;
  gemm.run(false, true, n, n, s.dh, {q, ld, q + w, ld, p, n});
  for (int64_t i = 0; i < n; ++i) {
    A* row = p + i * n;
    for (int64_t j = 0; j <= i; ++j) row[j] = A(std::exp(double(row[j]) * s.scale() - lse[h * n + i]));
    std::fill(row + i + 1, row + n, A(0));
  }
}

/// Backward of attention: dqkv (seq x 3*width) = d(loss)/d[Q | K | V] for
/// do = d(loss)/do. p and dp are seq x seq scratch.
template <class A>
void attention_backward(local_gemm<A>& gemm, const attention_shape& s, const A* qkv, const A* o, const A* lse,
                        const A* d_o, A* dqkv, std::vector<A>& p, std::vector<A>& dp) {
  const int64_t n = s.seq, w = s.width(), ld = 3 * w;
  p.resize(static_cast<size_t>(n * n)), dp.resize(static_cast<size_t>(n * n));
  for (int64_t h = 0; h < s.heads; ++h) {
    const int64_t c = h * s.dh;
    attention_probabilities(gemm, s, qkv, lse, h, p.data());
    gemm.run(true, false, n, s.dh, n, {p.data(), n, d_o + c, w, dqkv + 2 * w + c, ld});   // dV = P^T dO
    gemm.run(false, true, n, n, s.dh, {d_o + c, w, qkv + 2 * w + c, ld, dp.data(), n});  // dP = dO V^T
    for (int64_t i = 0; i < n; ++i) {
      double delta = 0;  // sum_j dP_ij P_ij = dO_i . O_i
      for (int64_t j = 0; j < s.dh; ++j) delta += double(d_o[i * w + c + j]) * o[i * w + c + j];
      for (int64_t j = 0; j < n; ++j) {
        const size_t u = static_cast<size_t>(i * n + j);
        dp[u] = A(p[u] * (dp[u] - delta) * s.scale());  // dS, the scale of S folded in
      }
    }
    gemm.run(false, false, n, s.dh, n, {dp.data(), n, qkv + w + c, ld, dqkv + c, ld});     // dQ = dS K
    gemm.run(true, false, n, s.dh, n, {dp.data(), n, qkv + c, ld, dqkv + w + c, ld});      // dK = dS^T Q
  }
}

}  // namespace overlap::layers::math
