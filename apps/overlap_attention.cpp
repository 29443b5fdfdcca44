// overlap-attention: ring attention (context parallelism) against the
// gather-first baseline, forward and backward, side by side in one run.
// Every rank holds its causal-split share of a sequence of --seq tokens.
// For each pass it reports the median over iterations of the slowest rank:
//   bulk       MPI_Allgatherv of K and V, then attention (and, backward,
//              MPI_Reduce_scatter of the keys' and values' gradients)
//   ring       K and V travel round the ring while each step computes
//   compute    the ring's computation alone (no transfers)
//   comm       the ring's transfers alone (no computation)
// ring's floor is max(compute, comm); bulk is about compute + its collectives.
#include <mpi.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <overlap/attention/ring_attention.hpp>
#include <overlap/layers/example_values.hpp>
#include <overlap/mpi/environment.hpp>
#include <overlap/runtime/context.hpp>

#include "common/cli.hpp"
#include "common/measure.hpp"
#include "common/provenance.hpp"

namespace {

struct options {
  int64_t seq = 8192, heads = 16, head_dim = 64, block = 256;
  std::string dtype = "f32";
  bool causal = true;
  int iters = 5, warmup = 1;
  long drain_bytes = 0;
  std::string json, transport;
};

template <class T>
T filled(const char* name, int64_t i, int64_t j) {
  return T(static_cast<float>(overlap::layers::example_value(name, i, j)));
}

/// One rank's tensors and the four ways to run each pass.
template <class T>
class bench {
 public:
  using A = overlap::attention_acc_t<T>;
  explicit bench(const options& o) : o_(o) {
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank), MPI_Comm_size(MPI_COMM_WORLD, &size);
    const overlap::causal_split split(o.seq, size);
    n_ = split.rows(rank), w_ = o.heads * o.head_dim;
    for (auto* v : {&q_, &k_, &v_, &o_out_, &do_, &dq_, &dk_, &dv_}) v->resize(size_t(n_ * w_));
    lse_.resize(size_t(o.heads * n_));
    for (int64_t i = 0; i < n_; ++i)
      for (int64_t j = 0; j < w_; ++j) {
        const int64_t p = split.position(rank, i);
        const size_t at = size_t(i * w_ + j);
        q_[at] = filled<T>("q", p, j), k_[at] = filled<T>("k", p, j), v_[at] = filled<T>("v", p, j);
        do_[at] = filled<T>("do", p, j);
      }
  }

  /// The bodies of one pass: bulk, ring, ring's compute alone, its transfers alone.
  std::vector<std::function<void()>> bodies(bool backward) {
    std::vector<std::function<void()>> out;
    const std::pair<overlap::context*, overlap::strategy> runs[] = {{&full_, overlap::strategy::bulk},
                                                                    {&full_, overlap::strategy::ring},
                                                                    {&compute_, overlap::strategy::ring},
                                                                    {&comm_, overlap::strategy::ring}};
    for (auto [ctx, st] : runs) {
      const overlap::attention_options opt{o_.heads, o_.causal, st, o_.block};
      if (!backward)
        out.push_back([this, ctx = ctx, opt] { overlap::ring_attention<T>(*ctx, inputs(), {ov(), lv()}, opt); });
      else
        out.push_back([this, ctx = ctx, opt] {
          overlap::ring_attention_backward<T>(*ctx, inputs(), {ov(), lv()}, {do_.data(), n_, w_},
                                              {{dq_.data(), n_, w_}, {dk_.data(), n_, w_}, {dv_.data(), n_, w_}}, opt);
        });
    }
    return out;
  }
  /// The forward pass once (the backward pass reads its output).
  void forward_once() { overlap::ring_attention<T>(full_, inputs(), {ov(), lv()}, {o_.heads, o_.causal}); }

 private:
  static overlap::context make(overlap::ring_phases ph) {
    overlap::config cfg = overlap::config::from_env();
    cfg.phases = ph;
    return overlap::context(MPI_COMM_WORLD, cfg);
  }
  overlap::attention_inputs<T> inputs() const {
    return {{q_.data(), n_, w_}, {k_.data(), n_, w_}, {v_.data(), n_, w_}};
  }
  overlap::matrix_view<T> ov() { return {o_out_.data(), n_, w_}; }
  overlap::matrix_view<A> lv() { return {lse_.data(), o_.heads, n_}; }

  options o_;
  int64_t n_ = 0, w_ = 0;
  std::vector<T> q_, k_, v_, o_out_, do_, dq_, dk_, dv_;
  std::vector<A> lse_;
  overlap::context full_ = make(overlap::ring_phases::both);
  overlap::context compute_ = make(overlap::ring_phases::compute_only);
  overlap::context comm_ = make(overlap::ring_phases::comm_only);
};

template <class T>
int run(const options& o, int rank, int size) {
  bench<T> b(o);
  b.forward_once();
  overlap::apps::link_drain drain(MPI_COMM_WORLD, o.drain_bytes);
  if (rank == 0) {
    fmt::print("{}\n", overlap::apps::provenance_line());
    fmt::print("ring attention: seq {}, {} heads x {}, {}, {}, {} ranks; transport: {}\n", o.seq, o.heads, o.head_dim,
               o.dtype, o.causal ? "causal" : "full", size, o.transport);
    fmt::print("{:<9} {:>10} {:>10} {:>12} {:>10} {:>14} {:>14}\n", "pass", "bulk ms", "ring ms", "compute ms",
               "comm ms", "ring vs bulk", "ring vs floor");
  }
  for (bool backward : {false, true}) {
    const std::vector<double> ms =
        overlap::apps::interleaved_median_max_ms(MPI_COMM_WORLD, o.warmup, o.iters, b.bodies(backward), drain);
    if (rank != 0) continue;
    const double floor = std::max(ms[2], ms[3]);
    const char* pass = backward ? "backward" : "forward";
    fmt::print("{:<9} {:>10.1f} {:>10.1f} {:>12.1f} {:>10.1f} {:>13.2f}x {:>13.2f}x\n", pass, ms[0], ms[1], ms[2],
               ms[3], ms[0] / ms[1], floor / ms[1]);
    if (o.json.empty()) continue;
    nlohmann::json j = {{"app", "overlap-attention"}, {"pass", pass},           {"seq", o.seq},
                        {"heads", o.heads},           {"head_dim", o.head_dim}, {"dtype", o.dtype},
                        {"causal", o.causal},         {"ranks", size},          {"transport", o.transport},
                        {"iters", o.iters},           {"bulk_ms", ms[0]},       {"ring_ms", ms[1]},
                        {"compute_only_ms", ms[2]},   {"comm_only_ms", ms[3]},  {"speedup", ms[0] / ms[1]}};
    j.update(overlap::apps::provenance());
    std::ofstream(o.json, std::ios::app) << j.dump() << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  overlap::mpi::environment env(argc, argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  options o;
  CLI::App app{"overlap-attention: ring attention against gathering K and V first, forward and backward"};
  overlap::apps::init_app(app);
  app.add_option("--seq", o.seq, "tokens of the whole sequence (causal split over the ranks)")
      ->check(CLI::PositiveNumber);
  app.add_option("--heads", o.heads, "attention heads")->check(CLI::PositiveNumber);
  app.add_option("--head-dim", o.head_dim, "columns per head")->check(CLI::PositiveNumber);
  app.add_option("--block", o.block, "query rows per block of scores")->check(CLI::PositiveNumber);
  app.add_option("--dtype", o.dtype, "element type")->check(CLI::IsMember({"f32", "bf16", "f64"}));
  app.add_flag("!--no-causal", o.causal, "attend to every token (default: the causal mask)");
  app.add_option("--iters", o.iters, "measured iterations (median reported)")->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup, "unmeasured iterations first")->check(CLI::NonNegativeNumber);
  app.add_option("--drain-bytes", o.drain_bytes,
                 "before each timed call, send this many bytes to both ring neighbours (empties emulated links' "
                 "token buckets; 0: off)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--json", o.json, "append one JSON object per pass to FILE (rank 0)");
  overlap::apps::add_common_options(app, o.transport);
  if (auto done = overlap::apps::parse(app, argc, argv, rank)) return *done;
  o.transport = overlap::apps::transport_label(o.transport, "shared memory (one machine)");
  try {
    if (o.dtype == "f32") return run<float>(o, rank, size);
    if (o.dtype == "bf16") return run<overlap::bfloat16>(o, rank, size);
    return run<double>(o, rank, size);
  } catch (const std::exception& e) {
    fmt::print(stderr, "overlap-attention (rank {}): {}\n", rank, e.what());
    return 1;
  }
}
