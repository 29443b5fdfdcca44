#pragma once
/// @file
/// The local math of ring attention: one tile (a run of this rank's queries
/// against a run of one K/V block's keys) of the forward pass, with an
/// online softmax (a running maximum and sum per query row and head), and
/// of the backward pass. Local: no communication. Row-major; every matrix
/// holds `heads` heads of dh columns side by side (head h at column h * dh).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <utility>
#include <vector>

#include "overlap/backend/sampled_work.hpp"
#include "overlap/kernels/local_exp.hpp"
#include "overlap/kernels/local_gemm.hpp"
#include "overlap/mpi/workspace_allocator.hpp"
#include "overlap/schedule/model.hpp"

namespace overlap::layers::attention {

/// The sizes every tile shares.
struct dims {
  ///@{
  /// Heads, head width, and query rows per block (a tile's scores are
  /// computed `block` query rows at a time: scratch of block x keys).
  int64_t heads = 0, dh = 0, block = 256;
  ///@}
  [[nodiscard]] int64_t width() const { return heads * dh; }                  ///< heads * dh
  [[nodiscard]] double scale() const { return 1.0 / std::sqrt(double(dh)); }  ///< 1 / sqrt(dh)
};

/// Queries [q_begin, q_begin + q_rows) of this rank's rows against keys
/// [k_begin, k_begin + k_rows) of a K/V block. `diagonal`: the two runs are
/// the same chunk of the sequence (q_rows == k_rows) and query i sees keys
/// 0..i of it (the causal mask); otherwise every key is seen.
struct tile {
  ///@{
  /// The query run and the key run.
  int64_t q_begin = 0, q_rows = 0, k_begin = 0, k_rows = 0;
  ///@}
  bool diagonal = false;  ///< the causal mask applies inside the tile
};

/// One K/V block: K and V, rows x width each, rows ld apart.
template <class A>
struct kv_block {
  const A* k = nullptr;  ///< the keys
  const A* v = nullptr;  ///< the values
  int64_t ld = 0;        ///< elements between rows
};

/// Queries: rows ld apart (heads side by side in each row).
template <class A>
struct query_rows {
  const A* q = nullptr;  ///< row 0
  int64_t ld = 0;        ///< elements between rows
};

/// The forward pass's running state for this rank's `rows` queries: the
/// unnormalised output (rows x width, dense), and per head and row (heads x
/// rows) the running maximum of the scaled scores and the running sum of
/// their exponentials relative to it.
template <class A>
struct online_softmax {
  A* o = nullptr;    ///< rows x width
  A* max = nullptr;  ///< heads x rows, starts at -infinity
  A* sum = nullptr;  ///< heads x rows, starts at 0
  int64_t rows = 0;  ///< this rank's queries
};

/// What the backward pass reads for this rank's `rows` queries (dense,
/// rows x width; heads x rows for lse and delta).
template <class A>
struct backward_rows {
  query_rows<A> q;           ///< the queries
  const A* d_o = nullptr;    ///< d(loss)/d(output)
  const A* lse = nullptr;    ///< the forward pass's log-sum-exp of the scaled scores
  const A* delta = nullptr;  ///< per head and row: d_o . o
  int64_t rows = 0;          ///< this rank's queries
};

/// Where the backward pass adds its gradients: dq for this rank's queries
/// (rows x width, dense) and dk, dv for the block's keys (rows ld apart).
template <class A>
struct tile_grads {
  A* dq = nullptr;    ///< this rank's rows
  int64_t dq_ld = 0;  ///< of dq
  A* dk = nullptr;    ///< the block's rows
  A* dv = nullptr;    ///< the block's rows
  int64_t ld = 0;     ///< of dk and dv
};

/// The largest of x[0..n) (-infinity when n is 0) and the sum of x[0..n):
/// reductions in 16 independent lanes, which the compiler vectorises (one
/// running value would be a chain of dependent scalar operations, a third
/// of the forward pass's time at head width 64).
template <class A>
A row_max(const A* x, int64_t n) {
  constexpr int lanes = 16;
  A m[lanes];
  std::fill(m, m + lanes, -std::numeric_limits<A>::infinity());
  int64_t j = 0;
  for (; j + lanes <= n; j += lanes)
    for (int l = 0; l < lanes; ++l) m[l] = x[j + l] > m[l] ? x[j + l] : m[l];
  for (; j < n; ++j) m[0] = x[j] > m[0] ? x[j] : m[0];
  return *std::max_element(m, m + lanes);
}
/// The sum of x[0..n), in 16 lanes (see row_max).
template <class A>
A row_sum(const A* x, int64_t n) {
  constexpr int lanes = 16;
  A s[lanes] = {};
  int64_t j = 0;
  for (; j + lanes <= n; j += lanes)
    for (int l = 0; l < lanes; ++l) s[l] += x[j + l];
  for (; j < n; ++j) s[0] += x[j];
  A total = 0;
  for (A v : s) total += v;
  return total;
}

/// The tiles' GEMMs, exponentials and scratch. Not thread-safe.
template <class A>
class tile_math {
 public:
  /// Called after every block of queries: under progress_policy::poll,
  /// tests the ring's transfers (MPI moves large messages only inside MPI
  /// calls). None by default.
  void on_block(std::function<void()> poll) { poll_ = std::move(poll); }
  /// How a tile's work reaches SimGrid SMPI's simulated time (sampled, then
  /// charged: backend::work_sampler); by default SMPI times it as it runs.
  /// A tile that polls (on_block) always runs and is timed by SMPI: its MPI
  /// tests cannot sit inside a charged burst.
  void sample_with(backend::work_sampler s) { sampler_ = s; }

  /// Folds the keys of tile t into the online softmax of its queries.
  void forward(const dims& d, query_rows<A> q, kv_block<A> kv, const tile& t, online_softmax<A> st) {
    sampled("attention tile", d, t, [&] { forward_tile(d, q, kv, t, st); });
  }

  /// Adds tile t's share of the gradients: dq of its queries, dk and dv of its keys.
  void backward(const dims& d, const backward_rows<A>& in, kv_block<A> kv, const tile& t, tile_grads<A> g) {
    sampled("attention tile backward", d, t, [&] { backward_tile(d, in, kv, t, g); });
  }

 private:
  template <class F>
  void sampled(const char* kind, const dims& d, const tile& t, F&& body) {
    if (poll_) return body();
    sampler_(kind, {t.q_rows, t.k_rows, (d.heads << 20) + d.dh, 2 * d.block + (t.diagonal ? 1 : 0)}, body);
  }
  void forward_tile(const dims& d, query_rows<A> q, kv_block<A> kv, const tile& t, online_softmax<A> st) {
    const int64_t w = d.width();
    const A scale = A(d.scale());
    each_block(d, t, [&](const query_block& b) {
      const int64_t h = b.head, c = h * d.dh, i0 = b.i0, mb = b.mb, kn = b.kn, row0 = t.q_begin + i0;
      A* p = scratch(p_, mb * kn);
      gemm_.run(product::abt, mb, kn, d.dh, {q.q + row0 * q.ld + c, q.ld, kv.k + t.k_begin * kv.ld + c, kv.ld, p, kn});
      alpha_.resize(size_t(mb));
      for (int64_t i = 0; i < mb; ++i) {
        A* row = p + i * kn;
        const int64_t lim = visible(t, i0 + i, kn);
        const A mx = row_max(row, lim);
        A& m = st.max[h * st.rows + row0 + i];
        const A m_new = std::max(m, mx * scale);
        alpha_[size_t(i)] = std::isinf(m) ? A(0) : std::exp(m - m_new);
        m = m_new;
        for (int64_t j = 0; j < lim; ++j) row[j] = row[j] * scale - m_new;
        std::fill(row + lim, row + kn, A(0));
      }
      exp_(p, mb * kn);
      for (int64_t i = 0; i < mb; ++i) {
        A* row = p + i * kn;
        const int64_t lim = visible(t, i0 + i, kn);
        std::fill(row + lim, row + kn, A(0));
        const A s = row_sum(row, lim);
        A& l = st.sum[h * st.rows + row0 + i];
        const A a = alpha_[size_t(i)];
        l = l * a + s;
        A* o = st.o + (row0 + i) * w + c;
        for (int64_t j = 0; j < d.dh; ++j) o[j] *= a;
      }
      gemm_.run(product::ab, mb, d.dh, kn, {p, kn, kv.v + t.k_begin * kv.ld + c, kv.ld, st.o + row0 * w + c, w},
                into::add);
      if (poll_) poll_();
    });
  }

  void backward_tile(const dims& d, const backward_rows<A>& in, kv_block<A> kv, const tile& t, tile_grads<A> g) {
    const int64_t w = d.width();
    const A scale = A(d.scale());
    each_block(d, t, [&](const query_block& b) {
      const int64_t h = b.head, c = h * d.dh, i0 = b.i0, mb = b.mb, kn = b.kn, row0 = t.q_begin + i0;
      const A *k = kv.k + t.k_begin * kv.ld + c, *v = kv.v + t.k_begin * kv.ld + c;
      A *dk = g.dk + t.k_begin * g.ld + c, *dv = g.dv + t.k_begin * g.ld + c;
      const A *q = in.q.q + row0 * in.q.ld + c, *d_o = in.d_o + row0 * w + c;
      A *p = scratch(p_, mb * kn), *dp = scratch(dp_, mb * kn);
      gemm_.run(product::abt, mb, kn, d.dh, {q, in.q.ld, k, kv.ld, p, kn});  // S = Q K^T
      for (int64_t i = 0; i < mb; ++i) {                                     // P = exp(scale S - lse)
        A* row = p + i * kn;
        const int64_t lim = visible(t, i0 + i, kn);
        const A lse = in.lse[h * in.rows + row0 + i];
        for (int64_t j = 0; j < lim; ++j) row[j] = row[j] * scale - lse;
        std::fill(row + lim, row + kn, A(0));
      }
      exp_(p, mb * kn);
      for (int64_t i = 0; i < mb; ++i) std::fill(p + i * kn + visible(t, i0 + i, kn), p + (i + 1) * kn, A(0));
      gemm_.run(product::atb, kn, d.dh, mb, {p, kn, d_o, w, dv, g.ld}, into::add);  // dV += P^T dO
      gemm_.run(product::abt, mb, kn, d.dh, {d_o, w, v, kv.ld, dp, kn});            // dP = dO V^T
      for (int64_t i = 0; i < mb; ++i) {                                            // dS = P (dP - delta) scale
        const A delta = in.delta[h * in.rows + row0 + i];
        for (int64_t j = 0; j < kn; ++j) dp[i * kn + j] = p[i * kn + j] * (dp[i * kn + j] - delta) * scale;
      }
      gemm_.run(product::ab, mb, d.dh, kn, {dp, kn, k, kv.ld, g.dq + row0 * g.dq_ld + c, g.dq_ld},
                into::add);                                                              // dQ += dS K
      gemm_.run(product::atb, kn, d.dh, mb, {dp, kn, q, in.q.ld, dk, g.ld}, into::add);  // dK += dS^T Q
      if (poll_) poll_();
    });
  }

 public:
  /// The GEMMs (m x n x k) that forward() (or backward()) runs for tile t,
  /// in its order: what the cost model prices (attention_work).
  static void products(const dims& d, const tile& t, bool backward, std::vector<overlap::detail::gemm_work>& out) {
    each_block(d, t, [&](const query_block& b) {
      const int64_t mb = b.mb, kn = b.kn;
      if (!backward) {
        out.push_back({mb, kn, d.dh}), out.push_back({mb, d.dh, kn});  // S = Q K^T; O += P V
        return;
      }
      // S = Q K^T; dV += P^T dO; dP = dO V^T; dQ += dS K; dK += dS^T Q.
      out.insert(out.end(), {{mb, kn, d.dh}, {kn, d.dh, mb}, {mb, kn, d.dh}, {mb, d.dh, kn}, {kn, d.dh, mb}});
    });
  }

 private:
  // A head's block of a tile's queries [i0, i0 + mb) and the kn keys it sees.
  struct query_block {
    int64_t head, i0, mb, kn;
  };
  // Calls f(query_block) for every head and block of tile t's queries that
  // sees any key.
  template <class F>
  static void each_block(const dims& d, const tile& t, F&& f) {
    for (int64_t h = 0; h < d.heads; ++h)
      for (int64_t i0 = 0; i0 < t.q_rows; i0 += d.block) {
        const int64_t mb = std::min(d.block, t.q_rows - i0), kn = keys(t, i0, mb);
        if (kn > 0) f(query_block{h, i0, mb, kn});
      }
  }
  // The keys any query of rows [i0, i0 + mb) of tile t sees.
  static int64_t keys(const tile& t, int64_t i0, int64_t mb) {
    return t.diagonal ? std::min(t.k_rows, i0 + mb) : t.k_rows;
  }
  // The keys query i of tile t sees, of the kn computed for its block.
  static int64_t visible(const tile& t, int64_t i, int64_t kn) { return t.diagonal ? std::min(kn, i + 1) : kn; }
  static A* scratch(workspace_vector<A>& v, int64_t n) {
    if (v.size() < size_t(n)) v.resize(size_t(n));
    return v.data();
  }

  local_gemm<A> gemm_;
  local_exp<A> exp_;
  workspace_vector<A> p_, dp_;  // block x keys each: shared by the simulated ranks in timing-only runs
  std::vector<A> alpha_;
  std::function<void()> poll_;
  backend::work_sampler sampler_;
};

/// The softmax's backward term of every head and row (delta, heads x
/// rows): the sum over keys of dP_ij P_ij, which equals dO_i . O_i. d_o is
/// rows x width (dense); o(i, j) gives the forward output's entry as A.
template <class A, class O>
void softmax_deltas(const dims& d, int64_t rows, const A* d_o, O&& o, A* delta) {
  const int64_t w = d.width();
  for (int64_t h = 0; h < d.heads; ++h)
    for (int64_t i = 0; i < rows; ++i) {
      A sum = 0;
      for (int64_t j = h * d.dh; j < (h + 1) * d.dh; ++j) sum += d_o[i * w + j] * o(i, j);
      delta[h * rows + i] = sum;
    }
}

/// Ends an online softmax: st.o divided by each row's sum (per head), and
/// lse (heads x rows, ld rows) = the rows' log-sum-exp of the scaled scores.
template <class A>
void normalise(const dims& d, online_softmax<A> st, A* lse) {
  const int64_t w = d.width();
  for (int64_t h = 0; h < d.heads; ++h)
    for (int64_t i = 0; i < st.rows; ++i) {
      const A l = st.sum[h * st.rows + i], inv = l > 0 ? A(1) / l : A(0);
      A* o = st.o + i * w + h * d.dh;
      for (int64_t j = 0; j < d.dh; ++j) o[j] *= inv;
      lse[h * st.rows + i] = l > 0 ? st.max[h * st.rows + i] + std::log(l) : -std::numeric_limits<A>::infinity();
    }
}

}  // namespace overlap::layers::attention
