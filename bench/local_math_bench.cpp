// The transformer block's local phases (kernels/local_math.hpp's plain loops,
// which the block ran in float before, against what it runs now), side by
// side in one run of one process, one thread, on the block's shapes at 2
// ranks (seq 1024, hidden 1024, 16 heads of 64: each rank holds 512 tokens,
// 8 heads and 2048 MLP columns of the whole sequence):
//   layer norm forward and backward: plain loops / oneDNN layer_normalization
//   GELU forward and backward over seq x 2048: plain loops / oneDNN eltwise
//   the softmax inside causal attention, one block of 256 query rows against
//   the keys up to its last row: the plain row loop (std::exp) / the online
//   softmax's step of ring attention (16-lane reductions, oneDNN's exp) /
//   what the block runs, the masked rows through oneDNN's softmax primitive;
//   and its backward, plain loops / the primitive (below AVX-512, where
//   oneDNN 2.6 has only a reference kernel for it, the 16-lane loop
//   local_primitives falls back to)
// Run: build/bench/overlap-local-bench [--benchmark_repetitions=5 ...]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <overlap/attention/attention_tiles.hpp>
#include <overlap/kernels/local_exp.hpp>
#include <overlap/kernels/local_math.hpp>
#include <overlap/kernels/local_primitives.hpp>
#include <overlap/layers/example_values.hpp>

namespace {

namespace math = overlap::layers::math;
constexpr int64_t rows = 512, hidden = 1024, seq = 1024, ffn_cols = 2048, block = 256;

std::vector<float> values(const char* name, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = float(overlap::layers::example_value(name, i, 0));
  return v;
}

struct norm_data {
  std::vector<float> x = values("x", rows*hidden), dy = values("dy", rows*hidden), g = values("g", hidden),
                     b = values("b", hidden), y = std::vector<float>(size_t(rows * hidden)),
                     dx = std::vector<float>(size_t(rows * hidden)), mean = std::vector<float>(size_t(rows)),
                     stat = std::vector<float>(size_t(rows)), dg = std::vector<float>(size_t(hidden)),
                     db = std::vector<float>(size_t(hidden));
};

void layer_norm_loops(benchmark::State& st) {
  norm_data d;
  for (auto _ : st)
    math::layer_norm<float, float>({d.x.data(), rows, hidden}, {d.g.data(), d.b.data()}, d.y.data(),
                                   {d.mean.data(), d.stat.data()});
}
void layer_norm_onednn(benchmark::State& st) {
  norm_data d;
  overlap::layers::local_primitives p;
  for (auto _ : st)
    p.layer_norm({d.x.data(), rows, hidden, d.g.data(), d.b.data(), d.mean.data(), d.stat.data()}, d.y.data());
}
void layer_norm_backward_loops(benchmark::State& st) {
  norm_data d;
  math::layer_norm<float, float>({d.x.data(), rows, hidden}, {d.g.data(), d.b.data()}, d.y.data(),
                                 {d.mean.data(), d.stat.data()});
  for (auto _ : st)
    math::layer_norm_backward<float, float>({d.x.data(), rows, hidden}, d.dy.data(), d.g.data(),
                                            {d.mean.data(), d.stat.data()}, d.dx.data(), {d.dg.data(), d.db.data()});
}
void layer_norm_backward_onednn(benchmark::State& st) {
  norm_data d;
  overlap::layers::local_primitives p;
  const overlap::layers::norm_rows r{d.x.data(), rows, hidden, d.g.data(), d.b.data(), d.mean.data(), d.stat.data()};
  p.layer_norm(r, d.y.data());
  for (auto _ : st) p.layer_norm_backward(r, d.dy.data(), d.dx.data(), {d.dg.data(), d.db.data()});
}

constexpr int64_t gelu_n = seq * ffn_cols;
void gelu_loops(benchmark::State& st) {
  const std::vector<float> x = values("pre", gelu_n);
  std::vector<float> y(static_cast<size_t>(gelu_n));
  for (auto _ : st)
    for (size_t i = 0; i < y.size(); ++i) y[i] = math::gelu(x[i]);
  benchmark::DoNotOptimize(y.data());
}
void gelu_onednn(benchmark::State& st) {
  const std::vector<float> x = values("pre", gelu_n);
  std::vector<float> y(static_cast<size_t>(gelu_n));
  overlap::layers::local_primitives p;
  for (auto _ : st) p.gelu(x.data(), y.data(), gelu_n);
}
void gelu_backward_loops(benchmark::State& st) {
  const std::vector<float> x = values("pre", gelu_n), dy = values("du", gelu_n);
  std::vector<float> dx(static_cast<size_t>(gelu_n));
  for (auto _ : st)
    for (size_t i = 0; i < dx.size(); ++i) dx[i] = dy[i] * math::gelu_grad(x[i]);
  benchmark::DoNotOptimize(dx.data());
}
void gelu_backward_onednn(benchmark::State& st) {
  const std::vector<float> x = values("pre", gelu_n), dy = values("du", gelu_n);
  std::vector<float> dx(static_cast<size_t>(gelu_n));
  overlap::layers::local_primitives p;
  for (auto _ : st) p.gelu_backward(x.data(), dy.data(), dx.data(), gelu_n);
}

// The last block of causal rows (the widest): 256 queries against seq keys.
constexpr int64_t first_row = seq - block;
std::vector<float> scores() { return values("s", block * seq); }

// f(row, r, keys) for each row r of the block: its scores and how many keys it sees.
template <class F>
void each_row(std::vector<float>& p, F&& f) {
  for (int64_t r = 0; r < block; ++r) f(p.data() + r * seq, r, first_row + r + 1);
}

// The block's softmax before: per row, max, exp, sum and scale with scalar
// loops (the loop of kernels/local_math.hpp's causal_softmax_row at 1596d59).
void softmax_loops(benchmark::State& st) {
  const std::vector<float> s0 = scores();
  std::vector<float> p = s0;
  const float scale = 0.125f;
  for (auto _ : st) {
    std::copy(s0.begin(), s0.end(), p.begin());
    for (int64_t r = 0; r < block; ++r) {
      float* row = p.data() + r * seq;
      const int64_t i = first_row + r;
      float mx = row[0];
      for (int64_t j = 1; j <= i; ++j) mx = std::max(mx, row[j]);
      float sum = 0;
      for (int64_t j = 0; j <= i; ++j) sum += row[j] = std::exp((row[j] - mx) * scale);
      const float inv = 1 / sum;
      for (int64_t j = 0; j <= i; ++j) row[j] *= inv;
      std::fill(row + i + 1, row + seq, 0.f);
    }
    benchmark::DoNotOptimize(p.data());
  }
}
// Now: the online softmax's step of attention_tiles.hpp on the same block
// (running max, shifted scores, one oneDNN exp over the block, sums).
void softmax_online(benchmark::State& st) {
  const std::vector<float> s0 = scores();
  std::vector<float> p = s0, m(size_t(block), -std::numeric_limits<float>::infinity()), l(size_t(block), 0.f);
  overlap::layers::local_exp<float> exp;
  const float scale = 0.125f;
  for (auto _ : st) {
    std::copy(s0.begin(), s0.end(), p.begin());
    each_row(p, [&](float* row, int64_t r, int64_t lim) {
      const float m_new = std::max(m[size_t(r)], overlap::layers::attention::row_max(row, lim) * scale);
      for (int64_t j = 0; j < lim; ++j) row[j] = row[j] * scale - m_new;
      std::fill(row + lim, row + seq, 0.f);
      m[size_t(r)] = m_new;
    });
    exp(p.data(), block * seq);
    each_row(p, [&](float* row, int64_t r, int64_t lim) {
      std::fill(row + lim, row + seq, 0.f);
      l[size_t(r)] = overlap::layers::attention::row_sum(row, lim);
    });
    std::fill(m.begin(), m.end(), -std::numeric_limits<float>::infinity());
    benchmark::DoNotOptimize(p.data());
  }
}

// The block's attention now (attention/softmax_attention.hpp): scale and mask
// the whole rows, then oneDNN's softmax primitive.
void softmax_primitive(benchmark::State& st) {
  const std::vector<float> s0 = scores();
  std::vector<float> p = s0;
  overlap::layers::local_primitives prims;
  const float scale = 0.125f;
  for (auto _ : st) {
    std::copy(s0.begin(), s0.end(), p.begin());
    each_row(p, [&](float* row, int64_t, int64_t lim) {
      for (int64_t j = 0; j < lim; ++j) row[j] *= scale;
      std::fill(row + lim, row + seq, -std::numeric_limits<float>::infinity());
    });
    prims.softmax(p.data(), block, seq);
    benchmark::DoNotOptimize(p.data());
  }
}

/// The probabilities of the block (masked rows) and a gradient for them.
struct softmax_grad_data {
  std::vector<float> p = scores(), dp = values("dp", block*seq), ds = std::vector<float>(size_t(block * seq));
  softmax_grad_data() {
    each_row(p, [](float* row, int64_t, int64_t lim) {
      float sum = 0;
      for (int64_t j = 0; j < lim; ++j) sum += row[j] = std::exp(row[j] * 0.125f);
      for (int64_t j = 0; j < lim; ++j) row[j] /= sum;
      std::fill(row + lim, row + seq, 0.f);
    });
  }
};
// The softmax's backward with scalar loops: dS = P (dP - sum over the row of dP P).
void softmax_backward_loops(benchmark::State& st) {
  softmax_grad_data d;
  for (auto _ : st) {
    for (int64_t r = 0; r < block; ++r) {
      const float *p = d.p.data() + r * seq, *dp = d.dp.data() + r * seq;
      float* ds = d.ds.data() + r * seq;
      double dot = 0;
      for (int64_t j = 0; j < seq; ++j) dot += double(p[j]) * dp[j];
      for (int64_t j = 0; j < seq; ++j) ds[j] = p[j] * (dp[j] - float(dot));
    }
    benchmark::DoNotOptimize(d.ds.data());
  }
}
void softmax_backward_primitive(benchmark::State& st) {
  softmax_grad_data d;
  overlap::layers::local_primitives prims;
  for (auto _ : st) {
    prims.softmax_backward(d.p.data(), d.dp.data(), d.ds.data(), block, seq);
    benchmark::DoNotOptimize(d.ds.data());
  }
}

}  // namespace

BENCHMARK(layer_norm_loops)->Unit(benchmark::kMicrosecond);
BENCHMARK(layer_norm_onednn)->Unit(benchmark::kMicrosecond);
BENCHMARK(layer_norm_backward_loops)->Unit(benchmark::kMicrosecond);
BENCHMARK(layer_norm_backward_onednn)->Unit(benchmark::kMicrosecond);
BENCHMARK(gelu_loops)->Unit(benchmark::kMicrosecond);
BENCHMARK(gelu_onednn)->Unit(benchmark::kMicrosecond);
BENCHMARK(gelu_backward_loops)->Unit(benchmark::kMicrosecond);
BENCHMARK(gelu_backward_onednn)->Unit(benchmark::kMicrosecond);
BENCHMARK(softmax_loops)->Unit(benchmark::kMicrosecond);
BENCHMARK(softmax_online)->Unit(benchmark::kMicrosecond);
BENCHMARK(softmax_primitive)->Unit(benchmark::kMicrosecond);
BENCHMARK(softmax_backward_loops)->Unit(benchmark::kMicrosecond);
BENCHMARK(softmax_backward_primitive)->Unit(benchmark::kMicrosecond);
BENCHMARK_MAIN();
