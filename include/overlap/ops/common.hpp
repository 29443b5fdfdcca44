#pragma once
/// @file
/// Pieces shared by the ops' plans: logical shapes of possibly transposed
/// views, ranges and chunks, block copies, the plan's datatype cache, and the
/// checks of options every op has.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstddef>
#include <map>
#include <string>
#include <thread>
#include <tuple>

#include "overlap/context.hpp"
#include "overlap/engine/buffer.hpp"
#include "overlap/engine/ring.hpp"
#include "overlap/matrix.hpp"
#include "overlap/mpi/datatype.hpp"
#include "overlap/ops/agreement.hpp"
#include "overlap/ops/options.hpp"

namespace overlap::detail {

/// Rows and columns of op(v): v itself, or v^T when transposed.
struct dims2 {
  int64_t rows = 0, cols = 0;
};
template <class T>
dims2 op_dims(const matrix_view<T>& v, bool transposed) {
  return transposed ? dims2{v.cols, v.rows} : dims2{v.rows, v.cols};
}
/// "a" or "a^T": how messages name an operand's logical form.
inline std::string op_name(const char* n, bool transposed) { return transposed ? std::string(n) + "^T" : n; }

/// Start of chunk j when `extent` is split into `chunks` near-equal parts.
inline int64_t chunk_begin(int64_t extent, int chunks, int j) {
  return extent / chunks * j + std::min<int64_t>(j, extent % chunks);
}

/// A half-open index range [begin, begin + len).
struct range {
  int64_t begin = 0, len = 0;
  [[nodiscard]] range chunk(int chunks, int j) const {
    const int64_t b = chunk_begin(len, chunks, j);
    return {begin + b, chunk_begin(len, chunks, j + 1) - b};
  }
};

template <class T>
void copy_block(matrix_view<const T> src, matrix_view<T> dst) {
  for (int64_t i = 0; i < src.rows; ++i) std::copy_n(src.data + i * src.ld, src.cols, dst.data + i * dst.ld);
}

/// Derived datatypes of the blocks a plan transfers (elements of one dtype),
/// created once per (rows, cols, ld) and owned by the plan.
class block_types {
 public:
  explicit block_types(dtype t = dtype::f32) : base_(mpi_type_of(t)) {}
  MPI_Datatype get(int64_t rows, int64_t cols, int64_t ld) {
    auto& t = types_[{rows, cols, ld}];
    if (t.get() == MPI_DATATYPE_NULL) t = mpi::block_type(rows, cols, ld, base_);
    return t.get();
  }

 private:
  MPI_Datatype base_;
  std::map<std::tuple<int64_t, int64_t, int64_t>, mpi::datatype> types_;
};

/// Packs the stationary operand B once per call for every ring piece that
/// reads all of it (docs/design.md, "Pieces"): the step kernels are made with
/// gemm_desc::pack_b, and if every non-empty piece's kernel reads the same
/// packed layout, one of them packs B into a plan-owned buffer before the
/// ring; otherwise (no packed layout on this CPU, or layouts that differ
/// between piece shapes) the steps are rebuilt to read B as stored.
struct b_packing {
  std::shared_ptr<const gemm_kernel> packer;  ///< null: B is read as stored
  engine::buffer<std::byte> packed;

  /// Steps: a range of {desc, kernel, nonempty()}; rebuild(desc) makes a kernel.
  template <class Steps, class Rebuild>
  void choose(Steps& steps, Rebuild&& rebuild) {
    uint64_t layout = 0;
    bool same = true;
    for (const auto& st : steps) {
      if (!st.nonempty() || !st.desc.pack_b) continue;
      const uint64_t l = st.kernel->packed_b_layout();
      if (layout == 0 && packer == nullptr) layout = l, packer = st.kernel;
      same = same && l == layout;
    }
    if (same && layout != 0) {
      packed = engine::buffer<std::byte>(packer->packed_b_bytes());
      return;
    }
    packer = nullptr;
    for (auto& st : steps)
      if (st.desc.pack_b) st.desc.pack_b = false, st.kernel = rebuild(st.desc);
  }
  /// Before the ring: packs B (as stored) for this call.
  void pack(const void* b) const {
    if (packer != nullptr) packer->pack_b(b, packed.data());
  }
  /// The B a piece reads: the packed copy, or `stored`.
  [[nodiscard]] const void* b(const void* stored) const { return packer != nullptr ? packed.data() : stored; }
};

/// Checks the options all ops share; returns their values for the agreement table.
inline void check_common_options(arg_checks& checks, const char* opts, overlap::strategy s, overlap::algorithm alg,
                                 const epilogue& e) {
  const auto sv = static_cast<int>(s);
  const auto gv = static_cast<int>(alg);
  const auto av = static_cast<int>(e.activation);
  checks.require(sv >= 0 && sv <= 3, std::string(opts) + ".strategy has an invalid value " + std::to_string(sv));
  checks.require(gv >= 0 && gv <= 2, std::string(opts) + ".algorithm has an invalid value " + std::to_string(gv));
  checks.require(av >= 0 && av <= 2,
                 std::string(opts) + ".epilogue.activation has an invalid value " + std::to_string(av));
  if (alg == algorithm::others && (s == strategy::ring || s == strategy::bidirectional))
    checks.require(false, std::string(opts) + ".algorithm others is not a ring schedule; " + opts + ".strategy " +
                              to_string(s) + " cannot run it (use bulk or automatic)");
}

/// The backend for T under ctx's config as a plan-key value; a combination no
/// backend has becomes a failed check (reported on every rank by agree()).
template <class T>
int checked_backend(const context& ctx, arg_checks& checks) {
  try {
    return static_cast<int>(ctx.backend_for<T>());
  } catch (const std::invalid_argument& e) {
    checks.require(false, e.what());
    return -1;
  }
}

/// What the ranks agreed on: every rank's cached plan matches (`cached`), or
/// the table of every rank's values (row r = rank r's `mine`).
struct agreement {
  plan_base* cached = nullptr;
  std::vector<int64_t> table;
};

/// Collective part of the cross-rank rules: the entries [0, n) of every rank's
/// row must equal rank 0's (options that have to agree).
inline void require_same_options(const std::vector<int64_t>& all, size_t row_len, int ranks, size_t n,
                                 const char* const* names, const std::string& op) {
  for (int r = 1; r < ranks; ++r)
    for (size_t i = 0; i < n; ++i) {
      const int64_t v0 = all[i], vr = all[static_cast<size_t>(r) * row_len + i];
      if (vr != v0)
        throw std::invalid_argument(op + ": " + names[i] + " differs across ranks (rank 0: " + std::to_string(v0) +
                                    ", rank " + std::to_string(r) + ": " + std::to_string(vr) + "); it must agree");
    }
}

/// "a, b, c" as a list: how verbose plans print shard sizes.
inline std::string list(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

/// The strategy a plan runs for the requested one on R ranks: automatic is
/// bulk when all ranks share one node (shared-memory copies take the cores
/// that compute, so there is nothing to hide) and ring otherwise;
/// bidirectional needs two distinct neighbours (R >= 3), and at R <= 2 the
/// one-way ring already carries data both ways on the only link.
inline overlap::strategy resolve_strategy(overlap::strategy s, int ranks, bool one_node) {
  if (s == strategy::automatic) return one_node ? strategy::bulk : strategy::ring;
  if (s == strategy::bidirectional && ranks <= 2) return strategy::ring;
  return s;
}

/// Chunks per shard (per lane) a ring plan uses: the configured count, or,
/// when it is 0, the plan's choice. A ring exposes about one piece's product
/// (all-gather: the last; reduce-scatter: the first) that nothing overlaps,
/// 1 / (ranks * lanes * chunks) of the work, so the plan aims at 12 pieces or
/// more in all, while keeping each piece's message >= 512 KiB (per-message
/// latency; on TCP this size still streams at the link rate) and its product
/// at least max(128, knee_units) wide along the split dimension: 128 rows for
/// any kernel, and knee_units, the largest over ranks of context::piece_knee
/// (below AVX-512 oneDNN's sgemm switches to slower kernels for thinner
/// pieces); the measurements behind both are in docs/design.md ("Chunks",
/// "Pieces: shapes from measured rates").
/// It also starts from `preferred` chunks, which give the engine's window
/// two messages in flight per lane (all-gather: 2, reduce-scatter: 3; one
/// in flight stalls TCP links, see docs/design.md). min_chunks is 2 for
/// reduce-scatter, whose accumulator of one chunk travels while the next is
/// computed. Inputs must be global sizes (the same on every rank) so that
/// all ranks choose alike. When all ranks share one node, MPI copies through
/// shared memory with the cores that compute: there is nothing to overlap
/// (comm only is 1-3% of compute there, docs/results.md), so the plan takes
/// min_chunks, the fewest and largest GEMMs.
/// The (min_chunks, preferred) each op passes to plan_chunks.
struct chunk_rule {
  int min_chunks, preferred;
};
inline constexpr chunk_rule ag_chunk_rule{1, 2}, rs_chunk_rule{2, 3};

inline int plan_chunks(int configured, int min_chunks, int preferred, int ranks, int lanes, int64_t piece_units,
                       int64_t bytes_per_unit, bool one_node, int64_t knee_units = 0) {
  if (configured > 0) return configured;
  if (one_node) return min_chunks;
  const int pieces = ranks * lanes;
  const int64_t min_units = std::max<int64_t>(128, knee_units);
  int c = std::max({min_chunks, preferred, (12 + pieces - 1) / pieces});
  while (c > min_chunks && (piece_units / c < min_units || piece_units / c * bytes_per_unit < (int64_t{512} << 10))) --c;
  return c;
}

/// A ring plan's schedule, as verbose plans print it ("" for bulk). Plan:
/// strategy, lanes, n_steps, window, and steps whose first has nr x nc.
template <class Plan>
std::string ring_summary(overlap::strategy asked, const Plan& plan, int chunks, bool chosen, size_t slot_bytes) {
  if (plan.strategy == strategy::bulk) return "";
  std::string s;
  if (asked != plan.strategy) s += " (" + std::string(to_string(asked)) + " asked)";
  const auto& first = plan.steps.front();
  const auto busiest = std::max_element(plan.steps.begin(), plan.steps.end(),
                                        [](const auto& x, const auto& y) { return x.nr * x.nc < y.nr * y.nc; });
  s += ", piece kernel " + busiest->kernel->name() +
       (plan.pack.packer ? " reading b packed once per call (" + std::to_string(plan.pack.packed.size()) + " bytes)"
                         : std::string(""));
  return s + ", " + std::to_string(plan.lanes) + (plan.lanes == 1 ? " lane, " : " lanes, ") +
         std::to_string(plan.n_steps) + " steps, " + std::to_string(chunks) + " chunks per shard" +
         (plan.lanes == 2 ? " half" : "") + (chosen ? " (plan's choice)" : " (configured)") + ", receives posted " +
         std::to_string(plan.window.lead) + " steps ahead, sends in flight up to " +
         std::to_string(plan.window.send_slack + 1) + " steps, " + std::to_string(slot_bytes) +
         " bytes of slots, rank 0's first piece " + std::to_string(first.nr) + " x " + std::to_string(first.nc);
}

/// Prints a built plan on rank 0 when the config is verbose: the op's own
/// description, its ring schedule, the progress policy and the GEMM path.
inline void log_built_plan(const context& ctx, const std::string& what, const std::string& ring, dtype t) {
  ctx.log_plan(what + ring + ", progress " + describe_progress(ctx.config()) + ", gemm " + ctx.gemm_path(t));
}

/// Test hook: the context rank `rank` fails (throws overlap::error from its
/// GEMM) at ring step `step` of every ring it runs, or, with stall_s > 0,
/// sleeps that long there (and before a bulk op's collective) instead;
/// rank -1: off. Tests of the fatal policy and the watchdog set it; nothing
/// else should.
struct fault_injection {
  int rank = -1;
  int step = -1;
  double stall_s = 0;
};
inline fault_injection test_fault;

/// The stall of test_fault, on its rank.
inline void maybe_stall(int rank) {
  if (test_fault.rank == rank && test_fault.stall_s > 0)
    std::this_thread::sleep_for(std::chrono::duration<double>(test_fault.stall_s));
}

/// A pattern whose step `step` fails, for fault_injection.
template <class Pattern>
struct faulty_pattern {
  Pattern& p;
  int step;
  [[nodiscard]] int steps() const { return p.steps(); }
  [[nodiscard]] engine::ring_window window() const { return p.window(); }
  [[nodiscard]] engine::transfer recv(int t, int lane) const { return p.recv(t, lane); }
  [[nodiscard]] engine::transfer send(int t, int lane) const { return p.send(t, lane); }
  void compute(int t) {
    if (t == step) {
      if (test_fault.stall_s <= 0)
        throw error(error_source::backend, -1, "test fault", "injected at ring step " + std::to_string(t + 1));
      maybe_stall(test_fault.rank);
    }
    p.compute(t);
  }
};

/// Runs `f`, a part of an op after the ranks agreed to run it, on the one
/// error path of such parts: the peers are in it too, so a watchdog timeout,
/// an MPI or backend error or any other exception is fatal (context::fatal
/// applies the policy). where() describes the place; `part` names it in
/// the call of the report ("ring": "ring wait", "ring step").
template <class Where, class F>
void fatal_on_failure(context& ctx, const plan_base& plan, const std::string& part, Where&& where, F&& f) {
  try {
    f();
  } catch (const mpi::wait_timeout& e) {
    ctx.fatal("watchdog: " + plan.summary + ": " + e.what(), (part + " wait").c_str(), 0, error_source::watchdog);
  } catch (const error& e) {
    ctx.fatal(where() + ": " + e.what(), e.call().c_str(), e.code(), e.source());
  } catch (const std::exception& e) {
    ctx.fatal(where() + ": " + e.what(), (part + " step").c_str(), 0, error_source::backend);
  }
}

/// Runs an op's ring pattern on the context's ring. Lane 0 carries data from
/// rank p + 1 to p - 1, lane 1 (bidirectional) from p - 1 to p + 1; `tag`
/// keeps the ops' messages apart, and each lane has its own. Any failure
/// inside the ring (MPI, backend, the watchdog) is fatal: the peers are in
/// the ring too (context::fatal applies the policy).
template <class Pattern>
void run_on_ring(context& ctx, const plan_base& plan, Pattern& pattern, int tag, int lanes) {
  const int R = ctx.size(), p = ctx.rank();
  engine::ring_links links;
  links.comm = ctx.comm();
  links.n_lanes = lanes;
  links.lanes[0] = {(p + 1) % R, (p + R - 1) % R, 2 * tag};
  links.lanes[1] = {(p + R - 1) % R, (p + 1) % R, 2 * tag + 1};
  const bool trace = ctx.config().verbose >= 2 && p == 0;
  int step = 0;
  // Where the failure happened: the plan, the step, and the ring neighbours.
  auto where = [&] {
    std::string s = plan.summary + ", at ring step " + std::to_string(step + 1) + " of " +
                    std::to_string(pattern.steps()) + " (lane 0 receives from rank " + std::to_string(links.lanes[0].from) +
                    " and sends to rank " + std::to_string(links.lanes[0].to);
    return s + (lanes == 2 ? "; lane 1 the other way)" : ")");
  };
  fatal_on_failure(ctx, plan, "ring", where, [&] {
    if (test_fault.rank == p) {
      faulty_pattern<Pattern> faulty{pattern, test_fault.step};
      engine::run_ring(links, faulty, ctx.requests(), ctx.progress(), ctx.config().phases, trace, &step);
    } else {
      engine::run_ring(links, pattern, ctx.requests(), ctx.progress(), ctx.config().phases, trace, &step);
    }
  });
}

/// Runs a bulk collective of a plan (blocking, or bounded by the watchdog);
/// not at all under ring_phases::compute_only (benchmarks time each half alone).
template <class Blocking, class Start>
void run_collective(context& ctx, const plan_base& plan, const char* call, Blocking&& blocking, Start&& start) {
  if (ctx.config().phases == ring_phases::compute_only) return;
  maybe_stall(ctx.rank());
  ctx.collective(call, blocking, start, [&] { return plan.summary; });
}

/// Runs a local compute step outside a ring (a bulk GEMM, packing B, a
/// finishing pass): a failure there is fatal like one in a ring, since the
/// peers go on to the next collective. Not at all under
/// ring_phases::comm_only.
template <class F>
void run_local_step(context& ctx, const plan_base& plan, F&& f) {
  if (ctx.config().phases == ring_phases::comm_only) return;
  try {
    f();
  } catch (const error& e) {
    ctx.fatal(plan.summary + ": " + e.what(), e.call().c_str(), e.code(), e.source());
  }
}

/// Collective: agree() on the cached plan for `key`, and on a miss anywhere
/// exchange every rank's `mine` and require its first n_options entries
/// (named by option_names) to be the same on every rank.
inline agreement agree_or_exchange(context& ctx, const arg_checks& checks, const plan_key& key,
                                   const std::vector<int64_t>& mine, size_t n_options,
                                   const char* const* option_names) {
  plan_base* cached = checks.failed() ? nullptr : ctx.find_plan(key);
  if (agree(ctx, checks, cached)) return {cached, {}};
  agreement a{nullptr, allgather_values(ctx, mine, checks.op())};
  require_same_options(a.table, mine.size(), ctx.size(), n_options, option_names, checks.op());
  return a;
}

}  // namespace overlap::detail
