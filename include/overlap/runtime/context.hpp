#pragma once
/// @file
/// The context: one per communicator, owns everything the ops reuse.

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "overlap/backend/gemm.hpp"
#include "overlap/config.hpp"
#include "overlap/core/flavour.hpp"
#include "overlap/engine/progress.hpp"
#include "overlap/engine/worker.hpp"
#include "overlap/mpi/communicator.hpp"
#include "overlap/mpi/request.hpp"
#include "overlap/mpi/topology.hpp"
#include "overlap/mpi/wait.hpp"
#include "overlap/runtime/agreement.hpp"
#include "overlap/runtime/failure.hpp"
#include "overlap/runtime/plan_cache.hpp"
#include "overlap/schedule/calibration.hpp"
#include "overlap/schedule/measured.hpp"

namespace overlap {

class context;

namespace detail {
/// Tests only: puts the ranks of ctx on the ring in `order` (element k: the
/// rank at position k; the same on every rank) and drops the cached plans, so
/// the ops run on rings that placement alone does not make on one machine.
void set_ring_for_testing(context& ctx, std::vector<int> order);
/// Tests only: makes the hierarchical schedule see the ranks as nodes of
/// `slots` consecutive ranks each (size() % slots == 0; the same on every
/// rank) and drops the cached plans.
void set_nodes_for_testing(context& ctx, int slots);
}  // namespace detail

namespace engine {
class trace_recorder;  // engine/trace.hpp
}  // namespace engine

namespace backend {
class eigen_backend;   // backend/eigen.hpp
class onednn_backend;  // backend/onednn.hpp
class sim_timings;     // backend/simulated.hpp
}  // namespace backend

namespace detail {

/// Where a fatal error leaves what MPI may still use (requests given up on):
/// never freed, so a late transfer never lands in freed memory.
struct graveyard {
  std::vector<std::unique_ptr<plan_base>> plans;
  std::vector<std::unique_ptr<agreement_scratch>> scratch;
};
inline graveyard& leaked() {
  static auto* g = new graveyard;  // intentionally never destroyed
  return *g;
}
}  // namespace detail

/// Owns a duplicate of the user's communicator (ring traffic never mixes with
/// the caller's messages), the GEMM backends, the progress thread and the plan
/// cache. Constructing it is collective over comm (MPI_Comm_dup). Not
/// copyable; movable. Not thread-safe: one thread calls the ops of a context.
class context {
 public:
  /// Collective over comm, with the configuration from the OVERLAP_*
  /// environment variables (config::from_env()). Whatever fails on one rank
  /// only (a malformed variable, a missing thread level, no bf16 matmul when
  /// OVERLAP_BF16_GEMM=native) raises the same std::invalid_argument on every
  /// rank, naming the rank. comm must be an intra-communicator and MPI must be
  /// initialised (with MPI_THREAD_MULTIPLE for progress_policy::thread) and
  /// not finalised: otherwise std::invalid_argument / std::logic_error before
  /// any communication.
  explicit context(MPI_Comm comm) : context(comm, std::optional<overlap::config>{}) {}
  /// As above with an explicit configuration, used as given: the environment
  /// is not read (config::from_env(cfg) lays a job's OVERLAP_* variables
  /// over a program's own config). cfg.problems (a variable from_env could
  /// not read), an invalid field, or fields that change the schedule and
  /// disagree (see overlap::config) raise std::invalid_argument on every
  /// rank.
  context(MPI_Comm comm, overlap::config cfg) : context(comm, std::optional<overlap::config>{cfg}) {}

  /// Moves the handles; the moved-from context holds nothing and may only be destroyed. Local.
  context(context&&) noexcept;
  /// Releases this context's handles (as the destructor does), then moves. Local.
  context& operator=(context&&) noexcept;
  ~context();

  /// This rank in the context's communicator.
  [[nodiscard]] int rank() const noexcept { return rank_; }
  /// The number of ranks of the context's communicator.
  [[nodiscard]] int size() const noexcept { return size_; }
  /// The context's own communicator (a duplicate; do not free it).
  [[nodiscard]] MPI_Comm comm() const noexcept { return comm_.get(); }
  /// The configuration in use: as given, with progress_policy::automatic
  /// replaced by the policy chosen for this rank.
  [[nodiscard]] const overlap::config& config() const noexcept { return cfg_; }
  /// Why progress_policy::automatic chose config().progress on this rank, in
  /// words; empty when the config named a policy.
  [[nodiscard]] const std::string& progress_reason() const noexcept { return progress_why_; }
  /// Number of plans cached now (at most config().plan_cache).
  [[nodiscard]] size_t cached_plans() const noexcept { return plans_.size(); }
  /// A cached plan in words (plan_reports).
  struct plan_report {
    std::string summary;     ///< the op, element type, ranks, strategy and global shape
    std::string schedule;    ///< what runs; where the cost model chose, every candidate's predicted time
    bool automatic = false;  ///< the call asked for strategy::automatic: the library chose the schedule
  };
  /// The cached plans in words, most recently used first: for reports of
  /// what ran, e.g. which schedules strategy::automatic chose (ring
  /// attention's plans name their strategy: ring or bulk). Local.
  [[nodiscard]] std::vector<plan_report> plan_reports() const {
    std::vector<plan_report> out;
    plans_.for_each([&](const detail::plan_base& p) { out.push_back({p.summary, p.schedule_words, p.automatic}); });
    return out;
  }
  /// Number of cached shapes whose automatic schedule is still being
  /// measured (OVERLAP_AUTOMATIC=measured: their next calls may run other
  /// candidates). The same on every rank. Benchmarks warm up until it is 0.
  [[nodiscard]] size_t measuring() const {
    size_t n = 0;
    plans_.for_each([&](const detail::plan_base& p) { n += p.measuring() ? 1 : 0; });
    return n;
  }
  /// Writes the context's calibration, with every schedule automatic has
  /// measured so far (calibration::choices), to `path` on rank 0, for a
  /// later job's config::calibration (OVERLAP_CALIBRATION): its calls then
  /// start from these choices instead of measuring. Returns false where
  /// there is nothing to save (no model was needed). Call it on every rank
  /// (only rank 0 writes; no communication); std::runtime_error on rank 0
  /// when the file cannot be written.
  bool save_calibration(const std::string& path) const;
  /// Drops every cached plan (their buffers and primitives); the next call of
  /// each shape builds its plan again. Local: other ranks notice the missing
  /// plan at their next call and rebuild with this rank.
  void clear_plans() {
    if (busy()) throw std::logic_error("overlap::context::clear_plans: an op started on this context is in flight");
    drop_plans();
  }
  /// True when every rank of the communicator shares one node (MPI moves data
  /// through shared memory: copies done by the cores that also compute).
  [[nodiscard]] bool one_node() const noexcept { return nodes_ == 1; }
  /// Number of nodes (MPI_COMM_TYPE_SHARED domains) the ranks sit on.
  [[nodiscard]] int nodes() const noexcept { return nodes_; }
  /// The ring of the ops: element k is the rank at position k (the same on
  /// every rank). Under ring_order::node (the default) the ranks of a node
  /// are neighbours, so a ring over n nodes crosses each node boundary once
  /// per direction; C's blocks still follow rank order.
  [[nodiscard]] const std::vector<int>& ring() const noexcept { return ring_; }
  /// The rank `offset` positions after this rank on the ring (negative:
  /// before it); ring_at(1) is where lane 0 sends from, ring_at(-1) where it sends to.
  [[nodiscard]] int ring_at(int offset) const noexcept {
    return ring_[static_cast<size_t>(((ring_pos_ + offset) % size_ + size_) % size_)];
  }
  /// True when the ranks sit on two or more nodes of the same number (two or
  /// more) of ranks each: the hierarchical schedule's two levels exist.
  [[nodiscard]] bool two_levels() const noexcept { return node_slots_ >= 2 && size_ / node_slots_ >= 2; }
  /// Ranks per node when every node has as many (else 0).
  [[nodiscard]] int node_slots() const noexcept { return node_slots_; }
  /// The rank `nodes` nodes after this rank's node (in the order by node)
  /// and `locals` places after it inside that node; two_levels() only.
  [[nodiscard]] int node_peer(int nodes, int locals) const noexcept {
    const int s = node_slots_, n = size_ / node_slots_;
    const int a = by_node_pos_ / s, j = by_node_pos_ % s;
    const int pos = ((a + nodes) % n + n) % n * s + ((j + locals) % s + s) % s;
    return by_node_[static_cast<size_t>(pos)];
  }
  /// "rank r" in messages, with r's rank in MPI_COMM_WORLD too when the
  /// context's ranks are not the world's: "rank 1 (world rank 5)".
  [[nodiscard]] std::string rank_name(int r) const { return mpi::rank_text(r, world_); }
  /// Number of plans built so far (a rebuild of a cached shape counts too).
  [[nodiscard]] size_t plans_built() const noexcept { return plans_.built(); }
  /// Number of plans built again for a shape that the cache had evicted
  /// (within its last detail::plan_cache::remembered_evictions evictions).
  /// One that keeps growing means the program's calls use more shapes than
  /// config().plan_cache keeps, and each such call pays the ranks' exchange
  /// and a plan build; rank 0 warns once when it reaches plan_cache. Local.
  [[nodiscard]] size_t plans_rebuilt() const noexcept { return plans_.rebuilt(); }
  /// True after a fatal error under fatal_policy::throw_error: every op throws.
  [[nodiscard]] bool failed() const noexcept { return !failure_.empty(); }
  /// True while an op started on this context (start_all_gather_matmul,
  /// start_matmul_reduce_scatter) has not been waited for.
  [[nodiscard]] bool busy() const { return worker_ && worker_->busy(); }

  /// The backend that multiplies operands of type t under this context's
  /// config; std::invalid_argument for a combination no backend has.
  [[nodiscard]] backend_kind backend_for(dtype t) const {
    if (t == dtype::f64) {
      if (cfg_.backend == backend_kind::onednn)
        throw std::invalid_argument("overlap: the onednn backend has no f64 matmul; use backend_kind::eigen");
      return backend_kind::eigen;
    }
    if (t == dtype::bf16) {
      if (cfg_.backend == backend_kind::eigen)
        throw std::invalid_argument("overlap: the eigen backend has no bf16 matmul; use backend_kind::onednn");
      return backend_kind::onednn;
    }
    return cfg_.backend == backend_kind::automatic ? backend_kind::onednn : cfg_.backend;
  }
  template <class T>
  /// backend_for(dtype_of<T>()).
  [[nodiscard]] backend_kind backend_for() const {
    return backend_for(dtype_of<T>());
  }
  /// How products of t are computed on this rank, e.g. "onednn bf16 (native,
  /// avx512_core_bf16)" or "onednn f32 on widened bf16 pieces (...)"; the
  /// benchmarks report it as gemm_path.
  [[nodiscard]] std::string gemm_path(dtype t) const;

  // ---- for the ops (not part of the stable API) ----
  /// Fewest output rows (or columns) a ring piece of t should have when its
  /// other output extent is `other`, for this rank's GEMM path to keep one
  /// GEMM's rate (backend::detail::gemm_jit_knee; 0: no knee). Local and
  /// never throws (it runs before the ranks agree, also on input that
  /// backend_for rejects): the ops put each rank's knee in the table the
  /// ranks exchange and plan with the largest.
  [[nodiscard]] int64_t piece_knee(dtype t, int64_t other) const noexcept;
  /// The kernel of a product (the backend for d.in under this config).
  [[nodiscard]] std::shared_ptr<const gemm_kernel> make_kernel(const gemm_desc& d);
  /// The cost model's inputs: loaded from config().calibration when the
  /// context was created (the same on every rank), or measured on first need
  /// (null until then).
  [[nodiscard]] const std::optional<overlap::calibration>& calibration() const noexcept { return model_; }
  /// For the ops: the inputs to complete (collectively) before a choice.
  [[nodiscard]] overlap::calibration& calibration_to_complete() {
    if (!model_) model_ = overlap::calibration{{}, {}, "measured by this context", {}};
    return *model_;
  }
  /// The link class of this context's ring.
  [[nodiscard]] link_class links() const noexcept { return nodes_ == 1 ? link_class::shared : link_class::network; }

  /// The cached plan for key (now the most recently used), or null.
  [[nodiscard]] detail::plan_base* find_plan(const detail::plan_key& key) { return plans_.find(key); }
  /// Prints a plan's description on rank 0 when the config is verbose.
  void log_plan(const std::string& what) const {
    if (cfg_.verbose && rank_ == 0) std::fprintf(stderr, "overlap: plan %s\n", what.c_str());
  }
  /// Caches a plan, evicting the least recently used beyond config().plan_cache.
  detail::plan_base* store_plan(const detail::plan_key& key, std::unique_ptr<detail::plan_base> plan);
  /// The progress thread (progress_policy::thread), or null.
  [[nodiscard]] engine::progress_thread* progress() const noexcept { return progress_.get(); }
  /// The timeline recorder (OVERLAP_TRACE), or null: nothing recorded.
  [[nodiscard]] engine::trace_recorder* tracer() const noexcept { return trace_; }
  /// The requests of the op in flight (the ring's transfers), shared by this context's ops.
  [[nodiscard]] mpi::request_group& requests() noexcept { return *requests_; }
  /// The last timed call of a measured choice whose time the ranks have
  /// not agreed on yet (ops/measured_plans.hpp): a started op's, agreed at
  /// the next call's preparing.
  [[nodiscard]] detail::timed_call& last_timed() noexcept { return timed_; }
  /// Buffers the ranks' agreement reuses from call to call.
  [[nodiscard]] detail::agreement_scratch& scratch() noexcept { return *scratch_; }

  /// Throws (on this rank) when the context cannot run an op: MPI finalised,
  /// or the context failed earlier under fatal_policy::throw_error.
  void check_usable(const char* op) const {
    detail::require_mpi_running(op);
    if (busy())
      throw std::logic_error(std::string(op) +
                             ": an op started on this context is in flight; wait() for it first (one op in flight "
                             "per context)");
    if (!failure_.empty())
      throw std::logic_error(std::string(op) + ": this context failed earlier and cannot be used (" + failure_ +
                             "); end the job, or create a new context on all ranks");
  }

  /// Collective on first use: the worker that runs started ops, created on
  /// every rank (MPI_THREAD_MULTIPLE needed), agreed like any other failure.
  /// Kept only where every rank made one, so a rank that has it knows all
  /// have it, and later starts skip the agreement (no collective of their own).
  engine::worker& start_worker(const char* op) {
    if (worker_) return *worker_;
    detail::failure local;
    std::unique_ptr<engine::worker> made;
    try {
      // Under SMPI a rank's second thread must not call MPI: the op runs on
      // the caller's thread inside start (its transfers still progress in
      // simulated time; what the caller computes before wait() does not
      // overlap the op's own GEMMs).
      const auto where = mpi::simulated ? engine::worker::runs::on_caller_thread : engine::worker::runs::on_own_thread;
      int provided = MPI_THREAD_SINGLE;
      OVERLAP_MPI(MPI_Query_thread, &provided);
      if (where == engine::worker::runs::on_own_thread && provided < MPI_THREAD_MULTIPLE)
        throw std::invalid_argument(std::string(op) +
                                    ": a started op runs on a second thread, which needs MPI_THREAD_MULTIPLE; "
                                    "initialise MPI with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...)");
      made = std::make_unique<engine::worker>(where);
    } catch (...) {
      local = detail::failure::capture(std::current_exception());
    }
    detail::agree_on(*this, local, op);
    worker_ = std::move(made);
    return *worker_;
  }

  /// A failure after the ranks agreed to run an op: peers may wait for this
  /// rank, so it is fatal. Prints it (with this rank in the context and the
  /// world) to stderr and applies config().on_fatal: MPI_Abort on the
  /// context's communicator, or mark the context failed (its plans and
  /// requests are given up on, not freed) and throw overlap::error.
  [[noreturn]] void fatal(const std::string& what, const char* call, int code, error_source source);

 private:
  /// Collective: checks, duplicates comm, agrees on what may fail on one rank.
  context(MPI_Comm comm, std::optional<overlap::config> given);

  /// What a context sets up on this rank alone.
  /// Collective: resolves progress_policy::automatic from the node (a
  /// failure goes to local, agreed with the rest).
  void choose_progress(detail::failure& local);
  void prepare_local();
  /// OVERLAP_TRACE: joins the process's recorder and reports transfers to it.
  void start_trace();

  void drop_plans() noexcept { plans_.clear(); }

  /// Collective: where the ranks sit (nodes, world ranks) and the ring that
  /// follows (config().ring, which must agree across ranks).
  void place_ranks();
  friend void detail::set_ring_for_testing(context& ctx, std::vector<int> order);
  friend void detail::set_nodes_for_testing(context& ctx, int slots);

  overlap::config cfg_;
  mpi::communicator comm_;
  int rank_ = 0;
  int size_ = 1;
  int nodes_ = 1;
  std::vector<int> ring_;     ///< the rank at each ring position
  int ring_pos_ = 0;          ///< this rank's position
  std::vector<int> by_node_;  ///< ranks ordered by node (ring_by_node), for the hierarchical schedule
  int by_node_pos_ = 0;       ///< this rank's place in by_node_
  int node_slots_ = 0;        ///< ranks per node when every node has as many, else 0
  std::vector<int> world_;    ///< world rank of each rank (empty: the same numbers)
  bool widen_bf16_ = false;
  std::optional<overlap::calibration> model_;
  std::string failure_;                              ///< the fatal error that ended this context (throw policy)
  std::unique_ptr<backend::eigen_backend> eigen_;    ///< made on first use
  std::unique_ptr<backend::onednn_backend> onednn_;  ///< made on first use
  std::shared_ptr<backend::sim_timings> sim_;        ///< SimGrid SMPI only: the GEMMs' simulated times
  std::unique_ptr<engine::progress_thread> progress_;
  std::string progress_why_;  ///< why automatic chose cfg_.progress ("" when the config named a policy)
  /// The plan cache, bounded by config().plan_cache once the config is known.
  detail::plan_cache plans_{static_cast<size_t>(overlap::config{}.plan_cache)};
  std::unique_ptr<mpi::request_group> requests_ = std::make_unique<mpi::request_group>();
  std::unique_ptr<detail::agreement_scratch> scratch_ = std::make_unique<detail::agreement_scratch>();
  detail::timed_call timed_;                                ///< see last_timed()
  engine::trace_recorder* trace_ = nullptr;                 ///< the process's recorder (OVERLAP_TRACE), not owned
  std::unique_ptr<mpi::request_group::observer> observer_;  ///< transfers to the recorder
  /// Runs started ops; last, so it ends (after its job) before what the job uses.
  std::unique_ptr<engine::worker> worker_;
};

}  // namespace overlap

// Header-only, the implementation comes with the declarations (flavour.hpp).
#ifndef OVERLAP_COMPILED
#include "overlap/runtime/context-inl.hpp"
#endif
