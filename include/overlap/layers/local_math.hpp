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

/// The shapes of this rank's attention: seq tokens, `heads` local heads of
/// width dh; qkv is seq x 3*heads*dh ([Q | K | V], head h at column h*dh of
/// each), o and do are seq x heads*dh. Rows go in blocks of `block`: a
/// block of queries multiplies only the keys at or before its last row
/// (the causal mask's zero upper triangle is skipped, blocks of it at least).
struct attention_shape {
  ///@{
  /// Tokens, local heads, head width, and rows per block.
  int64_t seq = 0, heads = 0, dh = 0, block = 256;
  ///@}
  [[nodiscard]] int64_t width() const { return heads * dh; }                  ///< heads * dh
  [[nodiscard]] double scale() const { return 1.0 / std::sqrt(double(dh)); }  ///< 1 / sqrt(dh)
};

/// Row i of the probabilities from its scores (row[0..i]): softmax of
/// scale * scores, zero after i up to `end`; returns the log-sum-exp.
template <class A>
A causal_softmax_row(A* row, int64_t i, int64_t end, A scale) {
  A mx = row[0];
  for (int64_t j = 1; j <= i; ++j) mx = std::max(mx, row[j]);
  A sum = 0;
  for (int64_t j = 0; j <= i; ++j) sum += row[j] = std::exp((row[j] - mx) * scale);
  const A inv = A(1) / sum;
  for (int64_t j = 0; j <= i; ++j) row[j] *= inv;
  std::fill(row + i + 1, row + end, A(0));
  return mx * scale + std::log(sum);
}

/// What attention writes and its backward pass reads again: the output o
/// (seq x width) and each row's log-sum-exp (heads x seq).
template <class A>
struct attention_result {
  A* o = nullptr;    ///< seq x width
  A* lse = nullptr;  ///< heads x seq
};

/// Causal softmax attention of every local head. p is seq x seq scratch.
template <class A>
void attention(local_gemm<A>& gemm, const attention_shape& s, const A* qkv, attention_result<A> out,
               std::vector<A>& p) {
  const int64_t n = s.seq, w = s.width(), ld = 3 * w;
  A *o = out.o, *lse = out.lse;
  p.resize(static_cast<size_t>(n * n));
  for (int64_t h = 0; h < s.heads; ++h) {
    const A* q = qkv + h * s.dh;
    for (int64_t r0 = 0; r0 < n; r0 += s.block) {
      const int64_t r1 = std::min(n, r0 + s.block), m = r1 - r0;
      A* pb = p.data() + r0 * n;
      gemm.run(product::abt, m, r1, s.dh, {q + r0 * ld, ld, q + w, ld, pb, n});  // S = Q K^T (rows r0..r1)
      for (int64_t i = r0; i < r1; ++i) lse[h * n + i] = causal_softmax_row(p.data() + i * n, i, r1, A(s.scale()));
      gemm.run(product::ab, m, s.dh, r1, {pb, n, q + 2 * w, ld, o + r0 * w + h * s.dh, w});  // O = P V
    }
  }
}

/// Rows [begin, end) of a head's probabilities.
struct row_block {
  ///@{
  /// The first row, and one past the last.
  int64_t begin = 0, end = 0;
  ///@}
};

/// Rows r0..r1 of head h's probabilities again (columns 0..r1), from Q, K
/// and the saved log-sum-exp.
template <class A>
void attention_probabilities(local_gemm<A>& gemm, const attention_shape& s, const A* qkv, attention_result<const A> fwd,
                             int64_t h, row_block rows, A* p) {
  const int64_t n = s.seq, w = s.width(), ld = 3 * w, r0 = rows.begin, r1 = rows.end;
  const A* lse = fwd.lse;
  const A* q = qkv + h * s.dh;
  const A scale = A(s.scale());
  gemm.run(product::abt, r1 - r0, r1, s.dh, {q + r0 * ld, ld, q + w, ld, p + r0 * n, n});
  for (int64_t i = r0; i < r1; ++i) {
    A* row = p + i * n;
    for (int64_t j = 0; j <= i; ++j) row[j] = std::exp(row[j] * scale - lse[h * n + i]);
    std::fill(row + i + 1, row + r1, A(0));
  }
}

/// Backward of attention: dqkv (seq x 3*width) = d(loss)/d[Q | K | V] for
/// do = d(loss)/do. p and dp are seq x seq scratch.
template <class A>
void attention_backward(local_gemm<A>& gemm, const attention_shape& s, const A* qkv, attention_result<const A> fwd,
                        const A* d_o, A* dqkv, std::vector<A>& p, std::vector<A>& dp) {
  const int64_t n = s.seq, w = s.width(), ld = 3 * w;
  const A* o = fwd.o;
  p.resize(static_cast<size_t>(n * n)), dp.resize(static_cast<size_t>(n * n));
  for (int64_t i = 0; i < n; ++i) std::fill(dqkv + i * ld + w, dqkv + i * ld + 3 * w, A(0));  // dK, dV add up
  for (int64_t h = 0; h < s.heads; ++h) {
    const int64_t c = h * s.dh;
    const A *q = qkv + c, *k = qkv + w + c, *v = qkv + 2 * w + c;
    for (int64_t r0 = 0; r0 < n; r0 += s.block) {
      const int64_t r1 = std::min(n, r0 + s.block), m = r1 - r0;
      A *pb = p.data() + r0 * n, *db = dp.data() + r0 * n;
      attention_probabilities(gemm, s, qkv, fwd, h, {r0, r1}, p.data());
      gemm.run(product::atb, r1, s.dh, m, {pb, n, d_o + r0 * w + c, w, dqkv + 2 * w + c, ld},
               into::add);                                                       // dV += P^T dO
      gemm.run(product::abt, m, r1, s.dh, {d_o + r0 * w + c, w, v, ld, db, n});  // dP = dO V^T
      for (int64_t i = r0; i < r1; ++i) {
        A delta = 0;  // sum_j dP_ij P_ij = dO_i . O_i
        for (int64_t j = 0; j < s.dh; ++j) delta += d_o[i * w + c + j] * o[i * w + c + j];
        for (int64_t j = 0; j < r1; ++j)
          dp[size_t(i * n + j)] = p[size_t(i * n + j)] * (dp[size_t(i * n + j)] - delta) * A(s.scale());
      }
      gemm.run(product::ab, m, s.dh, r1, {db, n, k, ld, dqkv + r0 * ld + c, ld});                  // dQ = dS K
      gemm.run(product::atb, r1, s.dh, m, {db, n, q + r0 * ld, ld, dqkv + w + c, ld}, into::add);  // dK += dS^T Q
    }
  }
}

}  // namespace overlap::layers::math
