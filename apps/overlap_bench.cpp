// overlap-bench: one tensor-parallel product measured every way side by side
// in one run: compute only and comm only (the same ring schedule's GEMMs
// alone and transfers alone), bulk, each decomposed strategy, and the peers a
// user would otherwise pick. Times are medians over iterations of the slowest
// rank. Every result is checked against a double-precision reference on the
// first iteration; a wrong result fails the run.
//
// The global problem is C = A @ B (M x K times K x N), sharded as a
// tensor-parallel layer shards it (balanced blocks):
//   ag lhs_rows: a = A[M_r, :],  b = B[:, N_r], c = C[:, N_r]
//   ag lhs_cols: a = A[:, K_r],  b = B[:, N_r], c = C[:, N_r]
//   ag rhs_rows: a = A[M_r, :],  b = B[K_r, :], c = C[M_r, :]
//   ag rhs_cols: a = A[M_r, :],  b = B[:, N_r], c = C[M_r, :]
//   rs rows:     a = A[:, K_r],  b = B[K_r, :], c = C[M_r, :]
//   rs cols:     a = A[:, K_r],  b = B[K_r, :], c = C[:, N_r]
#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <algorithm>

#include <Eigen/Core>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "common/measure.hpp"
#include "common/pipeline_peer.hpp"
#ifdef OVERLAP_HAVE_SCALAPACK
#include "common/scalapack_peer.hpp"
#endif
#include "overlap/overlap.hpp"

namespace {

struct options {
  std::string op = "ag", variant, dtype = "f32";  // variant defaults to lhs_rows (ag) or rows (rs)
  int64_t m = 2048, n = 2048, k = 2048;
  std::vector<std::string> strategies{"ring", "bidirectional"};
  bool peers = true;
  int pipeline_chunks = 4;
  int iters = 5, warmup = 1;
  std::string json, transport;
};

struct range2 {
  int64_t r0, nr, c0, nc;
};

/// The slices of A, B and C this rank holds for the chosen op and variant.
struct slicing {
  range2 a, b, c;
};

slicing slice_for(const options& o, int R, int p) {
  const auto M = overlap::shard_layout::balanced(o.m, R), N = overlap::shard_layout::balanced(o.n, R),
             K = overlap::shard_layout::balanced(o.k, R);
  const range2 all_a{0, o.m, 0, o.k}, all_b{0, o.k, 0, o.n};
  auto rows = [&](range2 r, const overlap::shard_layout& l) { return range2{l.offset(p), l.size(p), r.c0, r.nc}; };
  auto cols = [&](range2 r, const overlap::shard_layout& l) { return range2{r.r0, r.nr, l.offset(p), l.size(p)}; };
  const range2 all_c{0, o.m, 0, o.n};
  if (o.op == "ag") {
    if (o.variant == "lhs_rows") return {rows(all_a, M), cols(all_b, N), cols(all_c, N)};
    if (o.variant == "lhs_cols") return {cols(all_a, K), cols(all_b, N), cols(all_c, N)};
    if (o.variant == "rhs_rows") return {rows(all_a, M), rows(all_b, K), rows(all_c, M)};
    if (o.variant == "rhs_cols") return {rows(all_a, M), cols(all_b, N), rows(all_c, M)};
  } else {
    if (o.variant == "rows") return {cols(all_a, K), rows(all_b, K), rows(all_c, M)};
    if (o.variant == "cols") return {cols(all_a, K), rows(all_b, K), cols(all_c, N)};
  }
  throw CLI::ValidationError("--variant", "'" + o.variant + "' is not a variant of --op " + o.op);
}

template <class T>
T from_float(float f) {
  return static_cast<T>(f);
}

/// Element (i, j) of the global A or B: the same on every rank.
float global_value(int64_t i, int64_t j, uint32_t salt) {
  uint64_t h =
      static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull ^ (static_cast<uint64_t>(j) + salt) * 0xC2B2AE3D27D4EB4Full;
  h ^= h >> 29;
  return static_cast<float>(static_cast<int64_t>(h % 2001) - 1000) / 1000.0f;
}

template <class T>
std::vector<T> make_slice(range2 r, uint32_t salt) {
  std::vector<T> v(static_cast<size_t>(r.nr * r.nc));
  for (int64_t i = 0; i < r.nr; ++i)
    for (int64_t j = 0; j < r.nc; ++j)
      v[static_cast<size_t>(i * r.nc + j)] = from_float<T>(global_value(r.r0 + i, r.c0 + j, salt));
  return v;
}

/// max |c - ref| / max |ref| for this rank's block of C = A @ B (double, Eigen).
template <class T>
double check(const std::vector<T>& c, range2 cr, int64_t K) {
  Eigen::MatrixXd a(cr.nr, K), b(K, cr.nc);
  for (int64_t i = 0; i < cr.nr; ++i)
    for (int64_t q = 0; q < K; ++q) a(i, q) = double(from_float<T>(global_value(cr.r0 + i, q, 1)));
  for (int64_t q = 0; q < K; ++q)
    for (int64_t j = 0; j < cr.nc; ++j) b(q, j) = double(from_float<T>(global_value(q, cr.c0 + j, 2)));
  const Eigen::MatrixXd ref = a * b;
  double num = 0, den = 0;
  for (int64_t i = 0; i < cr.nr; ++i)
    for (int64_t j = 0; j < cr.nc; ++j) {
      num = std::max(num, std::abs(double(c[static_cast<size_t>(i * cr.nc + j)]) - ref(i, j)));
      den = std::max(den, std::abs(ref(i, j)));
    }
  return den > 0 ? num / den : num;
}

/// The exact product of the given global rows and columns of C = A @ B
/// (row-major, double, Eigen).
std::vector<double> reference_block(const std::vector<int64_t>& rows, const std::vector<int64_t>& cols, int64_t K) {
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

template <class T>
double tolerance() {
  if constexpr (std::is_same_v<T, double>)
    return 1e-10;
  else if constexpr (std::is_same_v<T, float>)
    return 1e-4;
  else
    return 2e-2;  // bf16: inputs rounded to 8 bits, one output rounding
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

/// The hand-written pipelines exist for the two most common layouts, in f32.
std::optional<overlap::apps::peer> make_pipeline_peer(const options& o, overlap::matrix_view<const float> a,
                                                      overlap::matrix_view<const float> b,
                                                      overlap::matrix_view<float> c) {
  if (o.op == "ag" && o.variant == "lhs_rows") return overlap::apps::ag_rows_pipeline(o.pipeline_chunks, o.m, a, b, c);
  if (o.op == "rs" && o.variant == "rows") return overlap::apps::rs_rows_pipeline(o.pipeline_chunks, o.m, a, b, c);
  return std::nullopt;
}

/// The schedule automatic chose, with the cost model's candidates.
nlohmann::json schedule_json(const overlap::schedule& s) {
  nlohmann::json cands = nlohmann::json::array();
  for (const auto& c : s.candidates)
    cands.push_back({{"strategy", overlap::to_string(c.strategy)},
                     {"algorithm", overlap::to_string(c.algorithm)},
                     {"chunks", c.chunks},
                     {"predicted_ms", c.predicted_s * 1e3}});
  return {{"strategy", overlap::to_string(s.strategy)},
          {"algorithm", overlap::to_string(s.algorithm)},
          {"lanes", s.lanes},
          {"chunks", s.chunks},
          {"by_model", s.by_model},
          {"predicted_ms", s.predicted_s * 1e3},
          {"candidates", cands},
          {"text", overlap::to_string(s)}};
}

template <class T>
int run(const options& o) {
  const int R = [] {
    int s = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &s);
    return s;
  }();
  const int p = [] {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
  }();
  const slicing sl = slice_for(o, R, p);
  const auto a = make_slice<T>(sl.a, 1), b = make_slice<T>(sl.b, 2);
  std::vector<T> c(static_cast<size_t>(sl.c.nr * sl.c.nc));
  const overlap::matrix_view<const T> av(a.data(), sl.a.nr, sl.a.nc), bv(b.data(), sl.b.nr, sl.b.nc);
  const overlap::matrix_view<T> cv(c.data(), sl.c.nr, sl.c.nc);
  const bool ag = o.op == "ag";

  // One context per ring_phases setting: same schedule, halves switched off.
  overlap::config base = overlap::config::from_env();
  auto make_ctx = [&](overlap::ring_phases ph) {
    overlap::config cfg = base;
    cfg.phases = ph;
    return overlap::context(MPI_COMM_WORLD, cfg);
  };
  overlap::context full = make_ctx(overlap::ring_phases::both);
  overlap::context compute_ctx = make_ctx(overlap::ring_phases::compute_only);
  overlap::context comm_ctx = make_ctx(overlap::ring_phases::comm_only);
  auto ag_opt = [&](asked s) {
    overlap::ag_options opt;
    const std::string& v = o.variant;
    opt.gathered = v == "lhs_rows"   ? overlap::gathered::lhs_rows
                   : v == "lhs_cols" ? overlap::gathered::lhs_cols
                   : v == "rhs_rows" ? overlap::gathered::rhs_rows
                                     : overlap::gathered::rhs_cols;
    opt.strategy = s.strategy, opt.algorithm = s.algorithm;
    return opt;
  };
  auto rs_opt = [&](asked s) {
    overlap::rs_options opt;
    opt.scattered = o.variant == "rows" ? overlap::scattered::rows : overlap::scattered::cols;
    opt.strategy = s.strategy, opt.algorithm = s.algorithm;
    return opt;
  };
  auto op = [&](overlap::context& ctx, asked s) {
    return [&, s] {
      if (ag)
        overlap::all_gather_matmul<T>(ctx, av, bv, cv, ag_opt(s));
      else
        overlap::matmul_reduce_scatter<T>(ctx, av, bv, cv, rs_opt(s));
    };
  };
  auto schedule_of = [&](overlap::context& ctx, asked s) {
    return ag ? overlap::all_gather_matmul_schedule<T>(ctx, av, bv, cv, ag_opt(s))
              : overlap::matmul_reduce_scatter_schedule<T>(ctx, av, bv, cv, rs_opt(s));
  };
  int wrong = 0;
  // Checks body's result from a first, unmeasured run.
  auto checked = [&](const std::string& name, const std::function<void()>& body) {
    std::fill(c.begin(), c.end(), from_float<T>(-7.0f));
    body();
    double err = check(c, sl.c, o.k), worst = 0;
    MPI_Allreduce(&err, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (!(worst <= tolerance<T>())) {
      ++wrong;
      if (p == 0) fmt::print(stderr, "overlap-bench: {} gives a wrong result (max rel err {:.3e})\n", name, worst);
    }
    return result{name, name, 0, worst, -1, -1, std::nullopt};
  };
  // Checks body's result, then times it.
  auto measure_checked = [&](const std::string& name, const std::function<void()>& body) {
    result r = checked(name, body);
    r.time_ms = overlap::apps::median_max_ms(MPI_COMM_WORLD, o.warmup, o.iters, body);
    return r;
  };

  // Each decomposed strategy's own schedule with transfers off and with GEMMs
  // off; the reference limit is the first one's (ring by default).
  // The library's rows (bulk and every --strategies entry) are checked, then
  // timed round-robin: one call of each per round, so that a slow phase of
  // this shared machine does not favour whichever row ran at another time.
  std::vector<result> results;
  std::vector<std::function<void()>> bodies{op(full, asked_for("bulk"))};
  results.push_back(checked("bulk", bodies.back()));
  for (const auto& s : o.strategies)
    if (s != "bulk") bodies.push_back(op(full, asked_for(s))), results.push_back(checked(s, bodies.back()));
  const std::vector<double> rounds =
      overlap::apps::interleaved_median_max_ms(MPI_COMM_WORLD, o.warmup, o.iters, bodies);
  for (size_t i = 0; i < results.size(); ++i) results[i].time_ms = rounds[i];
  // The stable side of the limit: bulk's one GEMM of the whole work alone
  // (a decomposed schedule's own compute only moves with its pieces' rate),
  // and bulk's one collective alone.
  const double one_gemm =
      overlap::apps::median_max_ms(MPI_COMM_WORLD, o.warmup, o.iters, op(compute_ctx, asked_for("bulk")));
  const double bulk_comm =
      overlap::apps::median_max_ms(MPI_COMM_WORLD, o.warmup, o.iters, op(comm_ctx, asked_for("bulk")));
  for (result& r : results) {
    if (r.strategy == "bulk") continue;
    if (r.strategy == "automatic") {  // the choice, not a schedule of its own to take apart
      r.chosen = schedule_of(full, asked_for(r.strategy));
    } else {
      r.compute_only_ms =
          overlap::apps::median_max_ms(MPI_COMM_WORLD, o.warmup, o.iters, op(compute_ctx, asked_for(r.strategy)));
      r.comm_only_ms =
          overlap::apps::median_max_ms(MPI_COMM_WORLD, o.warmup, o.iters, op(comm_ctx, asked_for(r.strategy)));
    }
  }
  // The reference schedule of the limit: the first decomposed one measured
  // in halves (bulk's own halves when there is none). A copy: the peers'
  // results are appended below.
  result first = results[0];
  first.compute_only_ms = one_gemm, first.comm_only_ms = bulk_comm;
  for (size_t i = 1; i < results.size(); ++i)
    if (results[i].compute_only_ms >= 0) {
      first = results[i];
      break;
    }
  const double compute_only = first.compute_only_ms, comm_only = first.comm_only_ms;
  if (o.peers) {
    if constexpr (std::is_same_v<T, float>) {
      if (auto peer = make_pipeline_peer(o, av, bv, cv)) results.push_back(measure_checked(peer->name, peer->body));
    }
  }

#ifdef OVERLAP_HAVE_SCALAPACK
  // ScaLAPACK computes the whole C = A @ B in its own layout, given its best
  // grid shape and block size from a small search (each timed as a median of
  // 3 after a warm-up); its elements of C are checked like every other case.
  if constexpr (std::is_same_v<T, float>) {
    if (o.peers && o.m <= INT32_MAX && o.n <= INT32_MAX && o.k <= INT32_MAX) {
      const int m = static_cast<int>(o.m), n = static_cast<int>(o.n), k = static_cast<int>(o.k);
      std::optional<overlap::apps::scalapack_peer> best;
      double best_ms = 0;
      nlohmann::json searched = nlohmann::json::array();
      for (int q = 1; q <= R; ++q) {
        if (R % q != 0) continue;
        const int pr = R / q;
        const int whole = static_cast<int>((std::max({o.m, o.n, o.k}) + std::max(pr, q) - 1) / std::max(pr, q));
        std::vector<int> blocks{64, 256};
        if (whole > 256) blocks.push_back(whole);
        for (int nb : blocks) {
          auto sp = overlap::apps::make_scalapack_peer(m, n, k, {pr, q, nb, nb}, global_value);
          if (!sp) continue;
          const double ms = overlap::apps::median_max_ms(MPI_COMM_WORLD, 1, 3, sp->body);
          searched.push_back({{"layout", sp->layout.text()}, {"ms", ms}});
          if (!best || ms < best_ms) best = std::move(sp), best_ms = ms;
        }
      }
      if (best) {
        best->body();
        double err = best->error([&](const std::vector<int64_t>& rows, const std::vector<int64_t>& cols) {
          return reference_block(rows, cols, o.k);
        });
        double worst = 0;
        MPI_Allreduce(&err, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (!(worst <= tolerance<T>())) {
          ++wrong;
          if (p == 0) fmt::print(stderr, "overlap-bench: {} gives a wrong result ({:.3e})\n", best->name, worst);
        }
        result r{best->name,  best->name, overlap::apps::median_max_ms(MPI_COMM_WORLD, o.warmup, o.iters, best->body),
                 worst,       -1,         -1,
                 std::nullopt};
        r.setup = {{"best", best->layout.text()}, {"searched", searched}};
        results.push_back(r);
      }
    }
  }
#endif
  const double bulk_ms = results.front().time_ms, limit = std::max(compute_only, comm_only);
  const double stable_limit = std::max(one_gemm, comm_only);
  const std::string transport = !o.transport.empty()               ? o.transport
                                : std::getenv("OVERLAP_TRANSPORT") ? std::getenv("OVERLAP_TRANSPORT")
                                                                   : "unlabelled";
  if (p == 0) {
    const double flops = 2.0 * double(o.m) * double(o.n) * double(o.k);
    fmt::print("overlap-bench: {} {} {} M={} N={} K={} ranks={} transport: {}\n", o.op, o.variant, o.dtype, o.m, o.n,
               o.k, R, transport);
    fmt::print("gemm path (rank 0): {}\n", full.gemm_path(overlap::dtype_of<T>()));
    fmt::print("median of {} iterations of the slowest rank\n", o.iters);
    fmt::print("limit = max(compute only, comm only) of the {} schedule; 1-GEMM limit = max(one GEMM, comm only)\n\n",
               first.strategy);
    fmt::print("{:<22}{:>10}{:>10}{:>10}{:>10}{:>10}{:>13}\n", "variant", "ms", "GFLOP/s", "x bulk", "/ limit",
               "/ 1-GEMM", "max rel err");
    fmt::print("{:<22}{:>10.2f}{:>10.1f}   (bulk's GEMM of the whole work alone)\n", "one GEMM", one_gemm,
               flops / one_gemm / 1e6);
    fmt::print("{:<22}{:>10.2f}{:>10.1f}   ({} schedule's GEMMs alone: {:.3f} x one GEMM)\n", "compute only",
               compute_only, flops / compute_only / 1e6, first.strategy, compute_only / one_gemm);
    fmt::print("{:<22}{:>10.2f}             ({} schedule's transfers alone)\n", "comm only", comm_only, first.strategy);
    fmt::print("{:<22}{:>10.2f}             (bulk's collective alone)\n", "bulk comm only", bulk_comm);
    for (const auto& r : results)
      fmt::print("{:<22}{:>10.2f}{:>10.1f}{:>10.3f}{:>10.3f}{:>10.3f}{:>13.2e}\n", r.strategy, r.time_ms,
                 flops / r.time_ms / 1e6, bulk_ms / r.time_ms, r.time_ms / limit, r.time_ms / stable_limit, r.err);
    for (const auto& r : results)
      if (r.chosen) fmt::print("automatic chose: {}\n", overlap::to_string(*r.chosen));
    for (const auto& r : results)
      if (r.comm_only_ms >= 0 && r.strategy != first.strategy)
        fmt::print("{:<22}{:>10.2f}  ({} schedule; comm only {:.2f} = {:.3f} x {}'s)\n", "  its compute only",
                   r.compute_only_ms, r.strategy, r.comm_only_ms, r.comm_only_ms / comm_only, first.strategy);
    if (!o.json.empty()) {
      std::ofstream out(o.json, std::ios::app);
      for (const auto& r : results) {
        nlohmann::json j{
            {"op", o.op == "ag" ? "all_gather_matmul" : "matmul_reduce_scatter"},
            {"variant", o.variant},
            {"strategy", r.strategy},
            {"dtype", o.dtype},
            {"ranks", R},
            {"m", o.m},
            {"n", o.n},
            {"k", o.k},
            {"time_ms", r.time_ms},
            {"compute_only_ms", compute_only},
            {"comm_only_ms", comm_only},
            {"bulk_ms", bulk_ms},
            {"speedup_vs_bulk", bulk_ms / r.time_ms},
            {"limit_ms", limit},
            {"ratio_to_limit", r.time_ms / limit},
            {"own_compute_only_ms", r.compute_only_ms >= 0 ? nlohmann::json(r.compute_only_ms) : nullptr},
            {"own_comm_only_ms", r.comm_only_ms >= 0 ? nlohmann::json(r.comm_only_ms) : nullptr},
            {"one_gemm_ms", one_gemm},
            {"bulk_comm_only_ms", bulk_comm},
            {"stable_limit_ms", stable_limit},
            {"ratio_to_stable_limit", r.time_ms / stable_limit},
            // A decomposed schedule's GEMMs against one GEMM of the same work.
            {"decomposition_overhead", r.compute_only_ms >= 0 ? nlohmann::json(r.compute_only_ms / one_gemm) : nullptr},

            {"max_rel_err", r.err},
            {"schedule", r.chosen ? nlohmann::json(schedule_json(*r.chosen)) : nullptr},
            {"setup", r.setup},
            {"transport", transport},
            {"backend", overlap::to_string(full.backend_for<T>())},
            {"gemm_path", full.gemm_path(overlap::dtype_of<T>())},
            {"progress", overlap::to_string(full.config().progress)},
            {"progress_setting", overlap::describe_progress(full.config())},
            {"threads", std::getenv("OMP_NUM_THREADS") ? std::getenv("OMP_NUM_THREADS") : "default"},
            {"iterations", o.iters}};
        out << j.dump() << "\n";
      }
    }
  }
  return wrong == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  overlap::mpi::environment env(argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  options o;
  CLI::App app{"overlap-bench: compute only, comm only, bulk, decomposed strategies and peers, side by side"};
  app.add_option("--op", o.op, "ag (all_gather_matmul) or rs (matmul_reduce_scatter)")
      ->check(CLI::IsMember({"ag", "rs"}));
  app.add_option("--variant", o.variant, "ag: lhs_rows|lhs_cols|rhs_rows|rhs_cols; rs: rows|cols (default: the first)")
      ->check(CLI::IsMember({"lhs_rows", "lhs_cols", "rhs_rows", "rhs_cols", "rows", "cols"}));
  app.add_option("-m", o.m, "global M")->check(CLI::PositiveNumber);
  app.add_option("-n", o.n, "global N")->check(CLI::PositiveNumber);
  app.add_option("-k", o.k, "global K")->check(CLI::PositiveNumber);
  app.add_option("--dtype", o.dtype, "element type")->check(CLI::IsMember({"f32", "bf16", "f64"}));
  app.add_option("--strategies", o.strategies,
                 "strategies to compare with bulk (always measured): ring, bidirectional, others (bulk moving the "
                 "other operands), automatic (the library's choice)")
      ->check(CLI::IsMember({"bulk", "ring", "bidirectional", "others", "automatic"}))
      ->delimiter(',');
  app.add_flag("!--no-peers", o.peers, "skip the hand-written non-blocking-collective pipeline peer");
  app.add_option("--pipeline-chunks", o.pipeline_chunks, "chunks of the pipeline peer")->check(CLI::PositiveNumber);
  app.add_option("--iters", o.iters, "measured iterations (median reported)")->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup, "unmeasured iterations first")->check(CLI::NonNegativeNumber);
  app.add_option("--json", o.json, "append one JSON object per measured case to FILE (rank 0)");
  app.add_option("--transport", o.transport, "label of the transport for the report (default: $OVERLAP_TRANSPORT)");
  app.footer("Library settings come from the environment:\n" + overlap::env_help());
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return rank == 0 ? app.exit(e) : (e.get_exit_code() == 0 ? 0 : 1);
  }
  if (o.variant.empty()) o.variant = o.op == "ag" ? "lhs_rows" : "rows";
  o.strategies.erase(std::remove(o.strategies.begin(), o.strategies.end(), "bulk"), o.strategies.end());
  if (o.strategies.empty()) {
    if (rank == 0) fmt::print(stderr, "overlap-bench: --strategies needs more than bulk (bulk is always run)\n");
    return 2;
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
