#pragma once
/// @file
/// The parts of the context that touch the GEMM libraries (oneDNN, Eigen):
/// part of the header-only flavour, compiled once into the library otherwise
/// (flavour.hpp), so a consumer of the compiled flavour never parses their
/// headers.

#include <algorithm>
#include <fstream>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>

#include "overlap/backend/eigen.hpp"
#include "overlap/backend/onednn.hpp"
#include "overlap/backend/simulated.hpp"
#include "overlap/engine/trace.hpp"
#include "overlap/mpi/simulator.hpp"
#include "overlap/runtime/context.hpp"

namespace overlap {

namespace detail {
/// The defaults a context falls back to where its configuration failed on
/// this rank, but for the watchdog's setting when it is valid: it chooses
/// blocking or non-blocking collectives, and MPI never matches one with the
/// other, so a rank reset to no watchdog would leave the others waiting.
inline overlap::config config_after_failure(const overlap::config& read) {
  overlap::config fallback;
  fallback.timeout_s = read.timeout_s;
  for (const setting& s : settings())
    if (std::string(s.field) == "timeout_s" && !s.check(fallback).empty()) fallback.timeout_s = 0;
  return fallback;
}
}  // namespace detail

OVERLAP_FUNC context::context(MPI_Comm comm, std::optional<overlap::config> given) {
  const std::string who = "overlap::context";
  detail::require_mpi_running(who.c_str());
  if (comm == MPI_COMM_NULL) throw std::invalid_argument(who + ": comm is MPI_COMM_NULL");
  int inter = 0;
  OVERLAP_MPI(MPI_Comm_test_inter, comm, &inter);
  if (inter != 0)
    throw std::invalid_argument(who +
                                ": comm is an inter-communicator; a context needs an intra-communicator "
                                "(MPI_Intercomm_merge makes one)");
  // Local steps that may fail on one rank only; their outcome is agreed
  // below, once the duplicate communicator exists.
  detail::failure local;
  try {
    cfg_ = given ? *given : config::from_env();
    if (const std::string p = detail::config_problem(cfg_); !p.empty()) throw std::invalid_argument(p);
  } catch (...) {
    local = detail::failure::capture(std::current_exception());
    cfg_ = detail::config_after_failure(cfg_);
  }
  plans_ = detail::plan_cache(static_cast<size_t>(cfg_.plan_cache));
  comm_ = detail::watched_dup(comm, cfg_.timeout_s, who);
  rank_ = comm_.rank();
  size_ = comm_.size();
  choose_progress(local);
  if (!local.failed()) {
    try {
      prepare_local();
    } catch (...) {
      local = detail::failure::capture(std::current_exception());
    }
  }
  detail::agree_on(*this, local, who);
  // Rank 0's calibration (read in prepare_local), the same on every rank.
  if (!cfg_.calibration.empty())
    model_ = overlap::calibration::broadcast(comm_.get(), 0, rank_ == 0 ? *model_ : overlap::calibration{},
                                             cfg_.calibration);
  if (sim_ && cfg_.sim == sim_compute::calibrated) sim_->set_rates(model_->gemm, cfg_.calibration);
  requests_->set_timeout(cfg_.timeout_s);
  place_ranks();
  // Right after place_ranks' collectives: the ranks' trace clocks start together.
  if (!cfg_.trace.empty()) start_trace();
  if (cfg_.verbose && rank_ == 0)
    std::fprintf(stderr, "overlap: context on %d ranks%s: %s; bf16 products: %s%s\n", size_,
                 nodes_ == 1 ? " (all on one node)" : (" on " + std::to_string(nodes_) + " nodes").c_str(),
                 describe(cfg_).c_str(), gemm_path(dtype::bf16).c_str(),
                 progress_why_.empty() ? "" : ("; progress chosen on rank 0's node: " + progress_why_).c_str());
  mpi::say_compute_charge_problem(cfg_.sim != sim_compute::measured);
}

[[noreturn]] OVERLAP_FUNC void context::fatal(const std::string& what, const char* call, int code,
                                              error_source source) {
  const bool abort = cfg_.on_fatal == fatal_policy::abort;
  std::fprintf(stderr, "overlap: fatal error on rank %d of %d (world rank %d): %s; OVERLAP_ON_FATAL=%s: %s\n", rank_,
               size_, detail::world_rank(), what.c_str(), to_string(cfg_.on_fatal),
               abort ? "aborting the job (MPI_Abort)" : "throwing; this context is no longer usable");
  std::fflush(stderr);
  if (abort) {
    MPI_Abort(comm_.get(), 70);
    std::abort();  // MPI_Abort does not return; should it, never hang
  }
  failure_ = what;
  requests_->leak();
  auto& g = detail::leaked();
  for (auto& plan : plans_.release()) g.plans.push_back(std::move(plan));
  g.scratch.push_back(std::move(scratch_));
  scratch_ = std::make_unique<detail::agreement_scratch>();
  throw error(source, code, call, what);
}

OVERLAP_FUNC void context::choose_progress(detail::failure& local) {
  // Collective whatever this rank's config says, so that ranks whose
  // policies differ still meet here.
  mpi::node_share share;
  try {
    if (!mpi::simulated) share = mpi::share_of_node(comm_.get());
  } catch (...) {
    if (!local.failed()) local = detail::failure::capture(std::current_exception());
    return;
  }
  if (local.failed() || cfg_.progress != progress_policy::automatic) return;
  engine::progress_choice c = engine::choose_progress(share, mpi::simulated);
  cfg_.progress = c.policy;
  progress_why_ = std::move(c.why);
}

OVERLAP_FUNC void context::place_ranks() {
  world_ = mpi::world_ranks(comm_.get());
  requests_->set_world_ranks(world_);
  const std::vector<int> leaders = mpi::node_leaders(comm_.get());
  nodes_ = mpi::node_count(leaders);
  // The ring order changes every op's neighbours: the ranks must agree on it.
  const int mine = static_cast<int>(cfg_.ring);
  int lo = mine, hi = mine;
  OVERLAP_MPI(MPI_Allreduce, &mine, &lo, 1, MPI_INT, MPI_MIN, comm_.get());
  OVERLAP_MPI(MPI_Allreduce, &mine, &hi, 1, MPI_INT, MPI_MAX, comm_.get());
  if (lo != hi)
    throw std::invalid_argument("overlap::context: config.ring (OVERLAP_RING_ORDER) differs across ranks (" +
                                std::string(to_string(static_cast<ring_order>(lo))) + " and " +
                                to_string(static_cast<ring_order>(hi)) + "); it must agree");
  std::vector<int> order(static_cast<size_t>(size_));
  std::iota(order.begin(), order.end(), 0);
  by_node_ = mpi::ring_by_node(leaders);
  by_node_pos_ = static_cast<int>(std::find(by_node_.begin(), by_node_.end(), rank_) - by_node_.begin());
  node_slots_ = mpi::uniform_node_size(leaders);
  detail::set_ring_for_testing(*this, cfg_.ring == ring_order::node ? by_node_ : order);
}

OVERLAP_FUNC void detail::set_nodes_for_testing(context& ctx, int slots) {
  ctx.by_node_.resize(static_cast<size_t>(ctx.size_));
  std::iota(ctx.by_node_.begin(), ctx.by_node_.end(), 0);
  ctx.by_node_pos_ = ctx.rank_;
  ctx.node_slots_ = slots > 0 && ctx.size_ % slots == 0 ? slots : 0;
  ctx.clear_plans();
}

OVERLAP_FUNC void detail::set_ring_for_testing(context& ctx, std::vector<int> order) {
  ctx.ring_ = std::move(order);
  ctx.ring_pos_ = static_cast<int>(std::find(ctx.ring_.begin(), ctx.ring_.end(), ctx.rank_) - ctx.ring_.begin());
  ctx.clear_plans();
}

OVERLAP_FUNC context::context(context&&) noexcept = default;
OVERLAP_FUNC context& context::operator=(context&&) noexcept = default;
OVERLAP_FUNC context::~context() {
  worker_.reset();  // a started op ends first
  if (trace_ == nullptr || observer_ == nullptr) return;
  try {
    trace_->flush();
  } catch (const std::exception& e) {  // a timeline is not worth a crash
    std::fprintf(stderr, "overlap: OVERLAP_TRACE: %s\n", e.what());
  }
}

namespace detail {
/// Transfers seen complete, to the timeline: peer (world rank), bytes, lane.
class trace_observer final : public mpi::request_group::observer {
 public:
  trace_observer(engine::trace_recorder* rec, std::vector<int> world) : rec_(rec), world_(std::move(world)) {}
  [[nodiscard]] double now() const override { return rec_->now(); }
  void completed(const mpi::request_group::about& what) override {
    engine::trace_recorder::transfer_span s;
    s.send = what.send;
    s.peer_world = world_.empty() || what.peer < 0 ? what.peer : world_[static_cast<size_t>(what.peer)];
    s.bytes = what.bytes();
    s.lane = what.lane;
    s.posted = what.posted;
    s.completed = rec_->now();
    rec_->transfer(s);
  }

 private:
  engine::trace_recorder* rec_;
  std::vector<int> world_;
};
}  // namespace detail

OVERLAP_FUNC void context::start_trace() {
  trace_ = engine::trace_recorder::open(cfg_.trace, detail::world_rank());
  observer_ = std::make_unique<detail::trace_observer>(trace_, world_);
  requests_->observe(observer_.get());
}

OVERLAP_FUNC detail::plan_base* context::store_plan(const detail::plan_key& key,
                                                    std::unique_ptr<detail::plan_base> plan) {
  const size_t rebuilt = plans_.rebuilt();
  detail::plan_base* stored = plans_.store(key, std::move(plan));
  // Once, when the rebuilds reach the cache's size: a pattern, not a one-off.
  if (plans_.rebuilt() != rebuilt && plans_.rebuilt() == plans_.bound() && rank_ == 0)
    std::fprintf(stderr,
                 "overlap: rank 0: calls needed plans again that the plan cache (plan_cache = %zu) had evicted, "
                 "%zu rebuilt so far: the program uses more op shapes than the cache keeps, and each rebuild costs "
                 "an exchange between the ranks and a plan build inside the call; raise OVERLAP_PLAN_CACHE "
                 "(config::plan_cache)\n",
                 plans_.bound(), plans_.rebuilt());
  if (cfg_.verbose && rank_ == 0 && plans_.rebuilt() != rebuilt)
    std::fprintf(stderr, "overlap: plan built again after its eviction (%zu so far): %s\n", plans_.rebuilt(),
                 stored->summary.c_str());
  return stored;
}

OVERLAP_FUNC bool context::save_calibration(const std::string& path) const {
  if (!model_) return false;
  if (rank_ != 0) return true;
  std::ofstream out(path);
  out << model_->to_json() << "\n";
  out.close();
  if (!out) throw std::runtime_error("overlap: context::save_calibration cannot write " + path);
  return true;
}

OVERLAP_FUNC std::string context::gemm_path(dtype t) const {
  if (backend_for(t) == backend_kind::eigen) return std::string("eigen ") + to_string(t);
  const std::string isa = backend::detail::effective_isa();
  if (t != dtype::bf16) return std::string("onednn ") + to_string(t) + " (" + isa + ")";
  if (!widen_bf16_) return "onednn bf16 (native, " + isa + ")";
  return "onednn f32 on widened bf16 pieces (" +
         std::string(cfg_.bf16 == bf16_gemm::widened ? "OVERLAP_BF16_GEMM=widened" : "no bf16 matmul") + " at ISA " +
         isa + ")";
}

OVERLAP_FUNC int64_t context::piece_knee(dtype t, int64_t other) const noexcept {
  if (t == dtype::f64 || cfg_.backend == backend_kind::eigen) return 0;  // Eigen: no knee
  return backend::detail::gemm_jit_knee(t == dtype::f32 || widen_bf16_, other);
}

OVERLAP_FUNC std::shared_ptr<const gemm_kernel> context::make_kernel(const gemm_desc& d) {
  if (backend_for(d.in) == backend_kind::eigen) {
    if (!eigen_) eigen_ = std::make_unique<backend::eigen_backend>();
    return backend::simulated(eigen_->make(d), d, sim_);
  }
  if (!onednn_) onednn_ = std::make_unique<backend::onednn_backend>();
  return backend::simulated(onednn_->make(d, widen_bf16_), d, sim_);
}

OVERLAP_FUNC void context::prepare_local() {
  if (!cfg_.calibration.empty() && rank_ == 0) model_ = overlap::calibration::load(cfg_.calibration);
  if (cfg_.progress == progress_policy::thread) {
    int provided = MPI_THREAD_SINGLE;
    OVERLAP_MPI(MPI_Query_thread, &provided);
    if (provided < MPI_THREAD_MULTIPLE)
      throw std::invalid_argument(
          "the progress thread needs MPI_THREAD_MULTIPLE; initialise MPI with "
          "MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) or use progress_policy::none "
          "(OVERLAP_PROGRESS=none)");
  }
  if (cfg_.backend != backend_kind::eigen) {
    const bool native = backend::detail::native_bf16();
    if (cfg_.bf16 == bf16_gemm::native && !native)
      throw std::invalid_argument(
          std::string("bf16: OVERLAP_BF16_GEMM=native, but oneDNN has no bf16 matmul on this CPU (effective ISA ") +
          backend::detail::effective_isa() +
          "; oneDNN 2.6 needs AVX512_CORE, and AVX512_BF16 for full speed); use OVERLAP_BF16_GEMM=automatic or "
          "widened (f32 products of widened pieces, bf16 transfers)");
    widen_bf16_ = cfg_.bf16 == bf16_gemm::widened || !native;
  }
  if (cfg_.progress == progress_policy::thread)
    progress_ = std::make_unique<engine::progress_thread>(cfg_.progress_interval);
  if (mpi::simulated)
    sim_ = std::make_shared<backend::sim_timings>(cfg_.sim, cfg_.sim_samples,
                                                  cfg_.sim == sim_compute::steady || cfg_.sim == sim_compute::skipped);
  const bool times_only = cfg_.sim == sim_compute::skipped || cfg_.sim == sim_compute::calibrated;
  if (mpi::simulated && cfg_.sim == sim_compute::calibrated &&
      (cfg_.calibration.empty() || (rank_ == 0 && model_->gemm.empty())))
    throw std::invalid_argument(
        cfg_.calibration.empty()
            ? "OVERLAP_SIM_COMPUTE=calibrated charges GEMMs from a calibration; set OVERLAP_CALIBRATION to a file "
              "of overlap-calibrate's"
            : "OVERLAP_SIM_COMPUTE=calibrated: the calibration " + cfg_.calibration + " has no GEMM rates");
  // Timing only: results are wrong anyway, so this rank's workspaces from
  // now on are shared by the simulated ranks (memory and copies that do not
  // grow with the ranks; docs/smpi.md).
  if (mpi::simulated && times_only) mpi::shared_workspaces() = true;
}

}  // namespace overlap
