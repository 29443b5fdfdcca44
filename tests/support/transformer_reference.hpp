#pragma once
// The transformer block of overlap/layers/transformer.hpp on one rank, in
// double precision, written out with plain loops: the independent reference
// of test_transformer.cpp (forward output and every gradient).

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "overlap/layers/block_params.hpp"

namespace reference {

/// A dense row-major matrix of doubles.
struct mat {
  int64_t r = 0, c = 0;
  std::vector<double> v;
  mat() = default;
  mat(int64_t rows, int64_t cols) : r(rows), c(cols), v(size_t(rows * cols), 0.0) {}
  double& operator()(int64_t i, int64_t j) { return v[size_t(i * c + j)]; }
  double operator()(int64_t i, int64_t j) const { return v[size_t(i * c + j)]; }
};

/// op(a) @ op(b), op transposing when asked.
inline mat mul(const mat& a, const mat& b, bool ta = false, bool tb = false) {
  const int64_t m = ta ? a.c : a.r, k = ta ? a.r : a.c, n = tb ? b.r : b.c;
  mat out(m, n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t q = 0; q < k; ++q) {
      const double x = ta ? a(q, i) : a(i, q);
      for (int64_t j = 0; j < n; ++j) out(i, j) += x * (tb ? b(j, q) : b(q, j));
    }
  return out;
}

/// The whole block's parameters: ln*, bqkv, bo, b1, b2 as 1 x n rows, wqkv
/// hidden x 3*hidden, wo hidden x hidden, w1 hidden x ffn, w2 ffn x hidden.
using params = std::map<std::string, mat>;

inline params make_params(const overlap::layers::block_shape& s) {
  const int64_t d = s.hidden, f = s.ffn;
  return {{"ln1_g", mat(1, d)}, {"ln1_b", mat(1, d)}, {"wqkv", mat(d, 3 * d)}, {"bqkv", mat(1, 3 * d)},
          {"wo", mat(d, d)},    {"bo", mat(1, d)},    {"ln2_g", mat(1, d)},    {"ln2_b", mat(1, d)},
          {"w1", mat(d, f)},    {"b1", mat(1, f)},    {"w2", mat(f, d)},       {"b2", mat(1, d)}};
}

struct ln_saved {
  std::vector<double> mean, rstd;
};

inline mat layer_norm(const mat& x, const mat& g, const mat& b, ln_saved& s) {
  mat y(x.r, x.c);
  s.mean.assign(size_t(x.r), 0), s.rstd.assign(size_t(x.r), 0);
  for (int64_t i = 0; i < x.r; ++i) {
    double mu = 0, var = 0;
    for (int64_t j = 0; j < x.c; ++j) mu += x(i, j) / double(x.c);
    for (int64_t j = 0; j < x.c; ++j) var += (x(i, j) - mu) * (x(i, j) - mu) / double(x.c);
    const double r = 1 / std::sqrt(var + 1e-5);
    s.mean[size_t(i)] = mu, s.rstd[size_t(i)] = r;
    for (int64_t j = 0; j < x.c; ++j) y(i, j) = (x(i, j) - mu) * r * g(0, j) + b(0, j);
  }
  return y;
}

// dx = d/dx of sum(dy * LN(x)), by the chain rule written entry by entry.
inline mat layer_norm_backward(const mat& x, const mat& dy, const mat& g, const ln_saved& s, mat& dg, mat& db) {
  mat dx(x.r, x.c);
  const double n = double(x.c);
  for (int64_t i = 0; i < x.r; ++i) {
    const double r = s.rstd[size_t(i)], mu = s.mean[size_t(i)];
    for (int64_t k = 0; k < x.c; ++k) {
      double acc = 0;  // sum_j dy_j g_j d(xhat_j)/d(x_k)
      for (int64_t j = 0; j < x.c; ++j) {
        const double xj = (x(i, j) - mu) * r, xk = (x(i, k) - mu) * r;
        acc += dy(i, j) * g(0, j) * r * ((j == k ? 1.0 : 0.0) - 1.0 / n - xj * xk / n);
      }
      dx(i, k) = acc;
    }
    for (int64_t j = 0; j < x.c; ++j) {
      dg(0, j) += dy(i, j) * (x(i, j) - mu) * r;
      db(0, j) += dy(i, j);
    }
  }
  return dx;
}

inline double gelu(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
inline double gelu_grad(double x) {
  const double pi = 3.14159265358979323846;
  return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-x * x / 2) / std::sqrt(2 * pi);
}

inline mat add_bias(mat m, const mat& b) {
  for (int64_t i = 0; i < m.r; ++i)
    for (int64_t j = 0; j < m.c; ++j) m(i, j) += b(0, j);
  return m;
}
inline mat add(mat a, const mat& b) {
  for (size_t i = 0; i < a.v.size(); ++i) a.v[i] += b.v[i];
  return a;
}
inline mat column_sums(const mat& m) {
  mat s(1, m.c);
  for (int64_t i = 0; i < m.r; ++i)
    for (int64_t j = 0; j < m.c; ++j) s(0, j) += m(i, j);
  return s;
}

/// Forward and backward of the block on the whole sequence.
struct block {
  block(const overlap::layers::block_shape& shape, params p) : s(shape), w(std::move(p)) {}

  overlap::layers::block_shape s;
  params w;
  mat x, y1, qkv, o, h, y2, upre, u, out;
  std::vector<mat> probs;  // one seq x seq matrix per head
  ln_saved ln1, ln2;

  mat forward(const mat& input) {
    x = input;
    y1 = layer_norm(x, w.at("ln1_g"), w.at("ln1_b"), ln1);
    qkv = add_bias(mul(y1, w.at("wqkv")), w.at("bqkv"));
    attention();
    h = add(x, add_bias(mul(o, w.at("wo")), w.at("bo")));
    y2 = layer_norm(h, w.at("ln2_g"), w.at("ln2_b"), ln2);
    upre = add_bias(mul(y2, w.at("w1")), w.at("b1"));
    u = upre;
    for (double& e : u.v) e = gelu(e);
    out = add(h, add_bias(mul(u, w.at("w2")), w.at("b2")));
    return out;
  }

  void attention() {
    const int64_t S = s.seq, d = s.hidden, dh = d / s.heads;
    o = mat(S, d);
    probs.assign(size_t(s.heads), mat(S, S));
    for (int64_t hd = 0; hd < s.heads; ++hd) {
      mat& p = probs[size_t(hd)];
      for (int64_t i = 0; i < S; ++i) {
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < dh; ++c) dot += qkv(i, hd * dh + c) * qkv(j, d + hd * dh + c);
          p(i, j) = dot / std::sqrt(double(dh));
          mx = std::fmax(mx, p(i, j));
        }
        for (int64_t j = 0; j <= i; ++j) sum += std::exp(p(i, j) - mx);
        for (int64_t j = 0; j <= i; ++j) p(i, j) = std::exp(p(i, j) - mx) / sum;
        for (int64_t c = 0; c < dh; ++c)
          for (int64_t j = 0; j <= i; ++j) o(i, hd * dh + c) += p(i, j) * qkv(j, 2 * d + hd * dh + c);
      }
    }
  }

  mat attention_backward(const mat& d_o) const {
    const int64_t S = s.seq, d = s.hidden, dh = d / s.heads;
    mat dqkv(S, 3 * d);
    const double scale = 1 / std::sqrt(double(dh));
    for (int64_t hd = 0; hd < s.heads; ++hd) {
      const mat& p = probs[size_t(hd)];
      mat dp(S, S);
      for (int64_t i = 0; i < S; ++i)
        for (int64_t j = 0; j <= i; ++j)
          for (int64_t c = 0; c < dh; ++c) {
            dp(i, j) += d_o(i, hd * dh + c) * qkv(j, 2 * d + hd * dh + c);
            dqkv(j, 2 * d + hd * dh + c) += p(i, j) * d_o(i, hd * dh + c);  // dV
          }
      for (int64_t i = 0; i < S; ++i) {
        double rowdot = 0;
        for (int64_t j = 0; j <= i; ++j) rowdot += p(i, j) * dp(i, j);
        for (int64_t j = 0; j <= i; ++j) {
          const double ds = p(i, j) * (dp(i, j) - rowdot) * scale;
          for (int64_t c = 0; c < dh; ++c) {
            dqkv(i, hd * dh + c) += ds * qkv(j, d + hd * dh + c);  // dQ
            dqkv(j, d + hd * dh + c) += ds * qkv(i, hd * dh + c);  // dK
          }
        }
      }
    }
    return dqkv;
  }

  /// Gradients of sum(dout * out) for every parameter, and dx.
  params backward(const mat& dout, mat& dx) const {
    params g = make_params(s);
    g["b2"] = column_sums(dout);
    g["w2"] = mul(u, dout, true, false);
    mat du = mul(dout, w.at("w2"), false, true);
    for (size_t i = 0; i < du.v.size(); ++i) du.v[i] *= gelu_grad(upre.v[i]);
    g["w1"] = mul(y2, du, true, false);
    g["b1"] = column_sums(du);
    const mat dy2 = mul(du, w.at("w1"), false, true);
    const mat dh = add(dout, layer_norm_backward(h, dy2, w.at("ln2_g"), ln2, g["ln2_g"], g["ln2_b"]));
    g["bo"] = column_sums(dh);
    g["wo"] = mul(o, dh, true, false);
    const mat dqkv = attention_backward(mul(dh, w.at("wo"), false, true));
    g["wqkv"] = mul(y1, dqkv, true, false);
    g["bqkv"] = column_sums(dqkv);
    const mat dy1 = mul(dqkv, w.at("wqkv"), false, true);
    dx = add(dh, layer_norm_backward(x, dy1, w.at("ln1_g"), ln1, g["ln1_g"], g["ln1_b"]));
    return g;
  }
};

}  // namespace reference
