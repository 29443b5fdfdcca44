#pragma once
/// @file
/// The context: one per communicator, owns everything the ops reuse.

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "overlap/backend/eigen.hpp"
#include "overlap/backend/onednn.hpp"
#include "overlap/config.hpp"
#include "overlap/engine/progress.hpp"
#include "overlap/mpi/communicator.hpp"
#include "overlap/mpi/request.hpp"

namespace overlap {

namespace detail {
/// A cached plan: everything that depends only on the shapes of a call.
struct plan_base {
  virtual ~plan_base() = default;
  /// Hash of the global problem (every rank's sizes and the options) the plan
  /// was built for; ranks compare it to agree that their cached plans match.
  uint64_t fingerprint = 0;
};
using plan_key = std::vector<int64_t>;
}  // namespace detail

/// Owns a duplicate of the user's communicator (ring traffic never mixes with
/// the caller's messages), the GEMM backends, the progress thread and the plan
/// cache. Constructing it is collective over comm (MPI_Comm_dup). Not
/// copyable; movable. Not thread-safe: one thread calls the ops of a context.
class context {
 public:
  /// Collective over comm. With progress_policy::thread, MPI must have been
  /// initialised with MPI_THREAD_MULTIPLE; otherwise std::invalid_argument
  /// (on every rank: the thread level is the same everywhere).
  explicit context(MPI_Comm comm, overlap::config cfg = overlap::config::from_env())
      : cfg_(cfg), comm_(mpi::communicator::borrow(comm).dup()) {
    if (cfg_.ag_chunks < 0) throw std::invalid_argument("overlap::context: config.ag_chunks must be >= 0 (0: automatic)");
    if (cfg_.rs_chunks < 0 || cfg_.rs_chunks == 1)
      throw std::invalid_argument("overlap::context: config.rs_chunks must be 0 (automatic) or >= 2");
    if (cfg_.poll_chunks < 1) throw std::invalid_argument("overlap::context: config.poll_chunks must be >= 1");
    const auto policy = static_cast<int>(cfg_.progress);
    if (policy < 0 || policy > 2)
      throw std::invalid_argument("overlap::context: config.progress has an invalid value " + std::to_string(policy));
    if (cfg_.progress == progress_policy::thread) {
      int provided = MPI_THREAD_SINGLE;
      OVERLAP_MPI(MPI_Query_thread, &provided);
      if (provided < MPI_THREAD_MULTIPLE)
        throw std::invalid_argument(
            "overlap::context: the progress thread needs MPI_THREAD_MULTIPLE; initialise MPI with "
            "MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) or use progress_policy::none "
            "(OVERLAP_PROGRESS=none)");
      progress_ = std::make_unique<engine::progress_thread>(cfg_.progress_interval);
    }
    rank_ = comm_.rank();
    size_ = comm_.size();
    // The same answer on every rank: all ranks see the whole communicator on
    // their node, or none does.
    one_node_ = comm_.ranks_on_my_node() == size_;
    if (cfg_.verbose && rank_ == 0)
      std::fprintf(stderr, "overlap: context on %d ranks%s: %s\n", size_, one_node_ ? " (all on one node)" : "",
                   describe(cfg_).c_str());
  }

  context(context&&) noexcept = default;
  context& operator=(context&&) noexcept = default;

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  /// The context's own communicator (a duplicate; do not free it).
  [[nodiscard]] MPI_Comm comm() const noexcept { return comm_.get(); }
  [[nodiscard]] const overlap::config& config() const noexcept { return cfg_; }
  /// Number of plans cached so far (one per distinct shape and options).
  [[nodiscard]] size_t cached_plans() const noexcept { return plans_.size(); }
  /// True when every rank of the communicator shares one node (MPI moves data
  /// through shared memory: copies done by the cores that also compute).
  [[nodiscard]] bool one_node() const noexcept { return one_node_; }
  /// Number of plans built so far (a rebuild of a cached shape counts too).
  [[nodiscard]] size_t plans_built() const noexcept { return plans_built_; }

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
  [[nodiscard]] backend_kind backend_for() const {
    return backend_for(dtype_of<T>());
  }

  // ---- for the ops (not part of the stable API) ----
  [[nodiscard]] std::shared_ptr<const gemm_kernel> make_kernel(const gemm_desc& d) {
    if (backend_for(d.in) == backend_kind::eigen) return eigen_.make(d);
    if (!onednn_) onednn_ = std::make_unique<backend::onednn_backend>();
    return onednn_->make(d);
  }
  /// The kernel of a ring step: under progress_policy::poll, poll_chunks row
  /// bands of C with an MPI_Testall of the outstanding requests between two
  /// bands; otherwise make_kernel(d).
  [[nodiscard]] std::shared_ptr<const gemm_kernel> make_step_kernel(const gemm_desc& d) {
    const int64_t bands = std::min<int64_t>(cfg_.poll_chunks, d.m);
    if (cfg_.progress != progress_policy::poll || bands < 2 || d.n == 0) return make_kernel(d);
    std::vector<banded_kernel::band> parts;
    for (int64_t i = 0; i < bands; ++i) {
      const int64_t r0 = d.m / bands * i + std::min(i, d.m % bands);
      const int64_t r1 = d.m / bands * (i + 1) + std::min(i + 1, d.m % bands);
      gemm_desc sub = d;
      sub.m = r1 - r0;
      parts.push_back({r0, make_kernel(sub)});
    }
    // The group lives on the heap: its address survives moves of the context.
    return std::make_shared<banded_kernel>(d, std::move(parts), &context::poll, requests_.get());
  }
  [[nodiscard]] detail::plan_base* find_plan(const detail::plan_key& key) const {
    auto it = plans_.find(key);
    return it == plans_.end() ? nullptr : it->second.get();
  }
  /// Prints a plan's description on rank 0 when the config is verbose.
  void log_plan(const std::string& what) const {
    if (cfg_.verbose && rank_ == 0) std::fprintf(stderr, "overlap: plan %s\n", what.c_str());
  }
  detail::plan_base* store_plan(const detail::plan_key& key, std::unique_ptr<detail::plan_base> plan) {
    auto& slot = plans_[key];
    slot = std::move(plan);
    ++plans_built_;
    return slot.get();
  }
  [[nodiscard]] engine::progress_thread* progress() const noexcept { return progress_.get(); }
  [[nodiscard]] mpi::request_group& requests() noexcept { return *requests_; }

 private:
  static void poll(void* group) { static_cast<mpi::request_group*>(group)->test_all(); }

  overlap::config cfg_;
  mpi::communicator comm_;
  int rank_ = 0;
  int size_ = 1;
  bool one_node_ = false;
  backend::eigen_backend eigen_;
  std::unique_ptr<backend::onednn_backend> onednn_;
  std::unique_ptr<engine::progress_thread> progress_;
  std::map<detail::plan_key, std::unique_ptr<detail::plan_base>> plans_;
  size_t plans_built_ = 0;
  std::unique_ptr<mpi::request_group> requests_ = std::make_unique<mpi::request_group>();
};

}  // namespace overlap
