// overlap-bench --op moe: one mixture-of-experts step of expert
// parallelism, measured every way side by side in one run. Every rank of a
// tensor group holds experts / ranks experts and its balanced block of the
// tokens; a router (made here, deterministic) sends each token to `topk`
// experts. The step is dispatch + the experts' first GEMM
// (all_to_all_matmul), then their second GEMM + combine (matmul_all_to_all);
// the activation between them and the gates' weighted sum are the layer's
// (layers/moe.hpp) and are not timed here; with --moe-layer the step is
// instead layers::moe_mlp's forward + backward (router, dispatch, experts,
// GELU, combine, gates; then the same two exchanges the other way and
// every gradient), on tokens whose first `experts` features tell the
// router the same routing. Rows: bulk (always), pairwise,
// automatic; compute only and comm only of bulk and of pairwise (the same
// schedule with transfers off, with GEMMs off); the limit is max(compute
// only, comm only) of pairwise (the layer's comm only: twice the two ops'
// transfers, as its backward exchanges rows of the same widths again). A
// sample of every rank's output rows is checked against the exact products
// in double (the layer's: its forward output).
#pragma once

#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <vector>

#include "measure.hpp"
#include "overlap/layers/moe.hpp"
#include "overlap/overlap.hpp"
#include "provenance.hpp"
#include "values.hpp"

namespace overlap::apps {

/// What --op moe reads of overlap-bench's options.
struct moe_setup {
  int64_t tokens = 4096;  ///< -m: the tokens of every rank of a group together
  int64_t width = 1024;   ///< -k: the model width
  int64_t ffn = 4096;     ///< -n: an expert's inner width
  int experts = 8;        ///< every expert of a group (a multiple of its ranks)
  int topk = 2;           ///< experts per token
  std::string skew = "uniform";
  std::vector<std::string> strategies{"pairwise", "automatic"};
  int iters = 5, warmup = 1;
  bool check = true;
  bool layer = false;  ///< --moe-layer: time layers::moe_mlp's forward + backward
  long drain_bytes = 0;
  int tp = 0;
  std::string json, transport;
};

/// The router's choice for global token i: `topk` distinct experts of G.
/// uniform: experts in rotation (every expert gets the same count, within
/// one); hot: expert 0 is one of the choices of 4 * topk of every G tokens
/// (4x the mean), the rest rotate over the other experts.
inline std::vector<int> experts_of(int64_t i, int G, int topk, bool hot) {
  std::vector<int> out;
  if (!hot) {
    for (int j = 0; j < topk; ++j) out.push_back(int((i * topk + j) % G));
    return out;
  }
  const bool with_hot = (i % G) < 4 * topk;
  if (with_hot) out.push_back(0);
  for (int j = 0; int(out.size()) < topk; ++j) out.push_back(1 + int((i * topk + j) % (G - 1)));
  return out;
}

template <class T>
class moe_bench {
 public:
  explicit moe_bench(const moe_setup& s)
      : s_(s),
        mesh_(MPI_COMM_WORLD, {{"dp", 0}, {"tp", s.tp > 0 ? s.tp : world_size()}}),
        R_(mesh_.size("tp")),
        p_(mesh_.coord("tp")),
        E_(s.experts / R_),
        printer_(world_rank() == 0) {
    if (s.experts % R_ != 0 || s.experts < R_)
      throw std::invalid_argument(
          fmt::format("--experts {} must be a positive multiple of the {} ranks of a group", s.experts, R_));
    if (s.topk < 1 || s.topk > s.experts || (s.skew == "hot" && (s.experts < 2 || s.topk > s.experts - 1)))
      throw std::invalid_argument(fmt::format("--topk {} does not fit {} experts{}", s.topk, s.experts,
                                              s.skew == "hot" ? " (hot: at most experts - 1)" : ""));
    if (s.layer && !has_layer) throw std::invalid_argument("--moe-layer runs f32 or f64 (moe_mlp's types)");
    if (s.layer && s.width < s.experts)
      throw std::invalid_argument(fmt::format(
          "--moe-layer needs -k ({}) at least --experts ({}): the router reads the routing from the first features",
          s.width, s.experts));
    route();
    if (s.layer) layer_inputs();
  }

  /// Measures every row, prints the table (rank 0), appends the JSON; 0 when every result was right.
  int run() {
    std::vector<std::string> names{"bulk"};
    for (const auto& n : s_.strategies)
      if (n != "bulk") names.push_back(n);
    std::vector<std::function<void()>> bodies;
    for (const auto& n : names) {
      bodies.push_back(body(full_, strategy_of(n)));
      bodies.back()();
      errors_.push_back(s_.check ? judge(n, s_.layer ? check_layer() : check()) : std::nan(""));
    }
    times_ = interleaved_median_max_ms(MPI_COMM_WORLD, s_.warmup, s_.iters, bodies, std::ref(drain_));
    for (const auto& n : names)
      if (n != "automatic") {
        compute_only_.push_back(median(body(compute_, strategy_of(n))));
        comm_only_.push_back(median(step(comm_, strategy_of(n))) * (s_.layer ? 2 : 1));
      } else {
        compute_only_.push_back(-1), comm_only_.push_back(-1);
      }
    names_ = names;
    if (printer_) {
      print();
      if (!s_.json.empty()) append_json();
    }
    return wrong_ == 0 ? 0 : 1;
  }

 private:
  static overlap::strategy strategy_of(const std::string& n) {
    overlap::strategy s = overlap::strategy::automatic;
    if (!overlap::parse_enum(n, s) ||
        (s != overlap::strategy::bulk && s != overlap::strategy::pairwise && s != overlap::strategy::automatic))
      throw std::invalid_argument("--op moe runs bulk, pairwise and automatic; not " + n);
    return s;
  }
  [[nodiscard]] overlap::context make_ctx(overlap::ring_phases ph) const {
    overlap::config cfg = overlap::config::from_env();
    cfg.phases = ph;
    return overlap::context(mesh_.comm("tp"), cfg);
  }

  /// The router's rows: this rank's (token, expert) pairs grouped by the
  /// expert's rank and local index, the counts, and the inputs.
  void route() {
    const overlap::shard_layout tokens = overlap::shard_layout::balanced(s_.tokens, R_);
    t0_ = tokens.offset(p_), local_tokens_ = tokens.size(p_);
    const int G = s_.experts;
    std::vector<std::vector<int64_t>> by_expert(static_cast<size_t>(G));
    for (int64_t i = t0_; i < t0_ + local_tokens_; ++i)
      for (int g : experts_of(i, G, s_.topk, s_.skew == "hot")) by_expert[size_t(g)].push_back(i);
    std::vector<int64_t> send;
    for (int g = 0; g < G; ++g) {  // global expert g = rank g / E, local expert g % E: rank-major already
      send.push_back(int64_t(by_expert[size_t(g)].size()));
      for (int64_t i : by_expert[size_t(g)]) rows_.push_back({i, g});
    }
    counts_ = overlap::exchange_expert_counts(full_, E_, send);
    const int64_t K = s_.width, F = s_.ffn;
    x_.resize(size_t(counts_.sent_rows() * K));
    for (size_t r = 0; r < rows_.size(); ++r)
      for (int64_t j = 0; j < K; ++j) x_[r * size_t(K) + size_t(j)] = from_float<T>(global_value(rows_[r].token, j, 1));
    w1_.resize(size_t(E_ * K * F)), w2_.resize(size_t(E_ * F * K));
    for (int e = 0; e < E_; ++e) {
      const int64_t g = int64_t(p_) * E_ + e;
      for (int64_t i = 0; i < K * F; ++i) {
        w1_[size_t(e * K * F + i)] = from_float<T>(global_value(g * K + i / F, i % F, 3) / 8);
        w2_[size_t(e * F * K + i)] = from_float<T>(global_value(g * F + i / K, i % K, 4) / 8);
      }
    }
    h_.resize(size_t(counts_.received_rows() * F));
    out_.resize(size_t(counts_.sent_rows() * K));
    int64_t mine[2] = {local_tokens_, counts_.received_rows()};
    MPI_Allreduce(MPI_IN_PLACE, mine, 2, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
    most_tokens_ = mine[0], most_received_ = mine[1];
  }

  /// One step on ctx with strategy s: dispatch + the first GEMM, the second + combine.
  std::function<void()> step(overlap::context& ctx, overlap::strategy s) {
    return [this, &ctx, s] {
      const int64_t K = s_.width, F = s_.ffn, S = counts_.sent_rows(), V = counts_.received_rows();
      const overlap::a2a_options opt{s};
      overlap::all_to_all_matmul<T>(ctx, {x_.data(), S, K}, {w1_.data(), E_ * K, F}, {h_.data(), V, F}, counts_, opt);
      overlap::matmul_all_to_all<T>(ctx, {h_.data(), V, F}, {w2_.data(), E_ * F, K}, {out_.data(), S, K}, counts_, opt);
    };
  }

  /// What a row times: the two ops, or the layer's forward + backward.
  std::function<void()> body(overlap::context& ctx, overlap::strategy s) {
    return s_.layer ? layer_step(ctx, s) : step(ctx, s);
  }

  static constexpr bool has_layer = std::is_same_v<T, float> || std::is_same_v<T, double>;
  /// moe_mlp computes in float or double; bf16 runs never make one.
  using layer_type = overlap::layers::moe_mlp<std::conditional_t<has_layer, T, float>>;

  /// The layer's inputs: this rank's tokens, whose first G features are 1
  /// for the experts route() chose and 0 for the others, a router that
  /// reads those features (8 x the identity), and the output's gradient.
  void layer_inputs() {
    const int64_t K = s_.width, G = s_.experts, n = local_tokens_;
    xt_.resize(size_t(n * K)), dy_.resize(size_t(n * K)), y_.resize(size_t(n * K)), dx_.resize(size_t(n * K));
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < K; ++j) {
        xt_[size_t(t * K + j)] = from_float<T>(j < G ? 0.0F : global_value(t0_ + t, j, 1));
        dy_[size_t(t * K + j)] = from_float<T>(global_value(t0_ + t, j, 5));
      }
    for (int64_t t = 0; t < n; ++t)
      for (int g : experts_of(t0_ + t, int(G), s_.topk, s_.skew == "hot")) xt_[size_t(t * K + g)] = from_float<T>(1);
    router_.assign(size_t(K * G), T(0));
    for (int64_t g = 0; g < G; ++g) router_[size_t(g * G + g)] = from_float<T>(8);
    grouter_.resize(router_.size()), gw1_.resize(w1_.size()), gw2_.resize(w2_.size());
  }

  /// One forward + backward of a layer of its own on ctx with strategy s.
  std::function<void()> layer_step(overlap::context& ctx, overlap::strategy s) {
    if constexpr (has_layer) {
      const int64_t K = s_.width, F = s_.ffn, n = local_tokens_;
      layers_.push_back(std::make_unique<layer_type>(ctx, overlap::layers::moe_options{K, F, E_, s_.topk, s}));
      layer_type* l = layers_.back().get();
      // The full context's steps are marked for tools/trace/render.py (its "=step NAME" window).
      const char* mark = s == overlap::strategy::bulk       ? "step bulk"
                         : s == overlap::strategy::pairwise ? "step pairwise"
                                                            : "step automatic";
      overlap::engine::trace_recorder* tr = &ctx == &full_ ? ctx.tracer() : nullptr;
      return [this, l, K, F, n, mark, tr] {
        overlap::layers::detail::phase_span whole(tr, mark);
        const overlap::layers::moe_weights<T> w{
            {router_.data(), K, s_.experts}, {w1_.data(), E_ * K, F}, {w2_.data(), E_ * F, K}};
        l->forward({xt_.data(), n, K}, w, {y_.data(), n, K});
        l->backward({dy_.data(), n, K}, w, {dx_.data(), n, K},
                    {{grouter_.data(), K, s_.experts}, {gw1_.data(), E_ * K, F}, {gw2_.data(), E_ * F, K}});
      };
    } else {
      (void)ctx, (void)s;
      throw std::invalid_argument("--moe-layer runs f32 or f64");
    }
  }

  /// The layer's forward output on a sample of this rank's tokens against
  /// sum over its experts of gate x gelu(x W1_g) W2_g in double (the gates
  /// equal: the chosen logits tie).
  double check_layer() {
    const int64_t K = s_.width, F = s_.ffn, n = local_tokens_;
    double num = 0, den = 0;
    const int64_t stride = std::max<int64_t>(1, n / 16);
    for (int64_t t = 0; t < n; t += stride) {
      std::vector<double> ref(size_t(K), 0.0);
      for (int g : experts_of(t0_ + t, s_.experts, s_.topk, s_.skew == "hot")) {
        std::vector<double> h(size_t(F), 0.0);
        for (int64_t j = 0; j < K; ++j)
          for (int64_t f = 0; f < F; ++f)
            h[size_t(f)] += double(xt_[size_t(t * K + j)]) * double(from_float<T>(global_value(g * K + j, f, 3) / 8));
        for (double& v : h) v = 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
        for (int64_t c = 0; c < K; ++c)
          for (int64_t f = 0; f < F; ++f)
            ref[size_t(c)] += h[size_t(f)] * double(from_float<T>(global_value(g * F + f, c, 4) / 8)) / s_.topk;
      }
      for (int64_t c = 0; c < K; ++c) {
        num = std::max(num, std::abs(double(y_[size_t(t * K + c)]) - ref[size_t(c)]));
        den = std::max(den, std::abs(ref[size_t(c)]));
      }
    }
    return den > 0 ? num / den : num;
  }

  /// max |out - ref| / max |ref| over a sample of this rank's rows (every
  /// rank's first, last and about 32 between), ref = (x W1_g) W2_g in double
  /// from the same inputs of type T.
  double check() {
    const int64_t K = s_.width, F = s_.ffn, S = counts_.sent_rows();
    double num = 0, den = 0;
    const int64_t stride = std::max<int64_t>(1, S / 32);
    for (int64_t r = 0; r < S; r += (r + stride < S || r == S - 1) ? stride : S - 1 - r) {
      const auto [token, g] = rows_[size_t(r)];
      std::vector<double> hrow(size_t(F), 0.0);
      for (int64_t j = 0; j < K; ++j) {
        const double xv = double(from_float<T>(global_value(token, j, 1)));
        for (int64_t f = 0; f < F; ++f)
          hrow[size_t(f)] += xv * double(from_float<T>(global_value(g * K + j, f, 3) / 8));
      }
      if (std::is_same_v<T, overlap::bfloat16>)  // h travels in T
        for (double& v : hrow) v = double(from_float<T>(float(v)));
      for (int64_t c = 0; c < K; ++c) {
        double ref = 0;
        for (int64_t f = 0; f < F; ++f)
          ref += hrow[size_t(f)] * double(from_float<T>(global_value(g * F + f, c, 4) / 8));
        num = std::max(num, std::abs(double(out_[size_t(r * K + c)]) - ref));
        den = std::max(den, std::abs(ref));
      }
      if (r == S - 1) break;
    }
    return den > 0 ? num / den : num;
  }
  double judge(const std::string& name, double err) {
    double worst = 0;
    MPI_Allreduce(&err, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (!(worst <= tolerance<T>())) {
      ++wrong_;
      if (printer_)
        fmt::print(stderr, "overlap-bench: moe {} gives a wrong result (max rel err {:.3e})\n", name, worst);
    }
    return worst;
  }
  double median(const std::function<void()>& body) {
    return median_max_ms(MPI_COMM_WORLD, s_.warmup, s_.iters, body, std::ref(drain_));
  }
  /// The schedule automatic ran last, in words (its plans' reports on rank 0).
  [[nodiscard]] std::string chosen() const {
    std::string out;
    for (const auto& r : full_.plan_reports())
      if (r.automatic) out += (out.empty() ? "" : "; ") + r.summary + ": " + r.schedule;
    return out;
  }
  [[nodiscard]] size_t reference() const {  // the first decomposed row with halves of its own
    for (size_t i = 1; i < names_.size(); ++i)
      if (compute_only_[i] >= 0) return i;
    return 0;
  }
  [[nodiscard]] double limit() const {
    const size_t i = reference();
    return std::max(compute_only_[i], comm_only_[i]);
  }
  [[nodiscard]] double flops() const {
    // The layer's backward runs each product twice more (the input's and the weight's gradients).
    return (s_.layer ? 12.0 : 4.0) * double(s_.tokens) * double(s_.topk) * double(s_.width) * double(s_.ffn);
  }

  void print() {
    fmt::print("overlap-bench: moe {}{} tokens={} width={} ffn={} experts={} top-{} skew={} ranks={} transport: {}\n",
               s_.layer ? "layer forward+backward " : "", to_string(overlap::dtype_of<T>()), s_.tokens, s_.width,
               s_.ffn, s_.experts, s_.topk, s_.skew, R_, transport_label(s_.transport, "unlabelled"));
    if (mesh_.size("dp") > 1)
      fmt::print("{} groups of {} ranks (dp x ep mesh) run the step at once, each on its own tokens\n",
                 mesh_.size("dp"), R_);
    fmt::print("{}\n", provenance_line());
    fmt::print("most tokens on a rank {}, most rows an expert rank receives {} (mean {})\n", most_tokens_,
               most_received_, s_.tokens * s_.topk / R_);
    fmt::print("median of {} iterations of the slowest rank; limit = max(compute only, comm only) of {}\n\n", s_.iters,
               names_[reference()]);
    fmt::print("{:<14}{:>10}{:>10}{:>10}{:>10}{:>12}{:>12}{:>13}\n", "strategy", "ms", "GFLOP/s", "x bulk", "/ limit",
               "compute", "comm", "max rel err");
    for (size_t i = 0; i < names_.size(); ++i)
      fmt::print("{:<14}{:>10.2f}{:>10.1f}{:>10.3f}{:>10.3f}{:>12.2f}{:>12.2f}{:>13.2e}\n", names_[i], times_[i],
                 flops() / times_[i] / 1e6, times_[0] / times_[i], times_[i] / limit(), compute_only_[i], comm_only_[i],
                 errors_[i]);
    const std::string c = chosen();
    if (!c.empty()) fmt::print("automatic: {}\n", c);
  }

  void append_json() {
    std::ofstream out(s_.json, std::ios::app);
    const nlohmann::json provenance = overlap::apps::provenance();
    const size_t ref = reference();
    for (size_t i = 0; i < names_.size(); ++i) {
      auto optional_ms = [](double v) { return v >= 0 ? nlohmann::json(v) : nlohmann::json(nullptr); };
      // The share of its transfers that a row's step hides: its own halves
      // (automatic, which has none, the reference schedule's).
      const size_t h = compute_only_[i] >= 0 ? i : ref;
      const double hidden =
          comm_only_[h] > 0 ? (compute_only_[h] + comm_only_[h] - times_[i]) / comm_only_[h] : std::nan("");
      nlohmann::json row{{"op", "moe"},
                         {"variant", s_.layer ? "layer forward+backward" : "dispatch+combine"},
                         {"strategy", names_[i]},
                         {"dtype", to_string(overlap::dtype_of<T>())},
                         {"ranks", R_},
                         {"tensor_groups", mesh_.size("dp")},
                         {"m", s_.tokens},
                         {"n", s_.ffn},
                         {"k", s_.width},
                         {"experts", s_.experts},
                         {"experts_per_rank", E_},
                         {"topk", s_.topk},
                         {"skew", s_.skew},
                         {"tokens_per_rank", s_.tokens / R_},
                         {"most_tokens_per_rank", most_tokens_},
                         {"most_received_rows", most_received_},
                         {"time_ms", times_[i]},
                         {"compute_only_ms", compute_only_[ref]},
                         {"comm_only_ms", comm_only_[ref]},
                         {"bulk_ms", times_[0]},
                         {"speedup_vs_bulk", times_[0] / times_[i]},
                         {"limit_ms", limit()},
                         {"ratio_to_limit", times_[i] / limit()},
                         {"hidden_fraction", std::isnan(hidden) ? nlohmann::json(nullptr) : nlohmann::json(hidden)},
                         {"own_compute_only_ms", optional_ms(compute_only_[i])},
                         {"own_comm_only_ms", optional_ms(comm_only_[i])},
                         {"max_rel_err", std::isnan(errors_[i]) ? nlohmann::json(nullptr) : nlohmann::json(errors_[i])},
                         {"checked", !std::isnan(errors_[i])},
                         {"schedule", names_[i] == "automatic" ? nlohmann::json(chosen()) : nlohmann::json(nullptr)},
                         {"transport", transport_label(s_.transport, "unlabelled")},
                         {"nodes", full_.nodes()},
                         {"iterations", s_.iters}};
      row.update(provenance);
      out << row.dump() << "\n";
    }
  }

  struct routed_row {
    int64_t token;
    int64_t expert;  ///< global
  };
  const moe_setup& s_;
  overlap::mesh mesh_;
  int R_, p_, E_;
  bool printer_;
  overlap::context full_ = make_ctx(overlap::ring_phases::both);
  overlap::context compute_ = make_ctx(overlap::ring_phases::compute_only);
  overlap::context comm_ = make_ctx(overlap::ring_phases::comm_only);
  link_drain drain_{MPI_COMM_WORLD, s_.drain_bytes};
  int64_t t0_ = 0, local_tokens_ = 0, most_tokens_ = 0, most_received_ = 0;
  std::vector<routed_row> rows_;  ///< x's rows: (token, expert), grouped by expert
  overlap::expert_counts counts_;
  std::vector<T> x_, w1_, w2_, h_, out_;
  std::vector<T> xt_, router_, y_, dy_, dx_, grouter_, gw1_, gw2_;  ///< --moe-layer's tokens, router, gradients
  std::vector<std::unique_ptr<layer_type>> layers_;                 ///< one per timed row (context, strategy)
  std::vector<std::string> names_;
  std::vector<double> times_, compute_only_, comm_only_, errors_;
  int wrong_ = 0;
};

}  // namespace overlap::apps
