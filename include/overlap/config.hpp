#pragma once
/// @file
/// Run-time configuration of a context, and the one table of its settings
/// (settings(): variable, field, default, range, meaning), from which reading
/// the OVERLAP_* environment, validation, the help text and the verbose
/// description all derive.

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "overlap/core/enum_names.hpp"
#include "overlap/mpi/simulator.hpp"

namespace overlap {

/// Which GEMM library computes the products.
enum class backend_kind {
  automatic,  ///< oneDNN for float and bfloat16, Eigen for double
  onednn,     ///< oneDNN matmul primitives (float, bfloat16)
  eigen,      ///< Eigen products (float, double)
};

/// The names of backend_kind's values, as the environment, messages and JSON spell them.
template <>
struct enum_names<backend_kind> {
  /// Every value with its name.
  static constexpr std::array<enum_entry<backend_kind>, 3> entries{
      {{backend_kind::automatic, "automatic"}, {backend_kind::onednn, "onednn"}, {backend_kind::eigen, "eigen"}}};
};

/// How outstanding ring transfers are progressed while the cores compute.
/// Open MPI moves data only inside MPI calls, so without a policy a transfer
/// posted before a GEMM mostly happens after it.
enum class progress_policy {
  /// thread where MPI provides MPI_THREAD_MULTIPLE and the node has a hardware
  /// thread to spare beyond its ranks' compute threads, else poll (none under
  /// SimGrid SMPI); chosen by the context's constructor, per rank
  /// (engine::choose_progress; OVERLAP_VERBOSE says which and why)
  automatic,
  thread,  ///< a helper thread tests the requests, then sleeps (or yields) (needs MPI_THREAD_MULTIPLE)
  poll,    ///< each ring GEMM runs in poll_chunks row bands, testing the requests between bands
  none,    ///< no help: the MPI library progresses on its own (or not at all)
};

/// The names of progress_policy's values, as the environment, messages and JSON spell them.
template <>
struct enum_names<progress_policy> {
  /// Every value with its name.
  static constexpr std::array<enum_entry<progress_policy>, 4> entries{{{progress_policy::automatic, "automatic"},
                                                                       {progress_policy::thread, "thread"},
                                                                       {progress_policy::poll, "poll"},
                                                                       {progress_policy::none, "none"}}};
};

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

/// The names of fatal_policy's values, as the environment, messages and JSON spell them.
template <>
struct enum_names<fatal_policy> {
  /// Every value with its name.
  static constexpr std::array<enum_entry<fatal_policy>, 2> entries{
      {{fatal_policy::abort, "abort"}, {fatal_policy::throw_error, "throw"}}};
};

/// How bfloat16 products are computed.
enum class bf16_gemm {
  automatic,  ///< native where the CPU and oneDNN have a bf16 matmul, else widened
  native,     ///< oneDNN's bf16 matmul; std::invalid_argument where this CPU has none
  /// each piece widened to f32 in kernel-owned buffers, multiplied in f32 and
  /// rounded to bf16 once; transfers stay bf16 (for CPUs below AVX-512)
  widened,
};

/// The names of bf16_gemm's values, as the environment, messages and JSON spell them.
template <>
struct enum_names<bf16_gemm> {
  /// Every value with its name.
  static constexpr std::array<enum_entry<bf16_gemm>, 3> entries{
      {{bf16_gemm::automatic, "automatic"}, {bf16_gemm::native, "native"}, {bf16_gemm::widened, "widened"}}};
};

/// Which halves of a schedule run. Anything but `both` gives wrong results:
/// it exists so benchmarks can time a ring schedule's GEMMs alone and its
/// transfers alone (the two sides of the limit max(compute, comm)), and the
/// bulk strategy's one GEMM alone and its one collective alone.
enum class ring_phases { both, compute_only, comm_only };

/// The names of ring_phases's values, as the environment, messages and JSON spell them.
template <>
struct enum_names<ring_phases> {
  /// Every value with its name.
  static constexpr std::array<enum_entry<ring_phases>, 3> entries{{{ring_phases::both, "both"},
                                                                   {ring_phases::compute_only, "compute_only"},
                                                                   {ring_phases::comm_only, "comm_only"}}};
};

/// How strategy::automatic chooses a call's schedule where it asks the cost
/// model (docs/design.md, "Choosing a schedule").
enum class automatic_choice {
  /// the model ranks the candidates; the first calls of each shape run its
  /// best ones (at most three, bulk always among them), timed on every rank,
  /// and later calls run the fastest on the slowest rank (schedule/measured.hpp)
  measured,
  /// the model's choice runs from the first call (nothing is timed)
  model,
};

/// The names of automatic_choice's values, as the environment, messages and JSON spell them.
template <>
struct enum_names<automatic_choice> {
  /// Every value with its name.
  static constexpr std::array<enum_entry<automatic_choice>, 2> entries{
      {{automatic_choice::measured, "measured"}, {automatic_choice::model, "model"}}};
};

/// Whether a ring lane sends its pieces one at a time (the next posted when
/// the previous completes) where several could be in flight on one link.
enum class paced_sends {
  /// paced where a lane's sends could share its link (pieces sent on before
  /// the previous ones completed) and a piece is large enough (256 KiB) that
  /// a message's latency is small beside its transfer
  automatic,
  on,   ///< paced wherever several could be in flight
  off,  ///< every send posted in its step
};

/// The names of paced_sends's values, as the environment, messages and JSON spell them.
template <>
struct enum_names<paced_sends> {
  /// Every value with its name.
  static constexpr std::array<enum_entry<paced_sends>, 3> entries{
      {{paced_sends::automatic, "automatic"}, {paced_sends::on, "on"}, {paced_sends::off, "off"}}};
};

/// Under SimGrid SMPI (mpi::simulated): how the simulated time of a GEMM is
/// found. SMPI times every burst of computation on the real CPU, so its
/// times carry the noise of the machine running the simulation; `steady`
/// and `skipped` charge each GEMM shape one stable figure instead. Ignored
/// on a real MPI.
enum class sim_compute {
  /// SMPI's own timing of every GEMM (each call's real time)
  measured,
  /// every GEMM runs (results are correct); each one is charged the median
  /// of the first sim_samples real runs of its kernel and shape in the
  /// simulation, whichever rank took them (taken back to back on the first
  /// call where the GEMM overwrites its output)
  steady,
  /// as steady, but after those runs the GEMM is not computed at all: times
  /// only, the results are wrong (runs at scale that only time). From the
  /// first such context on, the rank's workspaces are also shared by every
  /// simulated rank (mpi::shared_workspaces), so memory and copies do not
  /// grow with the ranks
  skipped,
  /// no GEMM is computed or timed: each is charged its flops over the rate
  /// the calibration (config::calibration, required) gives its shape, the
  /// figure the cost model reads. Times only, as skipped, with the
  /// workspaces shared; it checks the model's schedules and network apart
  /// from the accuracy of its GEMM rate grid, and runs at scale without a
  /// real GEMM
  calibrated,
};

/// The names of sim_compute's values, as the environment, messages and JSON spell them.
template <>
struct enum_names<sim_compute> {
  /// Every value with its name.
  static constexpr std::array<enum_entry<sim_compute>, 4> entries{{{sim_compute::measured, "measured"},
                                                                   {sim_compute::steady, "steady"},
                                                                   {sim_compute::skipped, "skipped"},
                                                                   {sim_compute::calibrated, "calibrated"}}};
};

/// The order of the ranks on a context's ring (the ops' neighbours).
enum class ring_order {
  /// the ranks of one node are neighbours (MPI_COMM_TYPE_SHARED): a ring
  /// spanning nodes crosses each node boundary once per direction, whatever
  /// the placement; rank order where every node's ranks are consecutive
  node,
  /// rank order of the context's communicator, wherever the ranks sit
  rank,
};

/// The names of ring_order's values, as the environment, messages and JSON spell them.
template <>
struct enum_names<ring_order> {
  /// Every value with its name.
  static constexpr std::array<enum_entry<ring_order>, 2> entries{
      {{ring_order::node, "node"}, {ring_order::rank, "rank"}}};
};

/// Settings of a context. Every field that changes the communication schedule
/// (chunk counts, the ring order) must agree across ranks; a disagreement is detected and
/// reported as std::invalid_argument on every rank. Ranges are in settings().
struct config {
  /// GEMM library; automatic picks oneDNN for float and Eigen for double.
  overlap::backend_kind backend = overlap::backend_kind::automatic;
  /// Progress policy of the ring engine; automatic chooses from the node when
  /// the context is created (context::config() then holds the choice). Under
  /// SimGrid SMPI a rank's second thread must not call MPI (thread is refused).
  /// Need not agree across ranks.
  overlap::progress_policy progress = overlap::progress_policy::automatic;
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
  /// matmul_all_reduce's ring strategies: the groups C is split into, each
  /// reduce-scattered on a ring (rs_chunks pieces per shard) and then
  /// all-gathered while the next group's ring runs; 0: the plan chooses.
  int ar_groups = 0;
  /// The order of the ranks on the ring (see overlap::ring_order).
  overlap::ring_order ring = overlap::ring_order::node;
  /// How bfloat16 products are computed (see bf16_gemm).
  overlap::bf16_gemm bf16 = overlap::bf16_gemm::automatic;
  /// Watchdog: a wait for a transfer or a collective of an op that lasts
  /// longer than this many seconds is reported (op, plan, step, lane, peer,
  /// bytes) and handled by on_fatal. 0: off (waits are unbounded).
  int timeout_s = 0;
  /// What a rank does on a failure after the ranks agreed to run an op.
  overlap::fatal_policy on_fatal = overlap::fatal_policy::abort;
  /// Plans kept per context (least recently used evicted first), >= 1.
  /// Rank 0 warns once when as many plans were built again after their
  /// eviction (context::plans_rebuilt): raise it then.
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
  /// How strategy::automatic chooses where it asks the model: by timing the
  /// model's best candidates on a shape's first calls, or by the model
  /// alone. Must agree across ranks (it is part of every op's agreed options).
  overlap::automatic_choice automatic = overlap::automatic_choice::measured;
  /// automatic_choice::measured: every this many calls of a shape its
  /// candidates are timed again (0: only when a sampled call's time drifts
  /// 25% off the settled one). Must agree across ranks.
  int automatic_recheck = 1000;
  /// Ring sends one piece at a time per lane (see overlap::paced_sends).
  /// Need not agree across ranks (a lane's messages keep their order).
  overlap::paced_sends paced = overlap::paced_sends::automatic;
  /// A directory: every rank writes its timeline there (rank\<world
  /// rank\>.json, the Chrome trace format; see engine/trace.hpp and
  /// tools/trace/render.py). Empty: off, and nothing is recorded.
  std::string trace;
  /// SimGrid SMPI only: how a GEMM's simulated time is found (sim_compute).
  overlap::sim_compute sim = overlap::sim_compute::steady;
  /// SimGrid SMPI only: real runs of each GEMM shape whose median is charged
  /// under sim_compute::steady and skipped.
  int sim_samples = 5;

  /// What from_env() could not read, one line per variable ("" when every
  /// variable was read): the variable, its text and the range it breaks. A
  /// context refuses a config with problems on every rank (its constructor
  /// is collective), so a variable malformed on one rank cannot leave the
  /// others waiting.
  std::string problems;

  /// The defaults above, overridden by the environment variables listed in
  /// settings(). Local and never throws: a malformed or out-of-range value
  /// leaves its field at the default and is recorded in problems.
  [[nodiscard]] static config from_env() { return from_env(config{}); }
  /// base, overridden by the environment variables that are set: how a
  /// program that builds its own config lets a job's OVERLAP_* variables
  /// (the watchdog's OVERLAP_TIMEOUT_S, OVERLAP_VERBOSE) reach it. Problems
  /// are recorded as above.
  [[nodiscard]] static config from_env(config base);
};

namespace detail {
inline const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

/// A config field as a whole number (settings are ints, enums or microseconds).
template <class F>
long long as_number(const F& v) {
  if constexpr (std::is_enum_v<F>)
    return static_cast<long long>(v);
  else if constexpr (std::is_same_v<F, std::chrono::microseconds>)
    return v.count();
  else
    return v;
}
template <class F>
F from_number(long long x) {
  if constexpr (std::is_same_v<F, std::chrono::microseconds>)
    return std::chrono::microseconds(x);
  else
    return static_cast<F>(x);
}

/// The typed part of a setting: its field of config and how it is read,
/// checked and printed. Integers lie in [lo, hi] without `gap` (0: none);
/// enums are one of enum_names; a path is any text.
template <auto Field>
struct field_rules {
  using value_type = std::remove_reference_t<decltype(config{}.*Field)>;
  static constexpr bool is_enum = std::is_enum_v<value_type>;
  static constexpr bool is_text = std::is_same_v<value_type, std::string>;

  static std::string text(const config& c) {
    if constexpr (is_enum)
      return to_string(c.*Field);
    else if constexpr (is_text)
      return c.*Field;
    else
      return std::to_string(as_number(c.*Field));
  }
  /// "" when the field's value is allowed, else why not.
  static std::string problem(const config& c, long long lo, long long hi, long long gap) {
    if constexpr (is_enum) {
      return is_valid(c.*Field) ? std::string() : "has an invalid value " + std::to_string(as_number(c.*Field));
    } else if constexpr (is_text) {
      return {};
    } else {
      const long long v = as_number(c.*Field);
      if (v >= lo && v <= hi && !(gap != 0 && v == gap)) return {};
      return "(" + std::to_string(v) + ") must be " + range_text(lo, hi, gap);
    }
  }
  /// Sets the field from the variable's text; "" or why the text is refused.
  static std::string parse(config& c, const char* v, long long lo, long long hi, long long gap) {
    if constexpr (is_enum) {
      return parse_enum(v, c.*Field) ? std::string() : "must be one of " + enum_choices<value_type>(", ");
    } else if constexpr (is_text) {
      c.*Field = v;
      return {};
    } else {
      errno = 0;
      char* end = nullptr;
      const long long x = std::strtoll(v, &end, 10);
      if (end == v || *end != '\0' || errno == ERANGE) return "must be an integer " + range_text(lo, hi, gap);
      if (x < lo || x > hi || (gap != 0 && x == gap)) return "must be " + range_text(lo, hi, gap);
      c.*Field = from_number<value_type>(x);
      return {};
    }
  }
  static std::string range_text(long long lo, long long hi, long long gap) {
    if (gap == 0) return "from " + std::to_string(lo) + " to " + std::to_string(hi);
    return std::to_string(lo) + " or from " + std::to_string(gap + 1) + " to " + std::to_string(hi);
  }
};
}  // namespace detail

/// One setting of a context: the OVERLAP_* variable that sets it (null:
/// none, the field is set in code only), the config field, its range and
/// meaning. Its default is the field's value in config{}.
struct setting {
  const char* variable;  ///< the OVERLAP_* variable, or nullptr when only code sets it
  const char* field;     ///< the config field's name
  const char* meaning;   ///< one line for the settings table and env_help()
  ///@{
  /// Integers: allowed from lo to hi, except gap (0: no gap).
  long long lo = 0, hi = 0, gap = 0;
  ///@}
  std::string (*values)(const setting&);                                   ///< what allowed() returns
  std::string (*text)(const config&);                                      ///< a config's value of the field, as text
  std::string (*problem)(const config&, long long, long long, long long);  ///< what check() returns
  std::string (*parse)(config&, const char*, long long, long long, long long);  ///< what read() does

  /// What the variable takes: "0..1024", "0|2..1024", "thread|poll|none" or "path".
  [[nodiscard]] std::string allowed() const { return values(*this); }
  /// The default, as text (the field's value in config{}).
  [[nodiscard]] std::string fallback() const { return text(config{}); }
  /// "" when c's field is allowed, else the rule it breaks.
  [[nodiscard]] std::string check(const config& c) const { return problem(c, lo, hi, gap); }
  /// Sets c's field from the variable's text; "" or why the text is refused.
  [[nodiscard]] std::string read(config& c, const char* value) const { return parse(c, value, lo, hi, gap); }
};

namespace detail {
template <auto Field>
setting make_setting(const char* variable, const char* field, const char* meaning, long long lo = 0, long long hi = 0,
                     long long gap = 0) {
  using rules = field_rules<Field>;
  auto values = [](const setting& s) -> std::string {
    if constexpr (rules::is_enum)
      return enum_choices<typename rules::value_type>();
    else if constexpr (rules::is_text)
      return "path";
    else if (s.gap != 0)
      return std::to_string(s.lo) + "|" + std::to_string(s.gap + 1) + ".." + std::to_string(s.hi);
    else
      return std::to_string(s.lo) + ".." + std::to_string(s.hi);
  };
  return {variable, field, meaning, lo, hi, gap, values, &rules::text, &rules::problem, &rules::parse};
}

/// The settings of how a call's schedule is cut and chosen (part of settings()).
[[nodiscard]] inline std::vector<setting> schedule_settings() {
  return {
      make_setting<&config::ag_chunks>("OVERLAP_AG_CHUNKS", "ag_chunks",
                                       "ring steps per all-gathered shard (0: the plan chooses)", 0, 1024),
      make_setting<&config::rs_chunks>("OVERLAP_RS_CHUNKS", "rs_chunks",
                                       "ring steps per reduce-scattered shard (0: the plan chooses)", 0, 1024, 1),
      make_setting<&config::ar_groups>("OVERLAP_AR_GROUPS", "ar_groups",
                                       "matmul_all_reduce: groups of C, each reduced on a ring and gathered during the "
                                       "next (0: the plan chooses)",
                                       0, 1024),
      make_setting<&config::paced>("OVERLAP_PACED_SENDS", "paced",
                                   "ring sends one piece at a time per lane where several could share a link "
                                   "(automatic: pieces of 256 KiB or more)"),
      make_setting<&config::ring>("OVERLAP_RING_ORDER", "ring",
                                  "ring neighbours: the ranks of one node together, or plain rank order"),
      make_setting<&config::automatic>("OVERLAP_AUTOMATIC", "automatic",
                                       "strategy automatic: time the cost model's best candidates on a shape's "
                                       "first calls and keep the fastest, or take the model's choice untimed"),
      make_setting<&config::automatic_recheck>("OVERLAP_AUTOMATIC_RECHECK", "automatic_recheck",
                                               "automatic measured: calls of a shape between two timings of its "
                                               "candidates (0: only on drift)",
                                               0, 1000000000),
  };
}
}  // namespace detail

/// The table of every setting (docs/cluster.md shows the same table).
[[nodiscard]] inline const std::vector<setting>& settings() {
  using detail::make_setting;
  static const std::vector<setting> table = [] {
    std::vector<setting> t{
        make_setting<&config::backend>("OVERLAP_BACKEND", "backend",
                                       "GEMM library (automatic: oneDNN for f32/bf16, Eigen for f64)"),
        make_setting<&config::progress>("OVERLAP_PROGRESS", "progress", "progress policy of the ring engine"),
        make_setting<&config::progress_interval>("OVERLAP_PROGRESS_INTERVAL_US", "progress_interval (us)",
                                                 "progress thread sleep between tests; 0 = yield", 0, 1000000),
        make_setting<&config::poll_chunks>("OVERLAP_POLL_CHUNKS", "poll_chunks",
                                           "poll policy: GEMM row bands per ring step (fewer below the GEMM rate knee)",
                                           1, 1024),
        make_setting<&config::bf16>("OVERLAP_BF16_GEMM", "bf16",
                                    "bf16 products: oneDNN's bf16 matmul, or f32 on widened pieces (CPUs without "
                                    "AVX-512)"),
        make_setting<&config::timeout_s>("OVERLAP_TIMEOUT_S", "timeout_s",
                                         "watchdog: seconds a wait may last before it is fatal (0: off)", 0, 604800),
        make_setting<&config::on_fatal>("OVERLAP_ON_FATAL", "on_fatal",
                                        "a failure after the ranks agreed: MPI_Abort, or throw on this rank"),
        make_setting<&config::plan_cache>("OVERLAP_PLAN_CACHE", "plan_cache",
                                          "plans kept per context, least recently used evicted", 1, 65536),
        make_setting<&config::verbose>("OVERLAP_VERBOSE", "verbose",
                                       "1: rank 0 prints the configuration and each plan; 2: also every ring step", 0,
                                       2),
        make_setting<&config::calibration>("OVERLAP_CALIBRATION", "calibration",
                                           "cost model calibration file (overlap-calibrate); empty: measured when "
                                           "needed"),
        make_setting<&config::trace>("OVERLAP_TRACE", "trace",
                                     "directory of a Chrome trace per rank (rank<R>.json); empty: off"),
        make_setting<&config::sim>(
            "OVERLAP_SIM_COMPUTE", "sim",
            "SimGrid SMPI only: a GEMM's simulated time (SMPI's timing of each call, or the "
            "median of its shape's first runs; skipped: not computed after those; calibrated: flops over the "
            "calibration's rate, never run)"),
        make_setting<&config::sim_samples>("OVERLAP_SIM_SAMPLES", "sim_samples",
                                           "SimGrid SMPI only: real runs per GEMM shape behind its steady time", 1,
                                           1000),
        make_setting<&config::phases>(nullptr, "phases", "benchmarks only: which halves of a schedule run"),
    };
    const std::vector<setting> schedule = detail::schedule_settings();
    t.insert(t.begin() + 4, schedule.begin(), schedule.end());  // after the engine's
    return t;
  }();
  return table;
}

/// One line per OVERLAP_* variable: name=values, (default), meaning.
[[nodiscard]] inline std::string env_help() {
  std::string out;
  for (const setting& s : settings()) {
    if (s.variable == nullptr) continue;
    std::string head = std::string(s.variable) + "=" + s.allowed();
    if (head.size() < 44) head.resize(44, ' ');
    out += head + " (" + s.fallback() + ") " + s.meaning + "\n";
  }
  return out;
}

namespace detail {
/// The first rule a config breaks, or "" (ranges as in settings()).
[[nodiscard]] inline std::string config_problem(const config& c) {
  if (!c.problems.empty()) return "overlap: " + c.problems;
  for (const setting& s : settings())
    if (std::string p = s.check(c); !p.empty()) return std::string("config.") + s.field + " " + p;
  if (mpi::simulated && c.progress == progress_policy::thread)
    return "config.progress is thread, but this program runs under SimGrid SMPI, where a rank's second thread must "
           "not call MPI; the simulator progresses transfers by itself: use automatic (the default: none there), none "
           "or poll";
  return {};
}
}  // namespace detail

inline config config::from_env(config base) {
  config c = std::move(base);
  for (const setting& s : settings()) {
    const char* v = s.variable == nullptr ? nullptr : detail::env(s.variable);
    if (v == nullptr) continue;
    if (std::string why = s.read(c, v); !why.empty())
      c.problems += std::string(c.problems.empty() ? "" : "; ") + s.variable + "='" + v + "' " + why;
  }
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
    case progress_policy::automatic: return "automatic";
  }
  return "?";
}

/// The configuration as the OVERLAP_* variables that would produce it (the
/// verbose banner); settings without a variable appear as field=value when
/// they differ from the default.
[[nodiscard]] inline std::string describe(const config& c) {
  std::string out;
  for (const setting& s : settings()) {
    const std::string v = s.text(c);
    if (s.variable == nullptr || (v.empty() && s.fallback().empty())) {
      if (v != s.fallback()) out += std::string(out.empty() ? "" : " ") + s.field + "=" + v;
      continue;
    }
    out += std::string(out.empty() ? "" : " ") + s.variable + "=" + v;
  }
  return out;
}

}  // namespace overlap
