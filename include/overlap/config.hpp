#pragma once
/// @file
/// Run-time configuration of a context, and the one registry of the OVERLAP_*
/// environment variables that can set it (settings(): name, default, range,
/// meaning), from which parsing, validation and the help text derive.

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "overlap/backend/gemm.hpp"

namespace overlap {

/// How outstanding ring transfers are progressed while the cores compute.
/// Open MPI moves data only inside MPI calls, so without a policy a transfer
/// posted before a GEMM mostly happens after it.
enum class progress_policy {
  thread,  ///< a helper thread tests the requests, then sleeps (or yields) (needs MPI_THREAD_MULTIPLE)
  poll,    ///< each ring GEMM runs in poll_chunks row bands, testing the requests between bands
  none,    ///< no help: the MPI library progresses on its own (or not at all)
};

[[nodiscard]] inline const char* to_string(progress_policy p) {
  switch (p) {
    case progress_policy::thread: return "thread";
    case progress_policy::poll: return "poll";
    case progress_policy::none: return "none";
  }
  return "?";
}

/// What a rank does when an op fails after the ranks agreed to run it (an MPI
/// or backend error inside a ring or a collective, or the watchdog firing):
/// its peers may already wait for it, so the failure is fatal to the context.
enum class fatal_policy {
  /// print the failure (op, plan, step, rank, peer) to stderr and call
  /// MPI_Abort on the context's communicator: the whole job ends, nothing hangs
  abort,
  /// print it, mark the context failed and throw overlap::error on this rank;
  /// peers learn of it through their own watchdog (set OVERLAP_TIMEOUT_S).
  /// Every later op on the context throws at once; MPI may still use the
  /// failed call's buffers, so end the job after handling the error.
  throw_error,
};

[[nodiscard]] inline const char* to_string(fatal_policy f) { return f == fatal_policy::abort ? "abort" : "throw"; }

/// How bfloat16 products are computed.
enum class bf16_gemm {
  automatic,  ///< native where the CPU and oneDNN have a bf16 matmul, else widened
  native,     ///< oneDNN's bf16 matmul; std::invalid_argument where this CPU has none
  /// each piece widened to f32 in kernel-owned buffers, multiplied in f32 and
  /// rounded to bf16 once; transfers stay bf16 (for CPUs below AVX-512)
  widened,
};

[[nodiscard]] inline const char* to_string(bf16_gemm g) {
  switch (g) {
    case bf16_gemm::automatic: return "automatic";
    case bf16_gemm::native: return "native";
    case bf16_gemm::widened: return "widened";
  }
  return "?";
}

/// Which halves of a schedule run. Anything but `both` gives wrong results:
/// it exists so benchmarks can time a ring schedule's GEMMs alone and its
/// transfers alone (the two sides of the limit max(compute, comm)), and the
/// bulk strategy's one GEMM alone and its one collective alone.
enum class ring_phases { both, compute_only, comm_only };

/// Settings of a context. Every field that changes the communication schedule
/// (chunk counts) must agree across ranks; a disagreement is detected and
/// reported as std::invalid_argument on every rank. Ranges are in settings().
struct config {
  /// GEMM library; automatic picks oneDNN for float and Eigen for double.
  overlap::backend_kind backend = overlap::backend_kind::automatic;
  /// Progress policy of the ring engine.
  overlap::progress_policy progress = overlap::progress_policy::thread;
  /// Sleep of the progress thread between two MPI_Testall calls; zero makes it
  /// yield instead (a busy thread: only sensible with a spare core).
  std::chrono::microseconds progress_interval{100};
  /// progress_policy::poll: row bands each ring GEMM is split into (>= 1);
  /// the requests are tested between two bands. Fewer where a band would be
  /// thinner than the GEMM path's rate knee (below AVX-512, about 300 rows
  /// for oneDNN; see docs/design.md).
  int poll_chunks = 4;
  /// Chunks each all-gathered shard is split into (ring steps per shard), >= 1;
  /// 0: the plan chooses (see docs/design.md).
  int ag_chunks = 0;
  /// Chunks each reduce-scattered output shard is split into, >= 2: the
  /// accumulator of one chunk travels while the next chunk is computed;
  /// 0: the plan chooses.
  int rs_chunks = 0;
  /// How bfloat16 products are computed (see bf16_gemm).
  overlap::bf16_gemm bf16 = overlap::bf16_gemm::automatic;
  /// Watchdog: a wait for a transfer or a collective of an op that lasts
  /// longer than this many seconds is reported (op, plan, step, lane, peer,
  /// bytes) and handled by on_fatal. 0: off (waits are unbounded).
  int timeout_s = 0;
  /// What a rank does on a failure after the ranks agreed to run an op.
  overlap::fatal_policy on_fatal = overlap::fatal_policy::abort;
  /// Plans kept per context (least recently used evicted first), >= 1.
  int plan_cache = 32;
  /// Benchmarks only; see ring_phases.
  overlap::ring_phases phases = overlap::ring_phases::both;
  /// 1: rank 0 prints the configuration when a context is created and every
  /// plan when it is built (to stderr), in the spirit of ONEDNN_VERBOSE;
  /// 2: also one line per ring step of every call (time waiting for its
  /// transfers, time computing, transfers in flight while it computed).
  int verbose = 0;
  /// A calibration file for the cost model (overlap-calibrate writes one),
  /// read by rank 0 when the context is created and shared with the others.
  /// Empty: a context spanning nodes measures one on the first call that
  /// asks for strategy::automatic; on one node, automatic is bulk without a
  /// model unless a file is given (docs/design.md, "Choosing a schedule").
  std::string calibration;

  /// The defaults above, overridden by the environment variables listed in
  /// settings(). Throws std::invalid_argument on a malformed or out-of-range
  /// value, naming the variable and its range.
  [[nodiscard]] static config from_env();
};

/// One OVERLAP_* variable: its name, default and range as text, and meaning.
struct setting {
  const char* name;
  const char* values;  ///< what it takes: a range or the names of an enum's values
  const char* fallback;
  const char* meaning;
};

/// The registry of every OVERLAP_* variable (docs/cluster.md shows the same table).
[[nodiscard]] inline const setting* settings(size_t* count) {
  static const setting table[] = {
      {"OVERLAP_BACKEND", "automatic|onednn|eigen", "automatic", "GEMM library (automatic: oneDNN for f32/bf16, Eigen for f64)"},
      {"OVERLAP_PROGRESS", "thread|poll|none", "thread", "progress policy of the ring engine"},
      {"OVERLAP_PROGRESS_INTERVAL_US", "0..1000000", "100", "progress thread sleep between tests; 0 = yield"},
      {"OVERLAP_POLL_CHUNKS", "1..1024", "4", "poll policy: GEMM row bands per ring step (fewer below the GEMM rate knee)"},
      {"OVERLAP_AG_CHUNKS", "0..1024", "0", "ring steps per all-gathered shard (0: the plan chooses)"},
      {"OVERLAP_RS_CHUNKS", "0|2..1024", "0", "ring steps per reduce-scattered shard (0: the plan chooses)"},
      {"OVERLAP_BF16_GEMM", "automatic|native|widened", "automatic",
       "bf16 products: oneDNN's bf16 matmul, or f32 on widened pieces (CPUs without AVX-512)"},
      {"OVERLAP_TIMEOUT_S", "0..604800", "0", "watchdog: seconds a wait may last before it is fatal (0: off)"},
      {"OVERLAP_ON_FATAL", "abort|throw", "abort", "a failure after the ranks agreed: MPI_Abort, or throw on this rank"},
      {"OVERLAP_PLAN_CACHE", "1..65536", "32", "plans kept per context, least recently used evicted"},
      {"OVERLAP_VERBOSE", "0..2", "0", "1: rank 0 prints the configuration and each plan; 2: also every ring step"},
      {"OVERLAP_CALIBRATION", "path", "", "cost model calibration file (overlap-calibrate); empty: measured when needed"},
  };
  *count = sizeof table / sizeof table[0];
  return table;
}

/// One line per OVERLAP_* variable: name=values, (default), meaning.
[[nodiscard]] inline std::string env_help() {
  size_t n = 0;
  const setting* s = settings(&n);
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    std::string head = std::string(s[i].name) + "=" + s[i].values;
    if (head.size() < 44) head.resize(44, ' ');
    out += head + " (" + s[i].fallback + ") " + s[i].meaning + "\n";
  }
  return out;
}

namespace detail {
inline const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}
[[noreturn]] inline void bad_setting(const char* name, const std::string& value, const std::string& rule) {
  throw std::invalid_argument(std::string("overlap: ") + name + "='" + value + "' " + rule);
}
/// An integer setting in [min, max]; rejects junk, overflow and out-of-range values.
inline long long env_int(const char* name, long long fallback, long long min, long long max) {
  const char* v = env(name);
  if (v == nullptr) return fallback;
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(v, &end, 10);
  if (end == v || *end != '\0' || errno == ERANGE || x < min || x > max)
    bad_setting(name, v, "must be an integer from " + std::to_string(min) + " to " + std::to_string(max));
  return x;
}
/// An enum setting: the value whose to_string() is the variable's text.
template <class E, size_t N>
E env_enum(const char* name, E fallback, const E (&values)[N]) {
  const char* v = env(name);
  if (v == nullptr) return fallback;
  std::string allowed;
  for (E e : values) {
    const char* n = to_string(e);
    if (std::string(v) == n) return e;
    allowed += (allowed.empty() ? "" : ", ") + std::string(n);
  }
  bad_setting(name, v, "must be one of " + allowed);
}

/// The first rule a config breaks, or "" (ranges as in settings()).
[[nodiscard]] inline std::string config_problem(const config& c) {
  auto out_of = [](const char* field, long long v, long long lo, long long hi) {
    return v < lo || v > hi ? std::string("config.") + field + " (" + std::to_string(v) + ") must be from " +
                                  std::to_string(lo) + " to " + std::to_string(hi)
                            : std::string();
  };
  const auto e = [](auto v, int hi) { return static_cast<int>(v) < 0 || static_cast<int>(v) > hi; };
  if (e(c.backend, 2)) return "config.backend has an invalid value";
  if (e(c.progress, 2)) return "config.progress has an invalid value";
  if (e(c.bf16, 2)) return "config.bf16 has an invalid value";
  if (e(c.on_fatal, 1)) return "config.on_fatal has an invalid value";
  if (e(c.phases, 2)) return "config.phases has an invalid value";
  for (const std::string& p :
       {out_of("progress_interval (us)", c.progress_interval.count(), 0, 1000000),
        out_of("poll_chunks", c.poll_chunks, 1, 1024), out_of("ag_chunks", c.ag_chunks, 0, 1024),
        out_of("rs_chunks", c.rs_chunks, 0, 1024), out_of("timeout_s", c.timeout_s, 0, 604800),
        out_of("plan_cache", c.plan_cache, 1, 65536), out_of("verbose", c.verbose, 0, 2)})
    if (!p.empty()) return p;
  if (c.rs_chunks == 1) return "config.rs_chunks must be 0 (the plan chooses) or >= 2";
  return {};
}
}  // namespace detail

inline config config::from_env() {
  config c;
  c.backend = detail::env_enum("OVERLAP_BACKEND", c.backend,
                               {backend_kind::automatic, backend_kind::onednn, backend_kind::eigen});
  c.progress = detail::env_enum("OVERLAP_PROGRESS", c.progress,
                                {progress_policy::thread, progress_policy::poll, progress_policy::none});
  c.progress_interval = std::chrono::microseconds(
      detail::env_int("OVERLAP_PROGRESS_INTERVAL_US", c.progress_interval.count(), 0, 1000000));
  c.poll_chunks = static_cast<int>(detail::env_int("OVERLAP_POLL_CHUNKS", c.poll_chunks, 1, 1024));
  c.ag_chunks = static_cast<int>(detail::env_int("OVERLAP_AG_CHUNKS", c.ag_chunks, 0, 1024));
  c.rs_chunks = static_cast<int>(detail::env_int("OVERLAP_RS_CHUNKS", c.rs_chunks, 0, 1024));
  if (c.rs_chunks == 1) detail::bad_setting("OVERLAP_RS_CHUNKS", "1", "must be 0 (the plan chooses) or from 2 to 1024");
  c.bf16 = detail::env_enum("OVERLAP_BF16_GEMM", c.bf16, {bf16_gemm::automatic, bf16_gemm::native, bf16_gemm::widened});
  c.timeout_s = static_cast<int>(detail::env_int("OVERLAP_TIMEOUT_S", c.timeout_s, 0, 604800));
  c.on_fatal = detail::env_enum("OVERLAP_ON_FATAL", c.on_fatal, {fatal_policy::abort, fatal_policy::throw_error});
  c.plan_cache = static_cast<int>(detail::env_int("OVERLAP_PLAN_CACHE", c.plan_cache, 1, 65536));
  c.verbose = static_cast<int>(detail::env_int("OVERLAP_VERBOSE", 0, 0, 2));
  if (const char* path = detail::env("OVERLAP_CALIBRATION")) c.calibration = path;
  return c;
}

/// The progress policy with its setting, e.g. "thread (sleeps 100 us)".
[[nodiscard]] inline std::string describe_progress(const config& c) {
  switch (c.progress) {
    case progress_policy::thread:
      return c.progress_interval.count() > 0 ? "thread (sleeps " + std::to_string(c.progress_interval.count()) + " us)"
                                             : std::string("thread (yields)");
    case progress_policy::poll: return "poll (" + std::to_string(c.poll_chunks) + " GEMM bands per piece)";
    case progress_policy::none: return "none";
  }
  return "?";
}

/// The configuration as the OVERLAP_* variables that would produce it.
[[nodiscard]] inline std::string describe(const config& c) {
  return std::string("OVERLAP_BACKEND=") + to_string(c.backend) + " OVERLAP_PROGRESS=" + to_string(c.progress) +
         " OVERLAP_PROGRESS_INTERVAL_US=" + std::to_string(c.progress_interval.count()) +
         " OVERLAP_POLL_CHUNKS=" + std::to_string(c.poll_chunks) +
         " OVERLAP_AG_CHUNKS=" + std::to_string(c.ag_chunks) + " OVERLAP_RS_CHUNKS=" + std::to_string(c.rs_chunks) +
         " OVERLAP_BF16_GEMM=" + to_string(c.bf16) + " OVERLAP_TIMEOUT_S=" + std::to_string(c.timeout_s) +
         " OVERLAP_ON_FATAL=" + to_string(c.on_fatal) + " OVERLAP_PLAN_CACHE=" + std::to_string(c.plan_cache) +
         (c.calibration.empty() ? "" : " OVERLAP_CALIBRATION=" + c.calibration) +
         (c.phases == ring_phases::both ? "" : c.phases == ring_phases::compute_only ? " phases=compute_only"
                                                                                      : " phases=comm_only");
}

}  // namespace overlap
