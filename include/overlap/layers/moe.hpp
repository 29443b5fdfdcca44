#pragma once
/// @file
/// A mixture-of-experts MLP with expert parallelism (docs/layer.md,
/// "Mixture of experts"): a top-k softmax router, dispatch and the experts'
/// first GEMM (all_to_all_matmul), GELU, the experts' second GEMM and
/// combine (matmul_all_to_all), and each token's outputs summed with its
/// gates; the backward pass runs the same two all-to-alls the other way
/// (with the weights read transposed). Header-only.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "overlap/backend/gemm.hpp"
#include "overlap/core/matrix.hpp"
#include "overlap/engine/side_work.hpp"
#include "overlap/kernels/local_gelu.hpp"
#include "overlap/kernels/local_gemm.hpp"
#include "overlap/layers/phase_span.hpp"
#include "overlap/mpi/simulator.hpp"
#include "overlap/ops/all_to_all_matmul.hpp"
#include "overlap/ops/expert_counts.hpp"
#include "overlap/ops/matmul_all_to_all.hpp"
#include "overlap/ops/pending.hpp"
#include "overlap/runtime/agreement.hpp"
#include "overlap/runtime/context.hpp"

namespace overlap::layers {

/// How moe_mlp runs. Every field must agree across ranks.
struct moe_options {
  int64_t width = 0;         ///< K: the model's width (x's columns)
  int64_t ffn = 0;           ///< F: an expert's inner width
  int experts_per_rank = 1;  ///< E: experts on every rank; G = E x ranks experts in all
  int topk = 2;              ///< experts per token (1 <= topk <= G)
  /// Of both all-to-alls, forward and backward: bulk, pairwise or automatic.
  /// With bulk nothing overlaps (the baseline): the backward's last
  /// exchange ends before the experts' weight gradients start.
  overlap::strategy strategy = overlap::strategy::automatic;
  /// Unless bulk: run the experts' weight gradients in pieces inside the
  /// backward's last exchange's waits for its transfers, on the caller's
  /// thread (engine/side_work.hpp), rather than beside the started exchange
  /// on the context's worker thread. The default under SimGrid SMPI, where
  /// a started op runs to its end at start and nothing would overlap it.
  bool weight_gradients_in_waits = mpi::simulated;
};

/// The layer's parameters on this rank.
template <class T>
struct moe_weights {
  matrix_view<const T> router;  ///< K x G: the same on every rank
  matrix_view<const T> w1;      ///< E * K x F: this rank's experts' first weights, stacked (expert e: rows e * K ...)
  matrix_view<const T> w2;      ///< E * F x K: their second weights, stacked
};

/// Gradients of the parameters (overwritten). w1 and w2 are complete: only
/// this rank uses its experts. router is this rank's tokens' share: the sum
/// over the ranks (a data-parallel reduction the caller runs, as for any
/// replicated weight) is the whole gradient.
template <class T>
struct moe_gradients {
  matrix_view<T> router;  ///< K x G: this rank's tokens' share
  matrix_view<T> w1;      ///< E * K x F: this rank's experts', complete
  matrix_view<T> w2;      ///< E * F x K: this rank's experts', complete
};

/// Tokens per expert in the last forward pass.
struct moe_load {
  std::vector<int64_t> routed;    ///< per global expert (G): this rank's tokens routed to it
  std::vector<int64_t> received;  ///< per local expert (E): rows it received from every rank
};

/// y = sum over a token's top-k experts g_j * gelu(x W1_e) W2_e, with gates
/// g = the softmax of the chosen experts' router logits (x R). No token is
/// dropped: every expert takes every row routed to it. The router picks
/// the topk largest logits, ties to the lower expert index. T: float
/// (oneDNN) or double (Eigen).
///
/// Collective over ctx: every rank calls forward (and backward) together,
/// with the same widths and options; token counts are each rank's own (any,
/// including zero). Bad input on any rank raises std::invalid_argument on
/// every rank.
template <class T>
class moe_mlp {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "moe_mlp computes in float or double");

 public:
  /// A layer of opt's shape on ctx's ranks (checked by the first forward). Local.
  moe_mlp(context& ctx, const moe_options& opt)
      : ctx_(ctx), K_(opt.width), F_(opt.ffn), opt_(opt), G_(int64_t{opt.experts_per_rank} * ctx.size()) {}

  /// This rank's tokens x (T_r x K) into y (T_r x K). Collective. Keeps
  /// what backward needs (about (topk x (2K + F) + G) values per token).
  const moe_load& forward(matrix_view<const T> x, const moe_weights<T>& w, matrix_view<T> y) {
    check(x, w, y, "forward");
    engine::trace_recorder* tr = ctx_.tracer();
    tokens_ = x.rows;
    {
      detail::phase_span ph(tr, "router");
      copy_in(x, x_);
      route(w.router);
    }
    const int64_t S = counts_.sent_rows(), V = counts_.received_rows(), E = opt_.experts_per_rank;
    xd_.assign(size_t(V * K_), T(0));
    u_.assign(size_t(V * F_), T(0));
    o_.assign(size_t(S * K_), T(0));
    const a2a_options a2a{opt_.strategy};
    {
      detail::phase_span ph(tr, "dispatch + W1 (all_to_all_matmul)");
      all_to_all_matmul<T>(ctx_, {xs_.data(), S, K_}, w.w1, {u_.data(), V, F_}, {xd_.data(), V, K_}, counts_, a2a);
    }
    h_.resize(u_.size());
    {
      detail::phase_span ph(tr, "GELU");
      gelu_.forward(u_.data(), h_.data(), int64_t(u_.size()));
    }
    {
      detail::phase_span ph(tr, "W2 + combine (matmul_all_to_all)");
      matmul_all_to_all<T>(ctx_, {h_.data(), V, F_}, w.w2, {o_.data(), S, K_}, counts_, a2a);
    }
    detail::phase_span ph(tr, "gates");
    for (int64_t t = 0; t < tokens_; ++t) {
      T* yr = y.data + t * y.ld;
      std::fill(yr, yr + K_, T(0));
      for (int j = 0; j < opt_.topk; ++j) {
        const T g = gates_[size_t(t * opt_.topk + j)];
        const T* o = o_.data() + row_of(t, j) * K_;
        for (int64_t c = 0; c < K_; ++c) yr[c] += g * o[c];
      }
    }
    load_.routed.assign(counts_.send.begin(), counts_.send.end());
    load_.received.assign(size_t(E), 0);
    for (size_t i = 0; i < counts_.recv.size(); ++i) load_.received[i % size_t(E)] += counts_.recv[i];
    return load_;
  }

  /// From dy (T_r x K, the last forward's tokens): dx (T_r x K) and the
  /// gradients. Collective; w must be the forward's.
  void backward(matrix_view<const T> dy, const moe_weights<T>& w, matrix_view<T> dx, const moe_gradients<T>& g) {
    check_backward(dy, w, dx, g);
    engine::trace_recorder* tr = ctx_.tracer();
    const int64_t S = counts_.sent_rows(), V = counts_.received_rows();
    std::vector<T> dgate;
    {
      detail::phase_span ph(tr, "gates' gradient");
      dgate = output_grads(dy);
    }
    // dH = dO dispatched, times W2_e^T; dU = dH gelu'(U); dXs = dU times W1_e^T, combined.
    a2a_options a2a{opt_.strategy};
    a2a.transpose_w = true;
    du_.resize(size_t(V * F_)), doutd_.resize(size_t(V * K_)), dxs_.resize(size_t(S * K_));
    {
      detail::phase_span ph(tr, "dispatch dO + W2^T (all_to_all_matmul)");
      all_to_all_matmul<T>(ctx_, {dout_.data(), S, K_}, w.w2, {du_.data(), V, F_}, {doutd_.data(), V, K_}, counts_,
                           a2a);
      gelu_.backward(u_.data(), du_.data(), int64_t(du_.size()));
    }
    {
      // The experts' weight gradients need only what is here: they compute
      // while dXs's exchange runs (unless bulk).
      detail::phase_span ph(tr, "W1^T + combine dX, the experts' weight gradients meanwhile");
      engine::side_work dw;
      expert_grads(g, dw);
      const matrix_view<const T> dh{du_.data(), V, F_};
      const matrix_view<T> dxs{dxs_.data(), S, K_};
      if (opt_.strategy == overlap::strategy::bulk) {
        matmul_all_to_all<T>(ctx_, dh, w.w1, dxs, counts_, a2a);
      } else if (opt_.weight_gradients_in_waits) {
        engine::filling_waits fill(ctx_.requests(), dw);
        matmul_all_to_all<T>(ctx_, dh, w.w1, dxs, counts_, a2a);
      } else {
        pending exchange = start_matmul_all_to_all<T>(ctx_, dh, w.w1, dxs, counts_, a2a);
        dw.run_rest();  // on an exception, exchange's destructor waits for the op
        exchange.wait();
      }
      dw.run_rest();  // what the exchange's waits left
    }
    detail::phase_span ph(tr, "router's gradient");
    router_grads(dgate, w, g, dx);
    for (int64_t t = 0; t < tokens_; ++t)
      for (int j = 0; j < opt_.topk; ++j) {
        const T* d = dxs_.data() + row_of(t, j) * K_;
        T* out = dx.data + t * dx.ld;
        for (int64_t c = 0; c < K_; ++c) out[c] += d[c];
      }
  }

  /// The last forward's load. Local.
  [[nodiscard]] const moe_load& load() const noexcept { return load_; }

 private:
  /// The combine's output rows' gradients, dO = gate x dy (into dout_);
  /// returns the gates', dy . O.
  std::vector<T> output_grads(matrix_view<const T> dy) {
    const int k = opt_.topk;
    std::vector<T> dgate(size_t(tokens_ * k), T(0));
    std::vector<T>& dout = dout_;
    dout.assign(size_t(counts_.sent_rows() * K_), T(0));
    for (int64_t t = 0; t < tokens_; ++t)
      for (int j = 0; j < k; ++j) {
        const int64_t r = row_of(t, j);
        const T gate = gates_[size_t(t * k + j)];
        const T* d = dy.data + t * dy.ld;
        T dot = 0;
        for (int64_t c = 0; c < K_; ++c) dout[size_t(r * K_ + c)] = gate * d[c], dot += d[c] * o_[size_t(r * K_ + c)];
        dgate[size_t(t * k + j)] = dot;
      }
    return dgate;
  }
  /// The experts' weight gradients (from du_ and doutd_), as pieces of
  /// `work`, run in order: each expert's rows (from every rank) gathered,
  /// then its weight's gradient in runs of rows (engine::for_row_runs).
  void expert_grads(const moe_gradients<T>& g, engine::side_work& work) {
    const int64_t V = counts_.received_rows();
    for (int e = 0; e < opt_.experts_per_rank; ++e) {
      // dW1_e = Xd_e^T dU_e (K x F), dW2_e = H_e^T dO_e (F x K).
      weight_grad_pieces(work, e, {xd_.data(), V, K_}, {du_.data(), V, F_}, g.w1.block(e * K_, 0, K_, F_));
      weight_grad_pieces(work, e, {h_.data(), V, F_}, {doutd_.data(), V, K_}, g.w2.block(e * F_, 0, F_, K_));
    }
  }
  /// c = a_e^T b_e for local expert e's rows of a and b: a gather piece,
  /// then one per run of c's rows (short enough that a transfer completing
  /// meanwhile is not kept waiting long).
  void weight_grad_pieces(engine::side_work& work, int e, matrix_view<const T> a, matrix_view<const T> b,
                          matrix_view<T> c) {
    work.add([this, e, a, b] {
      grad_rows_ = gather_expert_rows(e, a, grad_a_);
      gather_expert_rows(e, b, grad_b_);
    });
    engine::for_row_runs(c.rows, engine::row_split{}, [&](int64_t first, int64_t rows) {
      work.add([this, first, rows, c] {
        gemm_atb(rows, c.cols, grad_rows_, grad_a_.data() + first, c.rows, grad_b_.data(), c.cols,
                 c.data + first * c.ld, c.ld);
      });
    });
  }
  /// c (m x n, ldc) = a^T b (a: k x m, lda; b: k x n, ldb) on the
  /// context's kernels, which SMPI charges as it charges the ops' GEMMs
  /// (docs/smpi.md, "Compute times"): a steady figure per shape, not each
  /// run's time on a shared machine.
  void gemm_atb(int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb, T* c, int64_t ldc) {
    gemm_desc d = gemm_desc::shape(m, n, k).strides(lda, ldb, ldc).transposed(true, false);
    d.types(dtype_of<T>(), dtype_of<T>());
    const gemm_operands io = gemm_operands().a(a).b(b).c(c);
    if (overlap::detail::run_degenerate(d, io)) return;
    // Bounded: a routing's row counts vary, so shapes do (the backend keeps a cache of its own).
    if (grad_kernels_.size() >= kernel_bound && grad_kernels_.count(d) == 0) grad_kernels_.clear();
    std::shared_ptr<const gemm_kernel>& kernel = grad_kernels_[d];
    if (!kernel) kernel = ctx_.make_kernel(d);
    kernel->run(io);
  }
  /// The router's gradient (this rank's tokens') and the router's part of
  /// dx (written: the experts' part is added after), through the softmax
  /// over the chosen logits.
  void router_grads(const std::vector<T>& dgate, const moe_weights<T>& w, const moe_gradients<T>& g,
                    matrix_view<T> dx) {
    const int k = opt_.topk;
    std::vector<T> dlogits(size_t(tokens_ * G_), T(0));
    for (int64_t t = 0; t < tokens_; ++t) {
      T mean = 0;
      for (int j = 0; j < k; ++j) mean += gates_[size_t(t * k + j)] * dgate[size_t(t * k + j)];
      for (int j = 0; j < k; ++j)
        dlogits[size_t(t * G_ + chosen_[size_t(t * k + j)])] =
            gates_[size_t(t * k + j)] * (dgate[size_t(t * k + j)] - mean);
    }
    gemm_.run(product::atb, K_, G_, tokens_, {x_.data(), K_, dlogits.data(), G_, g.router.data, g.router.ld});
    gemm_.run(product::abt, tokens_, K_, G_, {dlogits.data(), G_, w.router.data, w.router.ld, dx.data, dx.ld});
  }
  /// Collective: this rank's complaint (or none), agreed with every rank's.
  void agree(const std::string& why, const char* pass) {
    const std::string where = std::string("overlap::layers::moe_mlp::") + pass;
    overlap::detail::agree_on(ctx_,
                              why.empty()
                                  ? overlap::detail::failure()
                                  : overlap::detail::failure(overlap::detail::failure::kind::invalid_argument, why),
                              where);
    if (!overlap::detail::same_everywhere(
            ctx_,
            {K_, F_, opt_.experts_per_rank, opt_.topk, int64_t(opt_.strategy), int64_t(opt_.weight_gradients_in_waits)},
            where))
      throw std::invalid_argument(where + ": width, ffn and the options must agree across ranks");
  }
  template <class V>
  static void expect(std::string& why, const char* name, const V& v, int64_t rows, int64_t cols) {
    if (!why.empty()) return;
    if (v.rows != rows || v.cols != cols || v.ld < v.cols || (v.rows * v.cols > 0 && v.data == nullptr))
      why = std::string(name) + " must be " + std::to_string(rows) + " x " + std::to_string(cols) +
            " (ld >= cols, not null); got " + std::to_string(v.rows) + " x " + std::to_string(v.cols);
  }
  void expect_weights(std::string& why, const moe_weights<T>& w) const {
    const int64_t E = opt_.experts_per_rank;
    expect(why, "router", w.router, K_, G_);
    expect(why, "w1", w.w1, E * K_, F_);
    expect(why, "w2", w.w2, E * F_, K_);
  }
  void check(matrix_view<const T> x, const moe_weights<T>& w, matrix_view<T> y, const char* pass) {
    std::string why;
    if (opt_.experts_per_rank < 1 || opt_.topk < 1 || opt_.topk > G_ || K_ < 1 || F_ < 1)
      why = "experts_per_rank (" + std::to_string(opt_.experts_per_rank) + "), width and ffn must be positive and " +
            "topk (" + std::to_string(opt_.topk) + ") in 1.." + std::to_string(G_);
    expect(why, "x", x, x.rows, K_);
    expect(why, "y", y, x.rows, K_);
    expect_weights(why, w);
    agree(why, pass);
  }
  void check_backward(matrix_view<const T> dy, const moe_weights<T>& w, matrix_view<T> dx, const moe_gradients<T>& g) {
    std::string why;
    if (gates_.size() != size_t(tokens_ * opt_.topk) || tokens_ < 0) why = "backward needs a forward first";
    expect(why, "dy", dy, tokens_, K_);
    expect(why, "dx", dx, tokens_, K_);
    expect_weights(why, w);
    const int64_t E = opt_.experts_per_rank;
    expect(why, "router's gradient", g.router, K_, G_);
    expect(why, "w1's gradient", g.w1, E * K_, F_);
    expect(why, "w2's gradient", g.w2, E * F_, K_);
    agree(why, "backward");
  }
  static void copy_in(matrix_view<const T> v, std::vector<T>& out) {
    out.resize(size_t(v.rows * v.cols));
    for (int64_t i = 0; i < v.rows; ++i)
      std::memcpy(out.data() + i * v.cols, v.data + i * v.ld, size_t(v.cols) * sizeof(T));
  }
  /// The router: logits, the top-k experts and their gates; the rows of
  /// x in expert order (xs_), and the counts with every rank. Collective.
  void route(matrix_view<const T> router) {
    const int k = opt_.topk;
    std::vector<T> logits(size_t(tokens_ * G_));
    gemm_.run(product::ab, tokens_, G_, K_, {x_.data(), K_, router.data, router.ld, logits.data(), G_});
    chosen_.assign(size_t(tokens_ * k), 0);
    gates_.assign(size_t(tokens_ * k), T(0));
    std::vector<int> order(static_cast<size_t>(G_));
    for (int64_t t = 0; t < tokens_; ++t) {
      const T* l = logits.data() + t * G_;
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](int a, int b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
      const T top = l[order[0]];
      T sum = 0;
      for (int j = 0; j < k; ++j) sum += std::exp(l[order[size_t(j)]] - top);
      for (int j = 0; j < k; ++j) {
        chosen_[size_t(t * k + j)] = order[size_t(j)];
        gates_[size_t(t * k + j)] = std::exp(l[order[size_t(j)]] - top) / sum;
      }
    }
    // Rows grouped by global expert (rank-major: rank q's expert e is q * E + e), tokens in order.
    std::vector<int64_t> send(size_t(G_), 0);
    for (int c : chosen_) ++send[size_t(c)];
    std::vector<int64_t> next(size_t(G_) + 1, 0);
    for (int64_t g = 0; g < G_; ++g) next[size_t(g) + 1] = next[size_t(g)] + send[size_t(g)];
    rows_.assign(chosen_.size(), 0);
    xs_.resize(size_t(next.back() * K_));
    for (int64_t t = 0; t < tokens_; ++t)
      for (int j = 0; j < k; ++j) {
        const int64_t r = next[size_t(chosen_[size_t(t * k + j)])]++;
        rows_[size_t(t * k + j)] = r;
        std::memcpy(xs_.data() + r * K_, x_.data() + t * K_, size_t(K_) * sizeof(T));
      }
    counts_ = exchange_expert_counts(ctx_, opt_.experts_per_rank, std::move(send));
  }
  [[nodiscard]] int64_t row_of(int64_t t, int j) const { return rows_[size_t(t * opt_.topk + j)]; }
  /// Local expert e's rows of `all` (dispatched order: by source rank, then
  /// expert) into `out`, contiguous; returns their count.
  int64_t gather_expert_rows(int e, matrix_view<const T> all, std::vector<T>& out) const {
    const int E = opt_.experts_per_rank, R = ctx_.size();
    int64_t n = 0, at = 0;
    for (int q = 0; q < R; ++q)
      for (int f = 0; f < E; ++f) {
        const int64_t c = counts_.recv[size_t(q) * size_t(E) + size_t(f)];
        if (f == e && c > 0) {  // an empty block may have null data (memcpy's arguments must not be null)
          out.resize(size_t((n + c) * all.cols));
          std::memcpy(out.data() + n * all.cols, all.data + at * all.ld, size_t(c * all.cols) * sizeof(T));
          n += c;
        }
        at += c;
      }
    return n;
  }

  context& ctx_;
  int64_t K_, F_;
  moe_options opt_;
  int64_t G_;
  local_gemm<T> gemm_;
  local_gelu<T> gelu_;
  int64_t tokens_ = -1;
  std::vector<T> x_;  ///< the forward's tokens (dense)
  std::vector<int> chosen_;
  std::vector<T> gates_;
  std::vector<int64_t> rows_;               ///< (token, choice) -> row of xs_
  std::vector<T> xs_, xd_, u_, h_, o_;      ///< the forward's rows: sent, dispatched, before and after GELU, combined
  std::vector<T> dout_, du_, doutd_, dxs_;  ///< the backward's: dO, dU, dO dispatched, dx's experts' part
  std::vector<T> grad_a_, grad_b_;          ///< one expert's rows of a weight gradient's operands, gathered
  int64_t grad_rows_ = 0;                   ///< their rows
  std::map<gemm_desc, std::shared_ptr<const gemm_kernel>> grad_kernels_;  ///< the weight gradients' kernels by shape
  static constexpr size_t kernel_bound = 256;
  expert_counts counts_;
  moe_load load_;
};

}  // namespace overlap::layers
