#pragma once
// The independent reference of ring attention: softmax attention of the
// whole sequence on one rank, forward and backward, in double with plain
// loops (no tiles, no online softmax, no ring).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "transformer_reference.hpp"

namespace testing_support {

/// Dense matrices of doubles, as the block's reference has them.
using dense = reference::mat;

/// Attention of `heads` heads over the whole sequence: o, lse (heads x seq)
/// from q, k, v; then dq, dk, dv for d_o.
struct attention_reference {
  int64_t heads = 1;
  bool causal = true;
  dense q, k, v, o, lse, d_o, dq, dk, dv;

  [[nodiscard]] int64_t dh() const { return q.c / heads; }
  [[nodiscard]] bool sees(int64_t i, int64_t j) const { return !causal || j <= i; }

  // Row i's probabilities of head h (zero where masked) and its log-sum-exp.
  std::vector<double> probabilities(int64_t h, int64_t i, double& lse_out) const {
    const int64_t n = q.r, d = dh();
    const double scale = 1.0 / std::sqrt(double(d));
    std::vector<double> s(size_t(n), -std::numeric_limits<double>::infinity());
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < n; ++j) {
      if (!sees(i, j)) continue;
      double dot = 0;
      for (int64_t c = h * d; c < (h + 1) * d; ++c) dot += q(i, c) * k(j, c);
      s[size_t(j)] = dot * scale, mx = std::max(mx, s[size_t(j)]);
    }
    double sum = 0;
    for (int64_t j = 0; j < n; ++j) sum += sees(i, j) ? std::exp(s[size_t(j)] - mx) : 0.0;
    lse_out = mx + std::log(sum);
    for (int64_t j = 0; j < n; ++j) s[size_t(j)] = sees(i, j) ? std::exp(s[size_t(j)] - lse_out) : 0.0;
    return s;
  }

  void forward() {
    const int64_t n = q.r, w = q.c, d = dh();
    o = dense(n, w), lse = dense(heads, n);
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < n; ++i) {
        const std::vector<double> p = probabilities(h, i, lse(h, i));
        for (int64_t j = 0; j < n; ++j)
          for (int64_t c = h * d; c < (h + 1) * d; ++c) o(i, c) += p[size_t(j)] * v(j, c);
      }
  }

  void backward() {
    const int64_t n = q.r, w = q.c, d = dh();
    const double scale = 1.0 / std::sqrt(double(d));
    dq = dense(n, w), dk = dense(n, w), dv = dense(n, w);
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < n; ++i) {
        double unused = 0;
        const std::vector<double> p = probabilities(h, i, unused);
        std::vector<double> dp(size_t(n), 0.0);
        double rowsum = 0;  // sum_j dP_ij P_ij
        for (int64_t j = 0; j < n; ++j) {
          for (int64_t c = h * d; c < (h + 1) * d; ++c) {
            dv(j, c) += p[size_t(j)] * d_o(i, c);
            dp[size_t(j)] += d_o(i, c) * v(j, c);
          }
          rowsum += dp[size_t(j)] * p[size_t(j)];
        }
        for (int64_t j = 0; j < n; ++j) {
          const double ds = p[size_t(j)] * (dp[size_t(j)] - rowsum) * scale;
          for (int64_t c = h * d; c < (h + 1) * d; ++c) {
            dq(i, c) += ds * k(j, c);
            dk(j, c) += ds * q(i, c);
          }
        }
      }
  }
};

}  // namespace testing_support
