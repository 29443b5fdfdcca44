// The identical sweep (tools/identical/compare.sh): a fixed list of calls
// of both ops, every layout x strategy x algorithm x element type, with
// rotating transposes, epilogues, shards, batches, accumulate and
// gathered_out, and each case's operands on each rank. Shared by
// tools/identical/outputs.cpp (which hashes the outputs, against old
// headers too: only the public API is used here) and the tests that check
// every case (priced_plan_test).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "overlap/overlap.hpp"

namespace overlap_sweep {

using overlap::bfloat16;

/// A value in [-1, 1) from (case, rank, index): the inputs of a case.
inline double input_value(uint64_t c, uint64_t rank, uint64_t i) {
  uint64_t x = (c * 0x9E3779B97F4A7C15ULL) ^ (rank * 0xC2B2AE3D27D4EB4FULL) ^ (i * 0x165667B19E3779F9ULL);
  x ^= x >> 33, x *= 0xFF51AFD7ED558CCDULL, x ^= x >> 33, x *= 0xC4CEB93FE1D7A5BBULL, x ^= x >> 33;
  return static_cast<double>(x >> 11) / static_cast<double>(1ULL << 52) - 1.0;
}

template <class T>
std::vector<T> filled(size_t n, uint64_t c, int rank, uint64_t salt) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = T(static_cast<float>(input_value(c, static_cast<uint64_t>(rank), salt + i)));
  return v;
}

enum class op { ag, rs };

/// One call of the sweep.
struct sweep_case {
  op which = op::ag;
  overlap::gathered g = overlap::gathered::lhs_rows;
  overlap::scattered s = overlap::scattered::rows;
  overlap::strategy strategy = overlap::strategy::ring;
  overlap::algorithm algorithm = overlap::algorithm::named;
  int dtype = 0;  ///< 0 f32, 1 bf16, 2 f64
  bool ta = false, tb = false, bias = false, accumulate = false, with_out = false;
  overlap::activation act = overlap::activation::none;
  int shards = 0;  ///< 0 balanced, 1 uneven, 2 rank 0 empty
  int64_t batch = 1;
  int64_t m = 40, n = 36, k = 44;
  int node_slots = 0;    ///< > 0: faked nodes of this many ranks (hierarchical)
  bool chunked = false;  ///< the context with 3 chunks per piece

  [[nodiscard]] std::string name() const {
    static const char* types[] = {"f32", "bf16", "f64"};
    std::string s0 =
        which == op::ag ? std::string("ag/") + overlap::to_string(g) : std::string("rs/") + overlap::to_string(s);
    return s0 + "/" + overlap::to_string(strategy) + "/" + overlap::to_string(algorithm) + "/" + types[dtype] +
           " m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) + (ta ? " a^T" : "") +
           (tb ? " b^T" : "") + " act=" + overlap::to_string(act) + (bias ? " +bias" : "") + (accumulate ? " +=" : "") +
           (with_out ? " +gathered_out" : "") + " shards=" + std::to_string(shards) +
           " batch=" + std::to_string(batch) + (node_slots > 0 ? " nodes_of=" + std::to_string(node_slots) : "") +
           (chunked ? " chunks=3" : "");
  }
};

/// This rank's extent of a sharded dimension of `total`.
inline int64_t shard_of(int64_t total, int shards, int rank, int size) {
  if (shards == 2) {  // rank 0 empty, the rest balanced
    if (size == 1) return total;
    if (rank == 0) return 0;
    const int64_t per = total / (size - 1);
    return rank <= total % (size - 1) ? per + 1 : per;
  }
  if (shards == 1) {  // uneven: rank r gets weight r + 1
    const int64_t w = static_cast<int64_t>(size) * (size + 1) / 2;
    int64_t before = 0;
    for (int r = 0; r < rank; ++r) before += total * (r + 1) / w;
    if (rank == size - 1) return total - before;
    return total * (rank + 1) / w;
  }
  return total / size + (rank < total % size ? 1 : 0);
}

/// A case's operands and options on rank r of R (inputs from (case id,
/// rank, index) alone).
template <class T>
struct operands {
  std::vector<T> a, b, c, out, bias;
  overlap::matrix_view<const T> av, bv;
  overlap::matrix_view<T> cv, ov;
  overlap::ag_options ag;
  overlap::rs_options rs;

  operands(const operands&) = delete;
  operands& operator=(const operands&) = delete;
  operands(const sweep_case& sc, int r, int R, uint64_t id) {
    // Logical shapes op(a): ma x ka, op(b): ka x nb, c: mc x nc.
    int64_t ma = 0, ka = 0, nb = 0, mc = 0, nc = 0, out_r = 0, out_c = 0;
    const int64_t M = sc.m, N = sc.n, K = sc.k;
    if (sc.which == op::ag) {
      switch (sc.g) {
        case overlap::gathered::lhs_rows: ma = shard_of(M, sc.shards, r, R), ka = K, nb = N, mc = M, nc = N; break;
        case overlap::gathered::lhs_cols: ma = M, ka = shard_of(K, sc.shards, r, R), nb = N, mc = M, nc = N; break;
        case overlap::gathered::rhs_rows: ma = M, ka = shard_of(K, sc.shards, r, R), nb = N, mc = M, nc = N; break;
        case overlap::gathered::rhs_cols: ma = M, ka = K, nb = shard_of(N, sc.shards, r, R), mc = M, nc = N; break;
      }
    } else {
      ma = M, ka = shard_of(K, sc.shards, r, R), nb = N;
      mc = sc.s == overlap::scattered::rows ? shard_of(M, sc.shards, r, R) : M;
      nc = sc.s == overlap::scattered::cols ? shard_of(N, sc.shards, r, R) : N;
    }
    // The stored b of lhs_cols and rhs_rows holds all K rows (lhs_cols) or
    // this rank's (rhs_rows); their a likewise.
    int64_t b_rows = ka;
    if (sc.which == op::ag && sc.g == overlap::gathered::lhs_cols) b_rows = K;
    int64_t a_cols = ka;
    if (sc.which == op::ag && sc.g == overlap::gathered::rhs_rows) a_cols = K;
    const bool lhs = sc.g == overlap::gathered::lhs_rows || sc.g == overlap::gathered::lhs_cols;
    if (sc.which == op::ag && sc.with_out) {
      out_r = lhs ? (sc.ta ? K : M) : (sc.tb ? N : K);
      out_c = lhs ? (sc.ta ? M : K) : (sc.tb ? K : N);
    }
    const int64_t a_sr = sc.ta ? a_cols : ma, a_sc = sc.ta ? ma : a_cols;
    const int64_t b_sr = sc.tb ? nb : b_rows, b_sc = sc.tb ? b_rows : nb;
    const int64_t B = sc.batch;
    const auto as = static_cast<size_t>(a_sr * a_sc), bs = static_cast<size_t>(b_sr * b_sc);
    const auto cs = static_cast<size_t>(mc * nc), os = static_cast<size_t>(out_r * out_c);
    a = filled<T>(as * B, id, r, 0), b = filled<T>(bs * B, id, r, 1U << 24);
    c = filled<T>(cs * B, id, r, 2U << 24), out.resize(os * B), bias = filled<T>(nc, id, r, 3U << 24);
    overlap::epilogue ep;
    ep.activation = sc.act;
    if (sc.bias) ep.bias = bias.data();
    overlap::batch batch{B, static_cast<int64_t>(as), static_cast<int64_t>(bs), static_cast<int64_t>(cs),
                         static_cast<int64_t>(os)};
    av = {a.data(), a_sr, a_sc}, bv = {b.data(), b_sr, b_sc};
    cv = {c.data(), mc, nc}, ov = {out.data(), out_r, out_c};
    ag.gathered = sc.g, ag.strategy = sc.strategy, ag.algorithm = sc.algorithm, ag.transpose_a = sc.ta;
    ag.transpose_b = sc.tb, ag.epilogue = ep, ag.accumulate = sc.accumulate, ag.batch = batch;
    rs.scattered = sc.s, rs.strategy = sc.strategy, rs.algorithm = sc.algorithm, rs.transpose_a = sc.ta;
    rs.transpose_b = sc.tb, rs.epilogue = ep, rs.accumulate = sc.accumulate, rs.batch = batch;
  }
};

/// The sweep: every op layout x strategy x algorithm x element type, each
/// with a rotating choice of transposes, epilogue, shards, batch,
/// accumulate and gathered_out, on two shapes (one piece per rank, and
/// larger pieces cut into 3 chunks).
inline std::vector<sweep_case> sweep(int R) {
  std::vector<sweep_case> all;
  std::vector<sweep_case> layouts;
  for (auto g : {overlap::gathered::lhs_rows, overlap::gathered::lhs_cols, overlap::gathered::rhs_rows,
                 overlap::gathered::rhs_cols}) {
    sweep_case c;
    c.which = op::ag, c.g = g;
    layouts.push_back(c);
  }
  for (auto s : {overlap::scattered::rows, overlap::scattered::cols}) {
    sweep_case c;
    c.which = op::rs, c.s = s;
    layouts.push_back(c);
  }
  const std::pair<overlap::strategy, overlap::algorithm> schedules[] = {
      {overlap::strategy::bulk, overlap::algorithm::named},
      {overlap::strategy::ring, overlap::algorithm::named},
      {overlap::strategy::bidirectional, overlap::algorithm::named},
      {overlap::strategy::hierarchical, overlap::algorithm::named},
      {overlap::strategy::bulk, overlap::algorithm::others},
      {overlap::strategy::automatic, overlap::algorithm::automatic}};
  int i = 0;
  for (const sweep_case& layout : layouts)
    for (const auto& [st, al] : schedules)
      for (int t = 0; t < 3; ++t)
        for (int shape = 0; shape < 2; ++shape, ++i) {
          sweep_case c = layout;
          c.strategy = st, c.algorithm = al, c.dtype = t;
          c.ta = (i % 4) == 1 || (i % 4) == 3;
          c.tb = (i % 4) >= 2;
          c.act = static_cast<overlap::activation>(i % 3);
          c.bias = (i % 5) < 2;
          c.shards = i % 3;
          c.batch = (i % 7) == 3 ? 3 : 1;
          c.accumulate = (i % 6) == 4;
          c.with_out = c.which == op::ag && (i % 4) == 2 && al != overlap::algorithm::others;
          if (st == overlap::strategy::hierarchical)
            c.node_slots = R % 2 == 0 && R >= 4 ? 2 : (R % 3 == 0 && R >= 6 ? 3 : 0);
          if (shape == 1) c.m = 130, c.n = 96, c.k = 150, c.chunked = true;
          all.push_back(c);
        }
  return all;
}

}  // namespace overlap_sweep
