#pragma once
/// @file
/// GEMMs under SimGrid SMPI (mpi::simulated): a kernel decorator that puts a
/// stable figure per GEMM shape into simulated time (sim_compute::steady and
/// skipped) instead of SMPI's timing of every call, which carries the noise
/// of the machine that runs the simulation.

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "overlap/backend/gemm.hpp"
#include "overlap/config.hpp"
#include "overlap/mpi/simulator.hpp"

namespace overlap::backend {

/// The real times of one rank's GEMMs by shape, and the figure each shape is
/// charged once sampled. Owned by whoever makes the kernels (a context, a
/// layer's local products); kernels keep it alive.
class sim_timings {
 public:
  sim_timings(sim_compute mode, int samples) : mode_(mode), samples_(std::max(samples, 1)) {}

  struct entry {
    std::vector<double> runs;  ///< real seconds of the sampled runs
    double charge = 0;         ///< median of runs, once there are enough
  };
  [[nodiscard]] sim_compute mode() const noexcept { return mode_; }
  [[nodiscard]] size_t samples() const noexcept { return static_cast<size_t>(samples_); }
  /// The entry of a shape; its address is stable (std::map nodes).
  entry& of(const gemm_desc& d) { return table_[d]; }

 private:
  sim_compute mode_;
  int samples_;
  std::map<gemm_desc, entry> table_;
};

/// Runs `inner` and charges simulated time as sim_timings says: while the
/// shape is sampled, its real time; then the median of the samples, with
/// the GEMM computed (steady) or not (skipped). A GEMM that may run again on
/// the same operands (it overwrites c, reading nothing of it) takes all its
/// samples on its first call, back to back, and is charged their median from
/// that call on. Otherwise a shape that runs once per call of an op (bulk's
/// GEMM, the other-operands blocks) would be charged its first, cold runs
/// on every rank of a short simulation, while the calibration the cost
/// model reads times warm runs. Not thread-safe, like every kernel.
class simulated_kernel final : public gemm_kernel {
 public:
  simulated_kernel(std::shared_ptr<const gemm_kernel> inner, std::shared_ptr<sim_timings> timings,
                   sim_timings::entry& entry, bool accumulates)
      : inner_(std::move(inner)), timings_(std::move(timings)), entry_(&entry), accumulates_(accumulates) {}

  void run(const void* a, const void* b, void* c, const void* bias, const void* addend) const override {
    mpi::untimed_scope untimed;
    sim_timings::entry& e = *entry_;
    if (e.runs.size() >= timings_->samples()) {
      if (timings_->mode() != sim_compute::skipped) inner_->run(a, b, c, bias, addend);
      mpi::charge_compute(e.charge);
      return;
    }
    const bool repeatable = !accumulates_ && c != a && c != b && c != addend;
    double took = 0;
    do {
      const auto t0 = std::chrono::steady_clock::now();  // the real clock: SMPI's timers are simulated
      inner_->run(a, b, c, bias, addend);
      took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      e.runs.push_back(took);
    } while (repeatable && e.runs.size() < timings_->samples());
    if (e.runs.size() == timings_->samples()) {
      std::vector<double> sorted = e.runs;
      std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(sorted.size() / 2), sorted.end());
      e.charge = sorted[sorted.size() / 2];
      took = e.charge;
    }
    mpi::charge_compute(took);
  }
  [[nodiscard]] size_t packed_b_bytes() const override { return inner_->packed_b_bytes(); }
  [[nodiscard]] uint64_t packed_b_layout() const override { return inner_->packed_b_layout(); }
  void pack_b(const void* b, void* dst) const override { inner_->pack_b(b, dst); }
  [[nodiscard]] std::string name() const override { return inner_->name(); }

 private:
  std::shared_ptr<const gemm_kernel> inner_;
  std::shared_ptr<sim_timings> timings_;
  sim_timings::entry* entry_;
  bool accumulates_;  ///< adds to c: a second run on the same operands would add again
};

/// `k` as it runs here: unchanged on a real MPI and under
/// sim_compute::measured, else wrapped in a simulated_kernel.
[[nodiscard]] inline std::shared_ptr<const gemm_kernel> simulated(std::shared_ptr<const gemm_kernel> k,
                                                                  const gemm_desc& d,
                                                                  const std::shared_ptr<sim_timings>& timings) {
  if (!mpi::simulated || !timings || timings->mode() == sim_compute::measured) return k;
  return std::make_shared<simulated_kernel>(std::move(k), timings, timings->of(d), d.accumulate);
}

}  // namespace overlap::backend
