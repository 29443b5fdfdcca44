#pragma once
/// @file
/// Causal softmax attention of a whole sequence on one rank, in float, on
/// oneDNN's softmax primitive, forward and backward: the transformer
/// block's attention when it has no context-parallel axis. A block of query
/// rows is scored against every key its rows see, so each score row is
/// whole and the primitive normalises it directly (no running maximum and
/// sum, which ring attention needs because its keys arrive in pieces: see
/// attention/attention_tiles.hpp). The backward pass recomputes the
/// probabilities with the same primitive instead of keeping them. Local: no
/// communication.

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "overlap/attention/attention_tiles.hpp"
#include "overlap/kernels/local_gemm.hpp"
#include "overlap/kernels/local_primitives.hpp"
#include "overlap/mpi/workspace_allocator.hpp"

namespace overlap::layers::attention {

/// Queries i = 0..rows-1 against keys 0..i, per head, in blocks of d.block
/// query rows. Row-major; heads side by side (head h at column h * dh). Not
/// thread-safe.
class softmax_attention {
 public:
  /// o (rows x width, dense) = softmax(q k^T * scale, causal) v per head.
  void forward(const dims& d, int64_t rows, query_rows<float> q, kv_block<float> kv, float* o) {
    const int64_t w = d.width();
    for (int64_t h = 0; h < d.heads; ++h)
      for (int64_t i0 = 0; i0 < rows; i0 += d.block) {
        const int64_t mb = std::min(d.block, rows - i0), kn = i0 + mb, c = h * d.dh;
        float* p = probabilities(d, {h, i0, mb}, q, kv);
        gemm_.run(product::ab, mb, d.dh, kn, {p, kn, kv.v + c, kv.ld, o + i0 * w + c, w});  // O = P V
      }
  }

  /// dq, dk, dv (overwritten; g.dq is rows x width with ld g.dq_ld, dk and
  /// dv rows ld g.ld apart) for d_o = d(loss)/d(o) (rows x width, dense).
  void backward(const dims& d, int64_t rows, query_rows<float> q, kv_block<float> kv, const float* d_o,
                tile_grads<float> g) {
    const int64_t w = d.width();
    const auto scale = float(d.scale());
    for (int64_t i = 0; i < rows; ++i) {
      std::fill(g.dq + i * g.dq_ld, g.dq + i * g.dq_ld + w, 0.f);
      std::fill(g.dk + i * g.ld, g.dk + i * g.ld + w, 0.f);
      std::fill(g.dv + i * g.ld, g.dv + i * g.ld + w, 0.f);
    }
    for (int64_t h = 0; h < d.heads; ++h)
      for (int64_t i0 = 0; i0 < rows; i0 += d.block) {
        const int64_t mb = std::min(d.block, rows - i0), kn = i0 + mb, c = h * d.dh;
        const float *qb = q.q + i0 * q.ld + c, *dob = d_o + i0 * w + c;
        float* p = probabilities(d, {h, i0, mb}, q, kv);
        float* dp = scratch(dp_, mb * kn);
        gemm_.run(product::atb, kn, d.dh, mb, {p, kn, dob, w, g.dv + c, g.ld}, into::add);  // dV += P^T dO
        gemm_.run(product::abt, mb, kn, d.dh, {dob, w, kv.v + c, kv.ld, dp, kn});           // dP = dO V^T
        prims_.softmax_backward(p, dp, dp, mb, kn);  // dS = P (dP - rowsum(dP P)): every key of each row is here
        for (int64_t j = 0; j < mb * kn; ++j) dp[j] *= scale;  // through the scores' scale
        gemm_.run(product::ab, mb, d.dh, kn, {dp, kn, kv.k + c, kv.ld, g.dq + i0 * g.dq_ld + c, g.dq_ld});  // dQ
        gemm_.run(product::atb, kn, d.dh, mb, {dp, kn, qb, q.ld, g.dk + c, g.ld}, into::add);  // dK += dS^T Q
      }
  }

 private:
  /// A block of query rows of one head.
  struct rows_of {
    int64_t head, first, count;
  };
  /// P (count x the keys up to the block's last row, dense, in p_) =
  /// softmax of the block's scaled scores with the causal mask.
  float* probabilities(const dims& d, rows_of b, query_rows<float> q, kv_block<float> kv) {
    const int64_t kn = b.first + b.count, c = b.head * d.dh;
    const auto scale = float(d.scale());
    float* p = scratch(p_, b.count * kn);
    gemm_.run(product::abt, b.count, kn, d.dh, {q.q + b.first * q.ld + c, q.ld, kv.k + c, kv.ld, p, kn});  // Q K^T
    for (int64_t i = 0; i < b.count; ++i) {
      float* row = p + i * kn;
      const int64_t seen = b.first + i + 1;
      for (int64_t j = 0; j < seen; ++j) row[j] *= scale;
      std::fill(row + seen, row + kn, -std::numeric_limits<float>::infinity());  // softmax gives them 0
    }
    prims_.softmax(p, b.count, kn);
    return p;
  }
  static float* scratch(workspace_vector<float>& v, int64_t n) {
    if (v.size() < size_t(n)) v.resize(size_t(n));
    return v.data();
  }

  local_gemm<float> gemm_;
  local_primitives prims_;
  workspace_vector<float> p_, dp_;  // shared by the simulated ranks in timing-only runs
};

}  // namespace overlap::layers::attention
