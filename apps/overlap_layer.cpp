// overlap-layer: training steps (forward + backward) of one tensor-parallel
// transformer block (overlap/layers/transformer.hpp), every op bulk or
// every op decomposed, side by side in one run; with the step's
// collectives alone for the share of communication hidden, and each mode's
// error against the same block in double precision. With --blocks N or
// --dp-sync: training steps of N blocks with a loss and an optimizer
// (overlap/layers/block_stack.hpp), the data-parallel gradient sum after
// the backward (bulk), overlapped with it, or left out (none), side by side.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include "common/cli11.hpp"

#include <fmt/core.h>
#include <nlohmann/json.hpp>
#include <overlap/attention/ring_attention.hpp>
#include <overlap/layers/block_stack.hpp>
#include <overlap/layers/example_values.hpp>
#include <overlap/layers/transformer.hpp>
#include <overlap/overlap.hpp>

#include "common/cli.hpp"
#include "common/measure.hpp"
#include "common/provenance.hpp"

namespace {

using overlap::layers::block_shape;
using overlap::layers::transformer_block;

struct options {
  block_shape shape;
  std::string dtype = "f32";
  std::vector<std::string> modes{"automatic"};
  bool only = false;
  int steps = 5, warmup = 1, tp = 0, cp = 1;
  bool check = true, sequence_parallel = true;
  std::string json, transport, save_calibration;
  /// Where the weight gradients run (block_options): beside started ops,
  /// in the ops' waits, or after the ops; empty: the block's default.
  std::string weight_gradients;
  /// The N-block model (--blocks, --dp-sync): blocks 0 runs one block as above.
  int blocks = 0;
  std::vector<std::string> dp_sync;
  std::string optimizer = "replicated";
  double bucket_mib = 25, learning_rate = 1e-3;
};

/// The weight gradients' place as --weight-gradients names it.
std::string weight_gradients_name(const overlap::layers::block_options& b) {
  if (!b.overlap_weight_gradients) return "after";
  return b.weight_gradients_in_waits ? "in-waits" : "started";
}

/// What a block computed in one step: out, dx and every gradient, as double.
struct step_result {
  std::vector<std::vector<double>> tensors;
};

/// One block, its inputs, and a step.
template <class T>
struct runner {
  overlap::context* ctx_;
  overlap::context* cp_;
  std::unique_ptr<transformer_block<T>> made;
  transformer_block<T>& blk;
  // Shared by the simulated ranks in SMPI's timing-only runs, as the block's buffers are.
  overlap::workspace_vector<T> x, dout, out, dx;

  /// The block on tp alone (cp null) or on tp x cp.
  runner(overlap::context& ctx, overlap::context* cp, const block_shape& s, const overlap::layers::block_options& o)
      : ctx_(&ctx),
        cp_(cp),
        made(cp != nullptr ? std::make_unique<transformer_block<T>>(ctx, *cp, s, o)
                           : std::make_unique<transformer_block<T>>(ctx, s, o)),
        blk(*made) {
    overlap::layers::visit(blk.params(), blk.layout(), [&](const char* name, T& v, int64_t i, int64_t j) {
      v = overlap::layers::detail::cast<T>(overlap::layers::example_parameter(s, name, i, j));
    });
    const auto& l = blk.layout();
    const int64_t n = l.rows(), d = s.hidden;
    x.resize(size_t(n * d)), dout.resize(x.size()), out.resize(x.size()), dx.resize(x.size());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < d; ++j) {
        x[size_t(i * d + j)] = overlap::layers::detail::cast<T>(overlap::layers::example_value("x", l.token(i), j));
        dout[size_t(i * d + j)] =
            overlap::layers::detail::cast<T>(overlap::layers::example_value("dout", l.token(i), j));
      }
  }
  void step() {
    overlap::layers::detail::phase_span whole(ctx_->tracer(), "step");  // the window tools/trace/render.py draws
    const int64_t n = blk.layout().rows(), d = blk.layout().shape.hidden;
    blk.forward({x.data(), n, d}, {out.data(), n, d});
    blk.backward({dout.data(), n, d}, {dx.data(), n, d});
  }
  /// out, dx and the gradients (summed over the cp shares: the whole sequence's).
  [[nodiscard]] step_result result() {
    step_result r;
    auto add = [&](const auto& v) {
      r.tensors.emplace_back();
      for (const auto& e : v) r.tensors.back().push_back(overlap::layers::detail::cast<double>(e));
    };
    add(out), add(dx);
    auto g = blk.grads();
    g.each([&](const char*, const auto& v, bool) { add(v); });
    if (cp_ != nullptr)
      for (size_t t = 2; t < r.tensors.size(); ++t)
        MPI_Allreduce(MPI_IN_PLACE, r.tensors[t].data(), int(r.tensors[t].size()), MPI_DOUBLE, MPI_SUM, cp_->comm());
    return r;
  }
};

/// max over tensors of max |got - want| / max |want| (max over the ranks of comm).
double max_rel_err(MPI_Comm comm, const step_result& got, const step_result& want) {
  double worst = 0;
  for (size_t t = 0; t < want.tensors.size(); ++t) {
    double local[2] = {0, 1e-300}, all[2];
    for (size_t i = 0; i < want.tensors[t].size(); ++i) {
      local[0] = std::max(local[0], std::fabs(got.tensors[t][i] - want.tensors[t][i]));
      local[1] = std::max(local[1], std::fabs(want.tensors[t][i]));
    }
    MPI_Allreduce(local, all, 2, MPI_DOUBLE, MPI_MAX, comm);
    worst = std::max(worst, all[0] / all[1]);
  }
  return worst;
}

/// The step's collectives alone, as the bulk strategy runs them. Sequence
/// parallel: 4 all-gathers of the activations (all_gather_matmul with an
/// empty product and the gathered operand kept) and 4 reduce-scatters of
/// partial sums (matmul_reduce_scatter of an empty contraction); without: 4
/// all-reduces (matmul_all_reduce of an empty contraction). With a cp axis
/// also ring attention's gathers of K and V and the reduce-scatter of their
/// gradients (bulk, on a context that skips the computing).
template <class T>
std::function<void()> comm_only(overlap::context& ctx, overlap::context* cp, const overlap::layers::block_layout& l) {
  const int64_t n = l.rows(), d = l.shape.hidden, S = l.share_rows(), w = l.width();
  const bool sp = l.axes.sequence_parallel;
  // Shared by the simulated ranks in SMPI's timing-only runs (workspace_vector).
  using buffer = overlap::workspace_vector<T>;
  auto mine = std::make_shared<buffer>(size_t(n * d), overlap::layers::detail::cast<T>(1.0));
  auto gathered = std::make_shared<buffer>(size_t(S * d));
  auto summed = std::make_shared<buffer>(size_t(n * d));
  overlap::ag_options ag;
  ag.strategy = overlap::strategy::bulk;
  overlap::rs_options rs;
  rs.strategy = overlap::strategy::bulk;
  overlap::ar_options ar;
  ar.strategy = overlap::strategy::bulk;
  std::shared_ptr<overlap::context> attention_ctx;
  auto qkv = std::make_shared<buffer>(size_t(S * 3 * w), overlap::layers::detail::cast<T>(0.5));
  auto o = std::make_shared<buffer>(size_t(S * w)), dqkv = std::make_shared<buffer>(qkv->size());
  const int64_t heads = l.head_shards.size(l.rank);
  auto lse = std::make_shared<overlap::workspace_vector<overlap::attention_acc_t<T>>>(size_t(heads * S));
  if (cp != nullptr) {
    overlap::config c = cp->config();
    c.phases = overlap::ring_phases::comm_only;
    c.trace.clear();
    attention_ctx = std::make_shared<overlap::context>(cp->comm(), c);
  }
  return [=, &ctx] {
    for (int i = 0; i < 4; ++i) {
      if (!sp) {
        overlap::matmul_all_reduce<T>(ctx, {nullptr, n, 0}, {nullptr, 0, d}, {summed->data(), n, d}, ar);
        continue;
      }
      overlap::all_gather_matmul<T>(ctx, {mine->data(), n, d}, {nullptr, d, 0}, {nullptr, S, 0},
                                    {gathered->data(), S, d}, ag);
      overlap::matmul_reduce_scatter<T>(ctx, {nullptr, S, 0}, {nullptr, 0, d}, {summed->data(), n, d}, rs);
    }
    if (!attention_ctx || heads == 0) return;
    overlap::attention_options ao;
    ao.heads = heads;
    ao.strategy = overlap::strategy::bulk;
    const T* p = qkv->data();
    T* g = dqkv->data();
    const overlap::attention_inputs<T> in{{p, S, w, 3 * w}, {p + w, S, w, 3 * w}, {p + 2 * w, S, w, 3 * w}};
    overlap::ring_attention<T>(*attention_ctx, in, {{o->data(), S, w}, {lse->data(), heads, S}}, ao);
    overlap::ring_attention_backward<T>(*attention_ctx, in, {{o->data(), S, w}, {lse->data(), heads, S}},
                                        {o->data(), S, w},
                                        {{g, S, w, 3 * w}, {g + w, S, w, 3 * w}, {g + 2 * w, S, w, 3 * w}}, ao);
  };
}

struct row {
  std::string mode;
  double step_ms = 0, speedup = 0, hidden = 0, err = -1;
};

/// The fields every JSON row shares: the shape, the mesh, the block's
/// modes, the run, and where it ran (provenance).
nlohmann::json run_fields(const options& o, const overlap::mesh& mesh, int tp,
                          const overlap::layers::block_options& bo) {
  const auto& s = o.shape;
  nlohmann::json j{{"seq", s.seq},
                   {"hidden", s.hidden},
                   {"heads", s.heads},
                   {"ffn", s.ffn},
                   {"dtype", o.dtype},
                   {"ranks", overlap::apps::world_size()},
                   {"tensor_groups", mesh.size("dp") * mesh.size("cp")},
                   {"dp", mesh.size("dp")},
                   {"cp", mesh.size("cp")},
                   {"tp", tp},
                   {"sequence_parallel", o.sequence_parallel},
                   {"weight_gradients", weight_gradients_name(bo)},
                   {"steps", o.steps},
                   {"transport", o.transport}};
  j.update(overlap::apps::provenance());
  return j;
}

/// Appends one line per row to `path`; 1 (with a message) when it cannot be written.
int append_rows(const std::string& path, const std::vector<nlohmann::json>& rows) {
  std::ofstream out(path, std::ios::app);
  for (const nlohmann::json& j : rows) out << j.dump() << "\n";
  if (out) return 0;
  fmt::print(stderr, "overlap-layer: cannot write {}\n", path);
  return 1;
}

/// The world as a dp x cp x tp mesh (tp varies fastest: a tensor group on
/// one node where it fits, then cp). Collective. Every mode's model and the
/// collectives alone keep their plans on one context: its cache must hold
/// them all, or each step would rebuild the plans evicted by the other
/// modes' and time that (a block's step calls its ops with 8 shapes or
/// fewer; 16 per mode leaves room).
overlap::mesh layer_mesh(const options& o, size_t modes) {
  overlap::config cfg = overlap::config::from_env();
  cfg.plan_cache = std::max(cfg.plan_cache, 16 * static_cast<int>(modes + 1));
  const int world = overlap::apps::world_size();
  return {MPI_COMM_WORLD, {{"dp", 0}, {"cp", o.cp, true}, {"tp", o.tp > 0 ? o.tp : world / o.cp, true}}, cfg};
}

/// The N-block model's training steps, one row per --dp-sync mode: each
/// mode's own model (the same initial weights and data), its steps
/// interleaved with the others' and with the data-parallel collectives
/// alone. tp strategy: --modes' one value.
template <class T>
int run_stack(const options& o, const overlap::layers::block_options& bo) {
  using overlap::layers::block_stack;
  using overlap::layers::dp_sync;
  const int world = overlap::apps::world_size(), wrank = overlap::apps::world_rank();
  const int blocks = std::max(o.blocks, 1);
  std::vector<dp_sync> modes;
  for (const auto& m : o.dp_sync.empty() ? std::vector<std::string>{"bulk", "overlapped", "none"} : o.dp_sync) {
    dp_sync d = dp_sync::bulk;
    (void)overlap::parse_enum(m, d);  // CLI11 checked the names
    if (std::find(modes.begin(), modes.end(), d) == modes.end()) modes.push_back(d);
  }
  overlap::mesh mesh = layer_mesh(o, modes.size());
  overlap::context& ctx = mesh.context("tp");
  overlap::layers::stack_options so;
  so.block = bo;
  (void)overlap::parse_enum(o.optimizer, so.optimizer);
  so.bucket_bytes = std::max<int64_t>(1, static_cast<int64_t>(o.bucket_mib * 1024 * 1024));
  so.learning_rate = o.learning_rate;
  const auto& s = o.shape;
  std::vector<std::unique_ptr<block_stack<T>>> stacks;
  std::vector<double> losses(modes.size(), 0);
  std::vector<T> x, target;
  for (dp_sync d : modes) {
    so.dp_sync = d;
    stacks.push_back(std::make_unique<block_stack<T>>(mesh, blocks, s, so));
    block_stack<T>& st = *stacks.back();
    for (int b = 0; b < blocks; ++b)
      overlap::layers::visit(st.block(b).params(), st.layout(), [&](const char* name, T& v, int64_t i, int64_t j) {
        v = overlap::layers::detail::cast<T>(overlap::layers::example_parameter(s, b, name, i, j));
      });
  }
  block_stack<T>& first = *stacks.front();
  const auto& l = first.layout();
  const int64_t n = l.rows(), d = s.hidden, q = first.replica();
  x.resize(size_t(n * d)), target.resize(x.size());
  for (int64_t i = 0; i < n; ++i)  // replica q's own sequence
    for (int64_t j = 0; j < d; ++j) {
      x[size_t(i * d + j)] =
          overlap::layers::detail::cast<T>(overlap::layers::example_value("x", l.token(i) + s.seq * q, j));
      target[size_t(i * d + j)] =
          overlap::layers::detail::cast<T>(0.5 * overlap::layers::example_value("target", l.token(i) + s.seq * q, j));
    }
  std::vector<std::function<void()>> bodies;
  for (size_t m = 0; m < modes.size(); ++m)
    bodies.emplace_back([&, m] {
      // One name per mode (render.py DIR:label=NAME draws one): "step bulk", ...
      static const char* const names[] = {"step bulk", "step overlapped", "step none"};  // by dp_sync
      overlap::layers::detail::phase_span whole(ctx.tracer(), names[static_cast<int>(modes[m])]);
      losses[m] = stacks[m]->step({x.data(), n, d}, {target.data(), n, d});
    });
  // The data-parallel collectives alone, as bulk runs them (a model that sums).
  size_t summing = 0;
  while (summing < modes.size() && modes[summing] == dp_sync::none) ++summing;
  const bool have_comm = summing < modes.size();
  if (have_comm) bodies.emplace_back([&] { stacks[summing]->collectives_only(); });
  // Every mode steps alike while automatic settles, so that their models
  // have taken the same steps (bulk's and overlapped's sums are the same
  // rings: their losses then agree).
  int settling = 0;
  if (bo.strategy == overlap::strategy::automatic)
    settling = overlap::apps::run_until_settled(ctx, [&] {
      for (size_t m = 0; m < modes.size(); ++m) bodies[m]();
    });
  const std::vector<double> ms = overlap::apps::interleaved_median_max_ms(MPI_COMM_WORLD, o.warmup, o.steps, bodies);
  for (auto& st : stacks) st->synchronize();
  auto at = [&](dp_sync m) {
    const auto it = std::find(modes.begin(), modes.end(), m);
    return it == modes.end() ? -1.0 : ms[size_t(it - modes.begin())];
  };
  const double bulk_ms = at(dp_sync::bulk), none_ms = at(dp_sync::none), comm_ms = have_comm ? ms.back() : 0;
  const double bulk_loss =
      bulk_ms >= 0 ? losses[size_t(std::find(modes.begin(), modes.end(), dp_sync::bulk) - modes.begin())] : 0;
  if (wrank != 0) return 0;
  fmt::print(
      "overlap-layer: {} blocks seq={} hidden={} heads={} ffn={} {} on {} ranks (dp {} x cp {} x tp {}), tp ops {}, "
      "optimizer state {}, buckets of {:.1f} MiB, {}, transport: {}\n",
      blocks, s.seq, s.hidden, s.heads, s.ffn, o.dtype, world, mesh.size("dp"), mesh.size("cp"), ctx.size(),
      overlap::to_string(bo.strategy), o.optimizer, o.bucket_mib,
      first.threaded() ? "dp collectives on the model's thread" : "dp collectives advanced between blocks",
      o.transport);
  fmt::print("{}\n", overlap::apps::provenance_line());
  fmt::print("step = forward + loss + backward + dp sync + SGD; median of {} steps, slowest rank\n", o.steps);
  fmt::print("{:<14}{:>12}{:>18}{:>18}{:>14}\n", "dp sync", "step ms", "speedup vs bulk", "dp sum hidden", "loss");
  struct stack_row {
    std::string mode;
    double step_ms, speedup, hidden, loss;
    bool bounded;  ///< hidden is defined (bulk and none ran, bulk slower); negative: slower than bulk
  };
  std::vector<stack_row> rows;
  for (size_t m = 0; m < modes.size(); ++m) {
    const bool bounded = bulk_ms > 0 && none_ms > 0 && bulk_ms > none_ms && modes[m] != dp_sync::none;
    rows.push_back({overlap::to_string(modes[m]), ms[m], bulk_ms > 0 ? bulk_ms / ms[m] : 0,
                    bounded ? (bulk_ms - ms[m]) / (bulk_ms - none_ms) : 0, losses[m], bounded});
    const stack_row& r = rows.back();
    fmt::print("{:<14}{:>12.1f}{:>18}{:>18}{:>14.6g}\n", r.mode, r.step_ms,
               r.speedup > 0 ? fmt::format("{:.3f}x", r.speedup) : "-",
               r.bounded ? fmt::format("{:.0f}%", 100 * r.hidden) : "-", r.loss);
  }
  if (have_comm)
    fmt::print(
        "{:<14}{:>12.1f}   (the data-parallel collectives alone, as bulk runs them; dp sum hidden = (bulk - "
        "mode) / (bulk - none))\n",
        "dp comm only", comm_ms);
  if (o.json.empty()) return 0;
  std::vector<nlohmann::json> out;
  for (const stack_row& r : rows) {
    nlohmann::json j{{"dp_sync", r.mode},
                     {"step_ms", r.step_ms},
                     {"speedup_vs_bulk", r.speedup > 0 ? nlohmann::json(r.speedup) : nlohmann::json(nullptr)},
                     {"dp_hidden", r.bounded ? nlohmann::json(r.hidden) : nlohmann::json(nullptr)},
                     {"dp_comm_ms", have_comm ? nlohmann::json(comm_ms) : nlohmann::json(nullptr)},
                     {"bulk_ms", bulk_ms >= 0 ? nlohmann::json(bulk_ms) : nlohmann::json(nullptr)},
                     {"none_ms", none_ms >= 0 ? nlohmann::json(none_ms) : nlohmann::json(nullptr)},
                     {"loss", r.loss},
                     {"loss_vs_bulk", bulk_ms >= 0 && bulk_loss != 0 ? nlohmann::json((r.loss - bulk_loss) / bulk_loss)
                                                                     : nlohmann::json(nullptr)},
                     {"blocks", blocks},
                     {"strategy", overlap::to_string(bo.strategy)},
                     {"optimizer", o.optimizer},
                     {"bucket_bytes", so.bucket_bytes},
                     {"dp_thread", first.threaded()},
                     {"automatic_settling_steps", settling}};
    j.update(run_fields(o, mesh, ctx.size(), bo));
    out.push_back(std::move(j));
  }
  return append_rows(o.json, out);
}

template <class T>
int run(const options& o) {
  overlap::layers::block_options bo;
  bo.sequence_parallel = o.sequence_parallel;
  if (!o.weight_gradients.empty()) {
    bo.overlap_weight_gradients = o.weight_gradients != "after";
    bo.weight_gradients_in_waits = o.weight_gradients == "in-waits";
  }
  if (o.blocks > 0 || !o.dp_sync.empty()) {
    (void)overlap::parse_enum(o.modes.back(), bo.strategy);  // one strategy (main checked)
    return run_stack<T>(o, bo);
  }
  int world = 1, wrank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
  std::vector<std::string> modes;
  if (!o.only) modes.emplace_back("bulk");
  for (const auto& m : o.modes)
    if (std::find(modes.begin(), modes.end(), m) == modes.end()) modes.push_back(m);
  overlap::mesh mesh = layer_mesh(o, modes.size());
  overlap::context& ctx = mesh.context("tp");
  overlap::context* cp = o.cp > 1 ? &mesh.context("cp") : nullptr;
  std::vector<std::unique_ptr<runner<T>>> runners;
  std::vector<std::function<void()>> bodies;
  for (const auto& m : modes) {
    overlap::strategy st = overlap::strategy::bulk;
    (void)overlap::parse_enum(m, st);  // CLI11 checked the names
    bo.strategy = st;
    runners.push_back(std::make_unique<runner<T>>(ctx, cp, o.shape, bo));
    bodies.emplace_back([r = runners.back().get()] { r->step(); });
  }
  bodies.push_back(comm_only<T>(ctx, cp, runners.front()->blk.layout()));
  // The step without communication: every op's products and the local work
  // (a second context on the same ranks that skips every transfer and
  // collective: config::phases = ring_phases::compute_only; the results
  // are not used).
  overlap::config quiet = ctx.config();
  quiet.phases = overlap::ring_phases::compute_only;
  quiet.trace.clear();  // not in the timeline, whose last step is the last mode's
  overlap::context compute_ctx(ctx.comm(), quiet);
  std::unique_ptr<overlap::context> compute_cp;
  if (cp != nullptr) compute_cp = std::make_unique<overlap::context>(cp->comm(), quiet);
  bo.strategy = overlap::strategy::bulk;
  runner<T> compute(compute_ctx, compute_cp.get(), o.shape, bo);
  bodies.emplace_back([&compute] { compute.step(); });
  // automatic's first steps time its candidates (OVERLAP_AUTOMATIC=measured):
  // the timed steps start once it has settled, as a training job's later steps.
  int settling = 0;
  for (size_t i = 0; i < modes.size(); ++i)
    if (modes[i] == "automatic") settling = overlap::apps::run_until_settled(ctx, bodies[i]);
  const std::vector<double> ms = overlap::apps::interleaved_median_max_ms(MPI_COMM_WORLD, o.warmup, o.steps, bodies);
  if (!o.save_calibration.empty() && !ctx.save_calibration(o.save_calibration) && wrank == 0)
    fmt::print(stderr, "overlap-layer: no calibration to save (automatic asked no model)\n");
  std::vector<row> rows;
  const double bulk_ms = o.only ? 0 : ms.front(), comm_ms = ms[ms.size() - 2], compute_ms = ms.back();
  for (size_t i = 0; i < modes.size(); ++i) {
    row r{modes[i], ms[i], bulk_ms > 0 ? bulk_ms / ms[i] : 0, bulk_ms > 0 ? (bulk_ms - ms[i]) / comm_ms : 0};
    rows.push_back(r);
  }
  if (o.check) {  // the same block and data in double precision (bulk; Eigen products)
    runner<double> ref(ctx, cp, o.shape, bo);
    ref.step();
    const step_result want = ref.result();
    for (size_t i = 0; i < modes.size(); ++i) rows[i].err = max_rel_err(MPI_COMM_WORLD, runners[i]->result(), want);
  }
  // Which schedule automatic chose for each of the block's op shapes (the
  // tp context's plans; the same on every rank of the group), and why. Plans
  // that differ only in strides or transposes read alike: counted once.
  nlohmann::json choices = nlohmann::json::array();
  for (const overlap::context::plan_report& p : ctx.plan_reports()) {
    if (!p.automatic) continue;
    const nlohmann::json c{{"plan", p.summary}, {"schedule", p.schedule}};
    if (std::find(choices.begin(), choices.end(), c) == choices.end()) choices.push_back(c);
  }
  if (wrank != 0) return 0;
  const auto& s = o.shape;
  fmt::print(
      "overlap-layer: block seq={} hidden={} heads={} ffn={} {} on {} ranks (dp {} x cp {} x tp {}), {}, "
      "transport: {}\n",
      s.seq, s.hidden, s.heads, s.ffn, o.dtype, world, mesh.size("dp"), mesh.size("cp"), ctx.size(),
      o.sequence_parallel ? "sequence parallel" : "not sequence parallel (matmul all-reduce)", o.transport);
  fmt::print("{}\n", overlap::apps::provenance_line());
  fmt::print("gemm: {}\nstep = forward + backward; median of {} steps, slowest rank\n",
             ctx.gemm_path(overlap::dtype_of<T>()), o.steps);
  fmt::print("{:<14}{:>12}{:>18}{:>18}{:>14}\n", "mode", "step ms", "speedup vs bulk", "comm hidden", "max rel err");
  for (const row& r : rows)
    fmt::print("{:<14}{:>12.1f}{:>18}{:>18}{:>14}\n", r.mode, r.step_ms,
               r.speedup > 0 ? fmt::format("{:.3f}x", r.speedup) : "-",
               r.speedup > 0 ? fmt::format("{:.0f}%", 100 * r.hidden) : "-",
               r.err >= 0 ? fmt::format("{:.1e}", r.err) : "-");
  fmt::print("{:<14}{:>12.1f}   (the step's {}{} alone, as bulk runs them)\n", "comm only", comm_ms,
             o.sequence_parallel ? "4 all-gathers and 4 reduce-scatters" : "4 all-reduces",
             cp != nullptr ? ", ring attention's K/V gathers and gradient reduce-scatter" : "");
  fmt::print("{:<14}{:>12.1f}   (the step without communication; bulk / compute only = {:.2f}x bounds any overlap)\n",
             "compute only", compute_ms, bulk_ms > 0 ? bulk_ms / compute_ms : 0.0);
  fmt::print("weight gradients: {} (--weight-gradients)\n", weight_gradients_name(bo));
  if (!choices.empty()) {
    fmt::print("automatic's schedules (rank 0's tp context; settled after {} unmeasured steps):\n", settling);
    for (const auto& c : choices)
      fmt::print("  {}: {}\n", c["plan"].get<std::string>(), c["schedule"].get<std::string>());
  }
  if (o.json.empty()) return 0;
  std::vector<nlohmann::json> out;
  for (const row& r : rows) {
    nlohmann::json j{{"mode", r.mode},
                     {"step_ms", r.step_ms},
                     {"speedup_vs_bulk", r.speedup > 0 ? nlohmann::json(r.speedup) : nlohmann::json(nullptr)},
                     {"comm_ms", comm_ms},
                     {"compute_ms", compute_ms},
                     {"comm_hidden", r.speedup > 0 ? nlohmann::json(r.hidden) : nlohmann::json(nullptr)},
                     {"max_rel_err", r.err >= 0 ? nlohmann::json(r.err) : nlohmann::json(nullptr)}};
    j.update(run_fields(o, mesh, ctx.size(), bo));
    if (r.mode == "automatic") j["automatic_choices"] = choices, j["automatic_settling_steps"] = settling;
    out.push_back(std::move(j));
  }
  return append_rows(o.json, out);
}

}  // namespace

int main(int argc, char** argv) {
  overlap::mpi::environment env(argc, argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  options o;
  o.shape.ffn = 0;
  CLI::App app{"overlap-layer: training steps of a tensor-parallel transformer block, bulk vs decomposed"};
  overlap::apps::init_app(app);
  app.add_option("--seq", o.shape.seq, "tokens (sharded over the ranks)")->check(CLI::PositiveNumber);
  app.add_option("--hidden", o.shape.hidden, "model width")->check(CLI::PositiveNumber);
  app.add_option("--heads", o.shape.heads, "attention heads (sharded; must divide hidden)")->check(CLI::PositiveNumber);
  app.add_option("--ffn", o.shape.ffn, "MLP width (sharded; default 4 x hidden)")->check(CLI::NonNegativeNumber);
  app.add_option("--dtype", o.dtype, "element type of the ops' operands")->check(CLI::IsMember({"f32", "bf16", "f64"}));
  app.add_option("--modes", o.modes, "strategies run beside bulk: ring, bidirectional, automatic")
      ->check(CLI::IsMember({"bulk", "ring", "bidirectional", "automatic"}))
      ->delimiter(',');
  app.add_flag("--only", o.only, "run only --modes (no bulk baseline; e.g. for one trace per mode)");
  app.add_option("--steps", o.steps, "measured training steps (median reported)")->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup, "unmeasured steps first")->check(CLI::NonNegativeNumber);
  app.add_flag("!--no-check", o.check, "skip the double-precision run behind max_rel_err");
  app.add_option("--json", o.json, "append one JSON object per mode to FILE (rank 0)");
  app.add_option("--tp", o.tp, "tensor-parallel group size: a dp x cp x tp mesh; 0: the ranks left by --cp")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--cp", o.cp,
                 "context-parallel size: the sequence in cp shares (causal split), attention as ring attention "
                 "between them")
      ->check(CLI::PositiveNumber);
  app.add_flag("!--no-sequence-parallel", o.sequence_parallel,
               "every tensor-parallel rank holds all tokens; row-parallel outputs use matmul_all_reduce");
  app.add_option("--weight-gradients", o.weight_gradients,
                 "where the weight gradients run: started (beside the data gradients' started ops, on the "
                 "context's worker), in-waits (in pieces inside those ops' waits, one thread; the default under "
                 "SMPI), after (after each op)")
      ->check(CLI::IsMember({"started", "in-waits", "after"}));
  app.add_option("--blocks", o.blocks,
                 "train a model of N blocks (loss, SGD with momentum) and compare --dp-sync modes; its tp ops "
                 "use --modes' one strategy")
      ->check(CLI::PositiveNumber);
  app.add_option("--dp-sync", o.dp_sync,
                 "with --blocks: when the data-parallel gradient sum runs: bulk (after the backward), overlapped "
                 "(each block's during the blocks before it), none (the bound); default all three")
      ->check(CLI::IsMember({"bulk", "overlapped", "none"}))
      ->delimiter(',');
  app.add_option("--optimizer", o.optimizer,
                 "with --blocks: replicated optimizer state (all-reduced gradients) or sharded (ZeRO-1/2: "
                 "reduce-scattered gradients, all-gathered weights)")
      ->check(CLI::IsMember({"replicated", "sharded"}));
  app.add_option("--bucket-mib", o.bucket_mib, "with --blocks: MiB of gradient per data-parallel ring collective")
      ->check(CLI::PositiveNumber);
  app.add_option("--lr", o.learning_rate, "with --blocks: SGD's learning rate (momentum 0.9)")
      ->check(CLI::NonNegativeNumber);
  overlap::apps::add_common_options(app, o.transport, &o.save_calibration);
  if (auto done = overlap::apps::parse(app, argc, argv, rank)) return *done;
  if (o.shape.ffn == 0) o.shape.ffn = 4 * o.shape.hidden;
  if ((o.blocks > 0 || !o.dp_sync.empty()) && o.modes.size() != 1) {
    if (rank == 0)
      fmt::print(stderr,
                 "overlap-layer: --blocks/--dp-sync compare dp modes under one tp strategy: give --modes one "
                 "value\n");
    return 2;
  }
  o.transport = overlap::apps::transport_label(o.transport, "shared memory (one machine)");
  if (world % (o.cp * std::max(o.tp, 1)) != 0) {
    if (rank == 0)
      fmt::print(stderr, "overlap-layer: --cp {} x --tp {} does not divide the {} ranks\n", o.cp, o.tp, world);
    return 2;
  }
  try {
    if (o.dtype == "f64") return run<double>(o);
    if (o.dtype == "bf16") return run<overlap::bfloat16>(o);
    return run<float>(o);
  } catch (const std::exception& e) {
    fmt::print(stderr, "overlap-layer (rank {}): {}\n", rank, e.what());
    return 1;
  }
}
