// overlap-bench: one tensor-parallel product measured every way side by side
// in one run: compute only and comm only (the same ring schedule's GEMMs
// alone and transfers alone), bulk, each decomposed strategy, and the peers a
// user would otherwise pick. Times are medians over iterations of the slowest
// rank. Every result is checked against a double-precision reference on the
// first iteration; a wrong result fails the run (--no-check: timing only,
// for simulated runs whose GEMMs are not computed).
//
// The global problem is C = A @ B (M x K times K x N), sharded as a
// tensor-parallel layer shards it (balanced blocks); each variant's views are
// described once, in common/bench_ops.hpp, which --help's footer lists (main),
// and built by slice_for.
#include <fmt/format.h>
#include <algorithm>
#include "common/cli11.hpp"

#include <Eigen/Core>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/bench_ops.hpp"
#include "common/cli.hpp"
#include "common/measure.hpp"
#include "common/moe_bench.hpp"
#include "common/pipeline_peer.hpp"
#include "common/provenance.hpp"
#include "common/values.hpp"
#ifdef OVERLAP_HAVE_SCALAPACK
#include "common/scalapack_peer.hpp"
#endif
#include "overlap/engine/buffer.hpp"
#include "overlap/overlap.hpp"

namespace {

struct options {
  std::string op, variant, dtype = "f32";  // op: the table's first; variant: the op's first (common/bench_ops.hpp)
  int64_t m = 2048, n = 2048, k = 2048;
  std::vector<std::string> strategies{"ring", "bidirectional"};
  bool peers = true;
  bool check = true;  ///< check every row's result against the reference (--no-check: time only)
  /// Time the halves of the limit (each schedule with its GEMMs off and with
  /// its transfers off, and bulk's); --no-halves: only the library's rows.
  bool halves = true;
  int pipeline_chunks = 4;
  int iters = 5, warmup = 1;
  long drain_bytes = 0;  ///< sent to each ring neighbour before every timed call (overlap::apps::link_drain)
  int tp = 0;            ///< tensor-parallel group size; 0: one group of every rank
  int64_t batch = 1;     ///< products per call (overlap::batch), members one after the other
  std::string json, transport, save_calibration;
  // --op moe (common/moe_bench.hpp)
  int experts = 8, topk = 2;
  std::string skew = "uniform";
  bool moe_layer = false;
};

struct range2 {
  int64_t r0, nr, c0, nc;
};

/// The slices of A, B and C this rank holds for the chosen op and variant.
struct slicing {
  range2 a, b, c;
};

/// A variant's views as --help's footer shows them: "a = A[M_r, :]  b = B[:, N_r]  c = C[:, N_r]".
std::string views_of(const overlap::apps::bench_ops::variant& v) {
  using overlap::apps::bench_ops::cut;
  auto one = [](char m, cut how, const char* rows, const char* cols) {
    const char lower = static_cast<char>(std::tolower(m));
    if (how == cut::whole) return fmt::format("{:<13}", fmt::format("{} = {}", lower, m));
    return fmt::format("{:<13}", fmt::format("{} = {}[{}, {}]", lower, m, how == cut::rows ? rows : ":",
                                             how == cut::cols ? cols : ":"));
  };
  return one('A', v.a, "M_r", "K_r") + " " + one('B', v.b, "K_r", "N_r") + " " + one('C', v.c, "M_r", "N_r");
}

slicing slice_for(const options& o, int R, int p) {
  using overlap::apps::bench_ops::cut;
  const std::optional<overlap::apps::bench_ops::variant> v = overlap::apps::bench_ops::find_variant(o.op, o.variant);
  if (!v) throw CLI::ValidationError("--variant", "'" + o.variant + "' is not a variant of --op " + o.op);
  const auto M = overlap::shard_layout::balanced(o.m, R), N = overlap::shard_layout::balanced(o.n, R),
             K = overlap::shard_layout::balanced(o.k, R);
  // A's rows are M and its columns K, B's K and N, C's M and N.
  auto block = [&](cut how, int64_t rows, const overlap::shard_layout& by_rows, int64_t cols,
                   const overlap::shard_layout& by_cols) {
    if (how == cut::rows) return range2{by_rows.offset(p), by_rows.size(p), 0, cols};
    if (how == cut::cols) return range2{0, rows, by_cols.offset(p), by_cols.size(p)};
    return range2{0, rows, 0, cols};
  };
  return {block(v->a, o.m, M, o.k, K), block(v->b, o.k, K, o.n, N), block(v->c, o.m, M, o.n, N)};
}

using overlap::apps::from_float;
using overlap::apps::global_value;
using overlap::apps::tolerance;

template <class T>
std::vector<T> make_slice(range2 r, uint32_t salt) {
  std::vector<T> v(static_cast<size_t>(r.nr * r.nc));
  for (int64_t i = 0; i < r.nr; ++i)
    for (int64_t j = 0; j < r.nc; ++j)
      v[static_cast<size_t>(i * r.nc + j)] = from_float<T>(global_value(r.r0 + i, r.c0 + j, salt));
  return v;
}

/// This rank's block of C = A @ B, exactly (double, Eigen) from the same
/// inputs of type T.
template <class T>
Eigen::MatrixXd reference_of(range2 cr, int64_t K) {
  Eigen::MatrixXd a(cr.nr, K), b(K, cr.nc);
  for (int64_t i = 0; i < cr.nr; ++i)
    for (int64_t q = 0; q < K; ++q) a(i, q) = double(from_float<T>(global_value(cr.r0 + i, q, 1)));
  for (int64_t q = 0; q < K; ++q)
    for (int64_t j = 0; j < cr.nc; ++j) b(q, j) = double(from_float<T>(global_value(q, cr.c0 + j, 2)));
  return a * b;
}

/// max |c - ref| / max |ref| for this rank's block of C (ref: reference_of),
/// over `members` copies of it one after the other in c.
template <class T>
double check(const T* c, const Eigen::MatrixXd& ref, range2 cr, int64_t members) {
  double num = 0, den = 0;
  for (int64_t m = 0; m < members; ++m)
    for (int64_t i = 0; i < cr.nr; ++i)
      for (int64_t j = 0; j < cr.nc; ++j) {
        num = std::max(num, std::abs(double(c[static_cast<size_t>((m * cr.nr + i) * cr.nc + j)]) - ref(i, j)));
        den = std::max(den, std::abs(ref(i, j)));
      }
  return den > 0 ? num / den : num;
}

/// The exact product of the given global rows and columns of C = A @ B
/// (row-major, double, Eigen).
[[maybe_unused]] std::vector<double> reference_block(const std::vector<int64_t>& rows, const std::vector<int64_t>& cols,
                                                     int64_t K) {
  const auto nr = static_cast<Eigen::Index>(rows.size()), nc = static_cast<Eigen::Index>(cols.size());
  Eigen::MatrixXd a(nr, K), b(K, nc);
  for (Eigen::Index i = 0; i < nr; ++i)
    for (int64_t q = 0; q < K; ++q) a(i, q) = double(global_value(rows[static_cast<size_t>(i)], q, 1));
  for (int64_t q = 0; q < K; ++q)
    for (Eigen::Index j = 0; j < nc; ++j) b(q, j) = double(global_value(q, cols[static_cast<size_t>(j)], 2));
  const Eigen::MatrixXd ref = a * b;
  std::vector<double> out(rows.size() * cols.size());
  for (Eigen::Index i = 0; i < nr; ++i)
    for (Eigen::Index j = 0; j < nc; ++j) out[static_cast<size_t>(i * nc + j)] = ref(i, j);
  return out;
}

struct result {
  std::string variant, strategy;
  double time_ms = 0, err = 0;
  /// A decomposed strategy's own schedule with transfers off / GEMMs off
  /// (negative: not a ring schedule).
  double compute_only_ms = -1, comm_only_ms = -1;
  /// automatic: the schedule the library chose (and its cost model's table).
  std::optional<overlap::schedule> chosen;
  /// A peer's setup (ScaLAPACK: the grid and block size it was given).
  nlohmann::json setup = nullptr;
};

/// What each --strategies name asks the library for.
struct asked {
  overlap::strategy strategy;
  overlap::algorithm algorithm;
};
asked asked_for(const std::string& s) {
  if (s == "bulk") return {overlap::strategy::bulk, overlap::algorithm::named};
  if (s == "bidirectional") return {overlap::strategy::bidirectional, overlap::algorithm::named};
  if (s == "others") return {overlap::strategy::bulk, overlap::algorithm::others};
  if (s == "automatic") return {overlap::strategy::automatic, overlap::algorithm::automatic};
  return {overlap::strategy::ring, overlap::algorithm::named};
}

/// The schedule automatic chose, with the cost model's candidates.
nlohmann::json schedule_json(const overlap::schedule& s) {
  nlohmann::json cands = nlohmann::json::array();
  for (const auto& c : s.candidates)
    cands.push_back({{"strategy", overlap::to_string(c.strategy)},
                     {"algorithm", overlap::to_string(c.algorithm)},
                     {"chunks", c.chunks},
                     {"predicted_ms", c.predicted_s * 1e3},
                     {"measured_ms", c.measured_s >= 0 ? nlohmann::json(c.measured_s * 1e3) : nullptr}});
  return {{"strategy", overlap::to_string(s.strategy)},
          {"algorithm", overlap::to_string(s.algorithm)},
          {"lanes", s.lanes},
          {"chunks", s.chunks},
          {"by_model", s.by_model},
          {"by_measurement", s.by_measurement},
          {"evidence", s.evidence},
          {"predicted_ms", s.predicted_s * 1e3},
          {"candidates", cands},
          {"text", overlap::to_string(s)}};
}

/// The side of the limit: the reference schedule's halves and bulk's.
struct limit_sides {
  double one_gemm = 0, bulk_comm = 0;      ///< bulk's GEMM alone, bulk's collective alone
  double compute_only = 0, comm_only = 0;  ///< the reference schedule's halves
  std::string reference;                   ///< its name
  [[nodiscard]] double limit() const { return std::max(compute_only, comm_only); }
  [[nodiscard]] double stable_limit() const { return std::max(one_gemm, comm_only); }
};

using overlap::apps::world_rank;
using overlap::apps::world_size;

/// One overlap-bench run of element type T: this rank's slices, the three
/// contexts (both halves, compute only, comm only), the rows measured. The
/// world is a dp x tp mesh (--tp; one group by default): every tensor group
/// runs the op on its own data at the same time, and times are the slowest
/// rank's of the whole world.
template <class T, class Op>
class bench_run {
 public:
  explicit bench_run(const options& o)
      : o_(o),
        mesh_(MPI_COMM_WORLD, {{"dp", 0}, {"tp", o.tp > 0 ? o.tp : world_size()}}),
        R_(mesh_.size("tp")),
        p_(mesh_.coord("tp")),
        printer_(world_rank() == 0),
        sl_(slice_for(o, R_, p_)),
        garbage_(overlap::mpi::simulated && !o.check && times_only(overlap::config::from_env().sim)),
        a_(operand(sl_.a, 1)),
        b_(operand(sl_.b, 2)),
        c_(operand(sl_.c, 0)),
        drain_(MPI_COMM_WORLD, o.drain_bytes) {}

  /// Measures every row, prints the table (rank 0), appends the JSON; 0 when
  /// every result was right.
  int run() {
    measure_library();
    for (result& r : results_)  // the choice, not a schedule of its own to take apart
      if (r.strategy == "automatic") r.chosen = schedule_of(full_, r.strategy);
    if (o_.halves) measure_halves();
    if (o_.peers && o_.batch == 1) measure_peers();  // the peers compute one product
    if (!o_.save_calibration.empty() && !full_.save_calibration(o_.save_calibration) && printer_)
      fmt::print(stderr, "overlap-bench: no calibration to save (automatic asked no model)\n");
    if (printer_) {
      print_table();
      if (!o_.json.empty()) append_json();
    }
    return wrong_ == 0 ? 0 : 1;
  }

 private:
  static bool times_only(overlap::sim_compute s) {
    return s == overlap::sim_compute::skipped || s == overlap::sim_compute::calibrated;
  }
  /// --batch copies of one member's slice r, one after the other (salt 0:
  /// left for the op to write). Under SMPI's timing-only modes with
  /// --no-check the contents do not matter, and the buffer is shared by
  /// the simulated ranks, as the library's workspaces are there: on a
  /// dp x tp mesh every rank holds a whole group's shard, which at 1024
  /// ranks would not fit one machine's memory.
  [[nodiscard]] overlap::engine::buffer<T> operand(range2 r, uint32_t salt) const {
    const auto one = static_cast<size_t>(r.nr * r.nc);
    std::optional<overlap::mpi::shared_workspaces_scope> shared;
    if (garbage_) shared.emplace();
    overlap::engine::buffer<T> all(one * static_cast<size_t>(o_.batch));
    if (garbage_ || salt == 0) return all;
    const std::vector<T> values = make_slice<T>(r, salt);
    for (int64_t i = 0; i < o_.batch; ++i) std::copy(values.begin(), values.end(), all.data() + i * one);
    return all;
  }
  [[nodiscard]] overlap::batch batch() const {
    return {o_.batch, sl_.a.nr * sl_.a.nc, sl_.b.nr * sl_.b.nc, sl_.c.nr * sl_.c.nc, 0};
  }
  [[nodiscard]] overlap::matrix_view<const T> av() const { return {a_.data(), sl_.a.nr, sl_.a.nc}; }
  [[nodiscard]] overlap::matrix_view<const T> bv() const { return {b_.data(), sl_.b.nr, sl_.b.nc}; }
  [[nodiscard]] overlap::matrix_view<T> cv() { return {c_.data(), sl_.c.nr, sl_.c.nc}; }

  [[nodiscard]] overlap::context make_ctx(overlap::ring_phases ph) const {
    overlap::config cfg = overlap::config::from_env();
    cfg.phases = ph;
    return overlap::context(mesh_.comm("tp"), cfg);
  }
  template <class Options>
  Options options_for(asked s) const {
    Options opt;
    (void)overlap::parse_enum(o_.variant, opt.*Op::layout);
    opt.strategy = s.strategy, opt.algorithm = s.algorithm;
    opt.batch = batch();
    return opt;
  }
  /// The library's op on ctx, as the row named `name` asks for it.
  std::function<void()> op(overlap::context& ctx, const std::string& name) {
    const asked s = asked_for(name);
    return [this, &ctx, s] { Op::call(ctx, av(), bv(), cv(), options_for<typename Op::options>(s)); };
  }
  overlap::schedule schedule_of(overlap::context& ctx, const std::string& name) {
    const asked s = asked_for(name);
    return Op::schedule_of(ctx, av(), bv(), cv(), options_for<typename Op::options>(s));
  }
  /// Counts a wrong result (max relative error over ranks above T's tolerance).
  double judge(const std::string& name, double err) {
    double worst = 0;
    MPI_Allreduce(&err, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (!(worst <= tolerance<T>())) {
      ++wrong_;
      if (printer_) fmt::print(stderr, "overlap-bench: {} gives a wrong result (max rel err {:.3e})\n", name, worst);
    }
    return worst;
  }
  /// body's result from a first, unmeasured run, checked (with --no-check
  /// only run: its error is NaN, written as null).
  result checked(const std::string& name, const std::function<void()>& body) {
    // The fill shows an element the op left unwritten, so only a checked run
    // needs it; in a timing-only run C is shared by every simulated rank and
    // the fill cost each rank a page fault per page (at 1024 ranks of the
    // 65536-row all-gather, 8192 faults each, most of the run's real time).
    if (o_.check) std::fill(c_.data(), c_.data() + c_.size(), from_float<T>(-7.0f));
    body();
    if (!o_.check) return unchecked(name);
    if (!ref_) ref_ = reference_of<T>(sl_.c, o_.k);  // once per run: every row checks the same block
    return result{name, name, 0, judge(name, check(c_.data(), *ref_, sl_.c, o_.batch)), -1, -1, std::nullopt};
  }
  /// A row that is timed, not checked: its error is NaN (null in the JSON).
  static result unchecked(const std::string& name) { return result{name, name, 0, std::nan(""), -1, -1, std::nullopt}; }
  double median(const std::function<void()>& body) {
    return overlap::apps::median_max_ms(MPI_COMM_WORLD, o_.warmup, o_.iters, body, std::ref(drain_));
  }

  /// The library's rows (bulk and every --strategies entry), checked, then
  /// timed round-robin: one call of each per round, so that a slow phase of
  /// this shared machine does not favour whichever row ran at another time.
  void measure_library() {
    std::vector<std::function<void()>> bodies{op(full_, "bulk")};
    results_.push_back(checked("bulk", bodies.back()));
    for (const auto& s : o_.strategies) {
      if (s == "bulk") continue;
      bodies.push_back(op(full_, s));
      // automatic's first calls time its candidates (OVERLAP_AUTOMATIC=measured):
      // what is checked and timed is what it settles on.
      if (s == "automatic") settling_ = overlap::apps::run_until_settled(full_, bodies.back(), 40, std::ref(drain_));
      // Unchecked, its settling calls were its warm-up: one more unmeasured
      // call would only cost time (at 1024 simulated ranks, an eighth of the run).
      results_.push_back(s == "automatic" && !o_.check ? unchecked(s) : checked(s, bodies.back()));
    }
    const std::vector<double> rounds =
        overlap::apps::interleaved_median_max_ms(MPI_COMM_WORLD, o_.warmup, o_.iters, bodies, std::ref(drain_));
    for (size_t i = 0; i < results_.size(); ++i) results_[i].time_ms = rounds[i];
  }

  /// The stable side of the limit (bulk's one GEMM of the whole work alone,
  /// and its one collective alone), each decomposed strategy's own schedule
  /// with transfers off and with GEMMs off, and the reference schedule of
  /// the limit: the first decomposed one (bulk's own halves without one).
  void measure_halves() {
    sides_.one_gemm = median(op(compute_ctx_, "bulk"));
    sides_.bulk_comm = median(op(comm_ctx_, "bulk"));
    for (result& r : results_) {
      if (r.strategy == "bulk" || r.strategy == "automatic") continue;
      r.compute_only_ms = median(op(compute_ctx_, r.strategy));
      r.comm_only_ms = median(op(comm_ctx_, r.strategy));
    }
    sides_.reference = "bulk", sides_.compute_only = sides_.one_gemm, sides_.comm_only = sides_.bulk_comm;
    for (size_t i = 1; i < results_.size(); ++i)
      if (results_[i].compute_only_ms >= 0) {
        sides_.reference = results_[i].strategy;
        sides_.compute_only = results_[i].compute_only_ms, sides_.comm_only = results_[i].comm_only_ms;
        break;
      }
  }

  /// The hand-written pipeline (f32, the two most common layouts) and ScaLAPACK.
  void measure_peers() {
    if constexpr (std::is_same_v<T, float>) {
      if (auto peer = Op::pipeline(o_.variant, {o_.pipeline_chunks, o_.m, av(), bv(), cv()})) {
        result r = checked(peer->name, peer->body);
        r.time_ms = median(peer->body);
        results_.push_back(r);
      }
#ifdef OVERLAP_HAVE_SCALAPACK
      if (o_.m <= INT32_MAX && o_.n <= INT32_MAX && o_.k <= INT32_MAX) measure_scalapack();
#endif
    }
  }

#ifdef OVERLAP_HAVE_SCALAPACK
  /// ScaLAPACK computes the whole C = A @ B in its own layout, given its best
  /// grid shape and block size from a small search (each timed as a median
  /// of 3 after a warm-up); its elements of C are checked like every other case.
  void measure_scalapack() {
    const int m = static_cast<int>(o_.m), n = static_cast<int>(o_.n), k = static_cast<int>(o_.k);
    std::optional<overlap::apps::scalapack_peer> best;
    double best_ms = 0;
    nlohmann::json searched = nlohmann::json::array();
    for (int q = 1; q <= R_; ++q) {
      if (R_ % q != 0) continue;
      const int pr = R_ / q;
      const int whole = static_cast<int>((std::max({o_.m, o_.n, o_.k}) + std::max(pr, q) - 1) / std::max(pr, q));
      std::vector<int> blocks{64, 256};
      if (whole > 256) blocks.push_back(whole);
      for (int nb : blocks) {
        auto sp = overlap::apps::make_scalapack_peer(m, n, k, {pr, q, nb, nb}, global_value);
        if (!sp) continue;
        const double ms = overlap::apps::median_max_ms(MPI_COMM_WORLD, 1, 3, sp->body, std::ref(drain_));
        searched.push_back({{"layout", sp->layout.text()}, {"ms", ms}});
        if (!best || ms < best_ms) best = std::move(sp), best_ms = ms;
      }
    }
    if (!best) return;
    best->body();
    const double err = best->error([&](const std::vector<int64_t>& rows, const std::vector<int64_t>& cols) {
      return reference_block(rows, cols, o_.k);
    });
    result r{best->name, best->name, median(best->body), judge(best->name, err), -1, -1, std::nullopt};
    r.setup = {{"best", best->layout.text()}, {"searched", searched}};
    results_.push_back(r);
  }
#endif

  [[nodiscard]] std::string transport() const { return overlap::apps::transport_label(o_.transport, "unlabelled"); }
  [[nodiscard]] double flops() const { return 2.0 * double(o_.m) * double(o_.n) * double(o_.k) * double(o_.batch); }

  void print_header() {
    const limit_sides& l = sides_;
    if (o_.batch > 1) fmt::print("batches of {} products per call (overlap::batch)\n", o_.batch);
    fmt::print("overlap-bench: {} {} {} M={} N={} K={} ranks={} transport: {}\n", o_.op, o_.variant, o_.dtype, o_.m,
               o_.n, o_.k, R_, transport());
    if (mesh_.size("dp") > 1)
      fmt::print("{} tensor groups of {} ranks (dp x tp mesh) run the op at once, each on its own group\n",
                 mesh_.size("dp"), R_);
    fmt::print("{}\n", overlap::apps::provenance_line());
    fmt::print("gemm path (rank 0): {}\n", full_.gemm_path(overlap::dtype_of<T>()));
    fmt::print("median of {} iterations of the slowest rank\n", o_.iters);
    if (!o_.halves) {
      fmt::print("the halves of the limit are not timed (--no-halves)\n\n");
      fmt::print("{:<22}{:>10}{:>10}{:>10}{:>13}\n", "variant", "ms", "GFLOP/s", "x bulk", "max rel err");
      return;
    }
    fmt::print("limit = max(compute only, comm only) of the {} schedule; 1-GEMM limit = max(one GEMM, comm only)\n\n",
               l.reference);
    fmt::print("{:<22}{:>10}{:>10}{:>10}{:>10}{:>10}{:>13}\n", "variant", "ms", "GFLOP/s", "x bulk", "/ limit",
               "/ 1-GEMM", "max rel err");
    fmt::print("{:<22}{:>10.2f}{:>10.1f}   (bulk's GEMM of the whole work alone)\n", "one GEMM", l.one_gemm,
               flops() / l.one_gemm / 1e6);
    fmt::print("{:<22}{:>10.2f}{:>10.1f}   ({} schedule's GEMMs alone: {:.3f} x one GEMM)\n", "compute only",
               l.compute_only, flops() / l.compute_only / 1e6, l.reference, l.compute_only / l.one_gemm);
    fmt::print("{:<22}{:>10.2f}             ({} schedule's transfers alone)\n", "comm only", l.comm_only, l.reference);
    fmt::print("{:<22}{:>10.2f}             (bulk's collective alone)\n", "bulk comm only", l.bulk_comm);
  }

  void print_table() {
    print_header();
    const limit_sides& l = sides_;
    const double bulk_ms = results_.front().time_ms;
    for (const auto& r : results_)
      if (o_.halves)
        fmt::print("{:<22}{:>10.2f}{:>10.1f}{:>10.3f}{:>10.3f}{:>10.3f}{:>13.2e}\n", r.strategy, r.time_ms,
                   flops() / r.time_ms / 1e6, bulk_ms / r.time_ms, r.time_ms / l.limit(), r.time_ms / l.stable_limit(),
                   r.err);
      else
        fmt::print("{:<22}{:>10.2f}{:>10.1f}{:>10.3f}{:>13.2e}\n", r.strategy, r.time_ms, flops() / r.time_ms / 1e6,
                   bulk_ms / r.time_ms, r.err);
    for (const auto& r : results_)
      if (r.chosen)
        fmt::print("automatic chose: {} (settled after {} unmeasured calls)\n", overlap::to_string(*r.chosen),
                   settling_);
    for (const auto& r : results_)
      if (r.comm_only_ms >= 0 && r.strategy != l.reference)
        fmt::print("{:<22}{:>10.2f}  ({} schedule; comm only {:.2f} = {:.3f} x {}'s)\n", "  its compute only",
                   r.compute_only_ms, r.strategy, r.comm_only_ms, r.comm_only_ms / l.comm_only, l.reference);
  }

  /// One JSON object per row (the fields bench/report.py reads).
  nlohmann::json row_json(const result& r) {
    const limit_sides& l = sides_;
    const double bulk_ms = results_.front().time_ms;
    auto optional_ms = [](double v) { return v >= 0 ? nlohmann::json(v) : nlohmann::json(nullptr); };
    // --no-halves: the limit's sides were not timed.
    auto side = [&](double v) { return o_.halves ? nlohmann::json(v) : nlohmann::json(nullptr); };
    nlohmann::json row{
        {"op", Op::name},
        {"variant", o_.variant},
        {"strategy", r.strategy},
        {"dtype", o_.dtype},
        {"ranks", R_},
        {"tensor_groups", mesh_.size("dp")},
        {"m", o_.m},
        {"n", o_.n},
        {"k", o_.k},
        {"batch", o_.batch},
        {"time_ms", r.time_ms},
        {"compute_only_ms", side(l.compute_only)},
        {"comm_only_ms", side(l.comm_only)},
        {"bulk_ms", bulk_ms},
        {"speedup_vs_bulk", bulk_ms / r.time_ms},
        {"limit_ms", side(l.limit())},
        {"ratio_to_limit", side(r.time_ms / l.limit())},
        {"own_compute_only_ms", optional_ms(r.compute_only_ms)},
        {"own_comm_only_ms", optional_ms(r.comm_only_ms)},
        {"one_gemm_ms", side(l.one_gemm)},
        {"bulk_comm_only_ms", side(l.bulk_comm)},
        {"stable_limit_ms", side(l.stable_limit())},
        {"ratio_to_stable_limit", side(r.time_ms / l.stable_limit())},
        // A decomposed schedule's GEMMs against one GEMM of the same work.
        {"decomposition_overhead", optional_ms(r.compute_only_ms >= 0 ? r.compute_only_ms / l.one_gemm : -1)},
        {"max_rel_err", std::isnan(r.err) ? nlohmann::json(nullptr) : nlohmann::json(r.err)},
        {"checked", !std::isnan(r.err)},
        {"schedule", r.chosen ? nlohmann::json(schedule_json(*r.chosen)) : nullptr},
        {"automatic_settling_calls", r.chosen ? nlohmann::json(settling_) : nullptr},
        {"setup", r.setup},
        {"transport", transport()},
        {"backend", overlap::to_string(full_.backend_for<T>())},
        {"gemm_path", full_.gemm_path(overlap::dtype_of<T>())},
        {"progress", overlap::to_string(full_.config().progress)},
        {"progress_setting", overlap::describe_progress(full_.config())},
        {"progress_automatic",
         full_.progress_reason().empty() ? nlohmann::json(nullptr) : nlohmann::json(full_.progress_reason())},
        {"ring_order", overlap::to_string(full_.config().ring)},
        {"nodes", full_.nodes()},
        {"threads", std::getenv("OMP_NUM_THREADS") ? std::getenv("OMP_NUM_THREADS") : "default"},
        {"iterations", o_.iters}};
    row.update(provenance_);
    return row;
  }
  void append_json() {
    std::ofstream out(o_.json, std::ios::app);
    for (const auto& r : results_) out << row_json(r).dump() << "\n";
  }

  const options& o_;
  const nlohmann::json provenance_ = overlap::apps::provenance();
  overlap::mesh mesh_;  ///< dp x tp; the ops run on comm("tp")
  int R_, p_;           ///< the tensor group's size and this rank's place in it
  bool printer_;        ///< world rank 0 prints and writes the JSON
  slicing sl_;
  bool garbage_;  ///< SMPI, timing only, unchecked: the operands are shared by the simulated ranks (operand())
  overlap::engine::buffer<T> a_, b_, c_;
  std::optional<Eigen::MatrixXd> ref_;  ///< this rank's block of the exact C, made by the first check
  overlap::apps::link_drain drain_;
  // One context per ring_phases setting: same schedule, halves switched off.
  overlap::context full_ = make_ctx(overlap::ring_phases::both);
  overlap::context compute_ctx_ = make_ctx(overlap::ring_phases::compute_only);
  overlap::context comm_ctx_ = make_ctx(overlap::ring_phases::comm_only);
  std::vector<result> results_;
  limit_sides sides_;
  int wrong_ = 0;
  int settling_ = 0;  ///< unmeasured calls before automatic settled (run_until_settled)
};

/// The run of the op that --op names.
template <class T>
int run(const options& o) {
  if (o.op == "moe") {
    overlap::apps::moe_setup s;
    s.tokens = o.m, s.width = o.k, s.ffn = o.n, s.experts = o.experts, s.topk = o.topk, s.skew = o.skew;
    s.strategies = o.strategies, s.iters = o.iters, s.warmup = o.warmup, s.check = o.check, s.layer = o.moe_layer;
    s.drain_bytes = o.drain_bytes, s.tp = o.tp, s.json = o.json, s.transport = o.transport;
    return overlap::apps::moe_bench<T>(s).run();
  }
  int rc = 2;
  overlap::apps::bench_ops::for_each([&](auto op) {
    if (o.op == decltype(op)::flag) rc = bench_run<T, decltype(op)>(o).run();
  });
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  overlap::mpi::environment env(argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  options o;
  CLI::App app{"overlap-bench: compute only, comm only, bulk, decomposed strategies and peers, side by side"};
  overlap::apps::init_app(app);
  // The ops and their variants, from overlap-bench's table (common/bench_ops.hpp).
  std::vector<std::string> flags, variants;
  std::string op_help, variant_help, footer;
  overlap::apps::bench_ops::for_each([&](auto op) {
    using Op = decltype(op);
    flags.emplace_back(Op::flag);
    op_help += std::string(op_help.empty() ? "" : ", ") + Op::flag + " (" + Op::name + ")";
    variant_help += std::string(variant_help.empty() ? "" : "; ") + Op::flag + ":";
    for (const auto& v : Op::variants()) {
      if (std::find(variants.begin(), variants.end(), v.name) == variants.end()) variants.emplace_back(v.name);
      variant_help += std::string(" ") + v.name;
      footer += fmt::format("  --op {} --variant {:<9} {}  ({})\n", Op::flag, v.name, views_of(v), v.what);
    }
  });
  o.op = flags.front();
  // The mixture-of-experts step has its own run (common/moe_bench.hpp), not a variant of C = A @ B.
  flags.emplace_back("moe");
  op_help +=
      ", moe (all_to_all_matmul + matmul_all_to_all: dispatch, experts, combine; -m tokens of a group, "
      "-k model width, -n expert ffn width)";
  app.add_option("--op", o.op, op_help)->check(CLI::IsMember(flags));
  app.add_option("--experts", o.experts, "--op moe: experts of a group in all (a multiple of its ranks)")
      ->check(CLI::PositiveNumber);
  app.add_option("--topk", o.topk, "--op moe: experts per token")->check(CLI::PositiveNumber);
  app.add_flag("--moe-layer", o.moe_layer,
               "--op moe: time layers::moe_mlp's forward + backward (router, GELU, gates, every gradient) instead of "
               "the two ops (f32, f64; -k at least --experts)");
  app.add_option("--skew", o.skew, "--op moe: routing: uniform, or hot (expert 0 receives 4x the mean)")
      ->check(CLI::IsMember({"uniform", "hot"}));
  app.add_option("--variant", o.variant, variant_help + " (default: the op's first)")->check(CLI::IsMember(variants));
  app.add_option("-m", o.m, "global M: C = A @ B is M x N, A is M x K (see the shards below)")
      ->check(CLI::PositiveNumber);
  app.add_option("-n", o.n, "global N")->check(CLI::PositiveNumber);
  app.add_option("-k", o.k, "global K, the contracting dimension")->check(CLI::PositiveNumber);
  app.add_option("--dtype", o.dtype, "element type")->check(CLI::IsMember(overlap::enum_name_list<overlap::dtype>()));
  CLI::Option* strategies =
      app.add_option(
             "--strategies", o.strategies,
             "strategies to compare with bulk (always measured): ring, bidirectional, others (bulk moving the "
             "other operands), hierarchical (two levels on nodes of several ranks), automatic (the library's choice); "
             "--op moe: pairwise, automatic (its default)")
          ->check(CLI::IsMember([] {
            std::vector<std::string> names = overlap::enum_name_list<overlap::strategy>();
            names.emplace_back("others");  // a label of overlap-bench: bulk moving the other operands
            return names;
          }()))
          ->delimiter(',');
  app.add_flag("!--no-peers", o.peers,
               "skip the peers: the hand-written non-blocking-collective pipeline and ScaLAPACK");
  app.add_flag("!--no-halves", o.halves,
               "skip the halves of the limit (each decomposed schedule with its GEMMs off and with its transfers "
               "off, bulk's GEMM alone and its collective alone): only bulk and --strategies are timed, and the JSON's "
               "limit fields are null");
  app.add_flag("!--no-check", o.check,
               "time only, do not check results (for OVERLAP_SIM_COMPUTE=skipped under SMPI, where GEMMs are not "
               "computed); the JSON then has \"checked\": false and a null max_rel_err");
  app.add_option("--pipeline-chunks", o.pipeline_chunks, "chunks of the pipeline peer")->check(CLI::PositiveNumber);
  app.add_option("--iters", o.iters, "measured iterations (median reported)")->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup, "unmeasured iterations first")->check(CLI::NonNegativeNumber);
  app.add_option("--drain-bytes", o.drain_bytes,
                 "before every timed call (untimed), send this many bytes to each neighbour in rank order, so that "
                 "rate-limited emulated links (tc tbf buckets) start every call empty alike; tools/vcluster run sets "
                 "it to twice its bucket")
      ->envname("OVERLAP_BENCH_DRAIN_BYTES")
      ->check(CLI::Range(0L, long{1} << 30));
  app.add_option("--json", o.json, "append one JSON object per measured case to FILE (rank 0)");
  app.add_option("--tp", o.tp,
                 "tensor-parallel group size: the world becomes a dp x tp mesh (overlap::mesh, tp varying fastest) "
                 "and every group runs the op at once, on its own group; 0: one group of every rank")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--batch", o.batch,
                 "products per call (overlap::batch, members one after the other); the peers are skipped above 1")
      ->check(CLI::PositiveNumber);
  overlap::apps::add_common_options(app, o.transport, &o.save_calibration);
  // -m/-n/-k are global; each rank's views are these blocks (X_r: rank r's
  // balanced block of that dimension), as at the top of this file.
  app.footer(
      "Each rank's views of the global C = A @ B (M x K times K x N; M_r, K_r, N_r: this rank's balanced block):\n" +
      footer + "\n" + app.get_footer());
  if (auto done = overlap::apps::parse(app, argc, argv, rank)) return *done;
  if (o.variant.empty())
    overlap::apps::bench_ops::for_each([&](auto op) {
      if (o.op == decltype(op)::flag) o.variant = decltype(op)::variants().front().name;
    });
  if (o.op == "moe" && strategies->count() == 0) o.strategies = {"pairwise", "automatic"};
  o.strategies.erase(std::remove(o.strategies.begin(), o.strategies.end(), "bulk"), o.strategies.end());
  if (o.strategies.empty()) {
    if (rank == 0) fmt::print(stderr, "overlap-bench: --strategies needs more than bulk (bulk is always run)\n");
    return 2;
  }
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (o.tp > 0 && world % o.tp != 0) {
    if (rank == 0) fmt::print(stderr, "overlap-bench: --tp {} does not divide the {} ranks\n", o.tp, world);
    return 2;
  }
  if (o.tp > 0 && o.tp < world && o.peers && o.op != "moe") {
    // The peers run on the whole world; beside groups they would measure another problem.
    if (rank == 0) fmt::print(stderr, "overlap-bench: --tp {} < {} ranks: the peers are skipped\n", o.tp, world);
    o.peers = false;
  }
  try {
    if (o.dtype == "f64") return run<double>(o);
    if (o.dtype == "bf16") return run<overlap::bfloat16>(o);
    return run<float>(o);
  } catch (const std::exception& e) {
    fmt::print(stderr, "overlap-bench (rank {}): {}\n", rank, e.what());
    return 1;
  }
}
