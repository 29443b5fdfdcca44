#pragma once
/// @file
/// Run-time configuration of a context, and the one registry of the OVERLAP_*
/// environment variables that can set it.

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

/// Which halves of a ring schedule run. Anything but `both` gives wrong
/// results: it exists so benchmarks can time the same schedule's GEMMs alone
/// and transfers alone (the two sides of the limit max(compute, comm)).
enum class ring_phases { both, compute_only, comm_only };

/// Settings of a context. Every field that changes the communication schedule
/// (chunk counts) must agree across ranks; a disagreement is detected and
/// reported as std::invalid_argument on every rank.
struct config {
  /// GEMM library; automatic picks oneDNN for float and Eigen for double.
  overlap::backend_kind backend = overlap::backend_kind::automatic;
  /// Progress policy of the ring engine.
  overlap::progress_policy progress = overlap::progress_policy::thread;
  /// Sleep of the progress thread between two MPI_Testall calls; zero makes it
  /// yield instead (a busy thread: only sensible with a spare core).
  std::chrono::microseconds progress_interval{100};
  /// progress_policy::poll: row bands each ring GEMM is split into (>= 1);
  /// the requests are tested between two bands.
  int poll_chunks = 4;
  /// Chunks each all-gathered shard is split into (ring steps per shard), >= 1;
  /// 0: the plan chooses (see docs/design.md).
  int ag_chunks = 0;
  /// Chunks each reduce-scattered output shard is split into, >= 2: the
  /// accumulator of one chunk travels while the next chunk is computed;
  /// 0: the plan chooses.
  int rs_chunks = 0;
  /// Benchmarks only; see ring_phases.
  overlap::ring_phases phases = overlap::ring_phases::both;
  /// 1: rank 0 prints the configuration when a context is created and every
  /// plan when it is built (to stderr), in the spirit of ONEDNN_VERBOSE;
  /// 2: also one line per ring step of every call (time waiting for its
  /// transfers, time computing, transfers in flight while it computed).
  int verbose = 0;

  /// The defaults above, overridden by the environment variables listed in
  /// env_help(). Throws std::invalid_argument on a malformed value.
  [[nodiscard]] static config from_env();
};

/// One line per OVERLAP_* variable: name, default, meaning.
[[nodiscard]] inline std::string env_help() {
  return "OVERLAP_BACKEND=automatic|onednn|eigen   (automatic) GEMM library\n"
         "OVERLAP_PROGRESS=thread|poll|none        (thread) progress policy of the ring engine\n"
         "OVERLAP_PROGRESS_INTERVAL_US=N           (100) progress thread sleep between tests; 0 = yield\n"
         "OVERLAP_POLL_CHUNKS=N                    (4) poll policy: GEMM row bands per ring step (>= 1)\n"
         "OVERLAP_AG_CHUNKS=N                      (0 = plan chooses) ring steps per all-gathered shard\n"
         "OVERLAP_RS_CHUNKS=N                      (0 = plan chooses) ring steps per reduce-scattered shard (>= 2)\n"
         "OVERLAP_VERBOSE=0|1|2                    (0) rank 0 prints the configuration and each plan built;\n"
         "                                         2: also every ring step's wait and compute times\n";
}

namespace detail {
inline const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}
inline long env_int(const char* name, long fallback, long min) {
  const char* v = env(name);
  if (v == nullptr) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < min)
    throw std::invalid_argument(std::string("overlap: ") + name + "='" + v + "' must be an integer >= " +
                                std::to_string(min));
  return x;
}
}  // namespace detail

inline config config::from_env() {
  config c;
  if (const char* b = detail::env("OVERLAP_BACKEND")) {
    const std::string s(b);
    if (s == "automatic") c.backend = backend_kind::automatic;
    else if (s == "onednn") c.backend = backend_kind::onednn;
    else if (s == "eigen") c.backend = backend_kind::eigen;
    else throw std::invalid_argument("overlap: OVERLAP_BACKEND='" + s + "' must be automatic, onednn or eigen");
  }
  if (const char* p = detail::env("OVERLAP_PROGRESS")) {
    const std::string s(p);
    if (s == "thread") c.progress = progress_policy::thread;
    else if (s == "poll") c.progress = progress_policy::poll;
    else if (s == "none") c.progress = progress_policy::none;
    else throw std::invalid_argument("overlap: OVERLAP_PROGRESS='" + s + "' must be thread, poll or none");
  }
  c.progress_interval = std::chrono::microseconds(
      detail::env_int("OVERLAP_PROGRESS_INTERVAL_US", static_cast<long>(c.progress_interval.count()), 0));
  c.poll_chunks = static_cast<int>(detail::env_int("OVERLAP_POLL_CHUNKS", c.poll_chunks, 1));
  c.ag_chunks = static_cast<int>(detail::env_int("OVERLAP_AG_CHUNKS", c.ag_chunks, 0));
  c.rs_chunks = static_cast<int>(detail::env_int("OVERLAP_RS_CHUNKS", c.rs_chunks, 0));
  if (c.rs_chunks == 1) throw std::invalid_argument("overlap: OVERLAP_RS_CHUNKS='1' must be 0 (automatic) or >= 2");
  c.verbose = static_cast<int>(detail::env_int("OVERLAP_VERBOSE", 0, 0));
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
         (c.phases == ring_phases::both ? "" : c.phases == ring_phases::compute_only ? " phases=compute_only"
                                                                                      : " phases=comm_only");
}

}  // namespace overlap
