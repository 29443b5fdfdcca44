#pragma once
/// @file
/// GEMMs under SimGrid SMPI (mpi::simulated): a kernel decorator that puts a
/// stable figure per GEMM shape into simulated time (sim_compute::steady and
/// skipped), or the calibration's figure for it (sim_compute::calibrated),
/// instead of SMPI's timing of every call, which carries the noise of the
/// machine that runs the simulation.

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "overlap/backend/gemm.hpp"
#include "overlap/config.hpp"
#include "overlap/mpi/simulator.hpp"
#include "overlap/schedule/calibration.hpp"

namespace overlap::backend {

/// The real times of GEMMs by kernel and shape, and the figure each is
/// charged once sampled. Owned by whoever makes the kernels (a context);
/// kernels keep it alive.
class sim_timings {
 public:
  /// One kernel's shape: its sampled runs and what it is charged.
  struct entry {
    std::vector<double> runs;  ///< real seconds of the sampled runs
    double charge = 0;         ///< median of runs, once there are enough
  };
  /// Keyed by the kernel's name (its backend and path) and the GEMM's shape.
  using table = std::map<std::pair<std::string, gemm_desc>, entry>;

  /// `shared` (steady and skipped): under SMPI, the samples are those of
  /// every simulated rank and context of the simulation (mpi::process_wide),
  /// as the nodes of a platform are alike: a shape runs its samples once per
  /// simulation, not once per rank, which at R ranks would take R times the
  /// real time of a simulation that skips its GEMMs. Else this object's own
  /// (calibrated mode's charges come from each context's calibration).
  sim_timings(sim_compute mode, int samples, bool shared = false)
      : mode_(mode),
        samples_(std::max(samples, 1)),
        table_(shared && mpi::simulated ? &mpi::process_wide<table>("overlap::backend::sim_timings::table") : &own_) {}
  sim_timings(const sim_timings&) = delete;
  sim_timings& operator=(const sim_timings&) = delete;

  /// How a GEMM's simulated time is found (OVERLAP_SIM_COMPUTE).
  [[nodiscard]] sim_compute mode() const noexcept { return mode_; }
  /// Real runs sampled per kernel and shape (OVERLAP_SIM_SAMPLES).
  [[nodiscard]] size_t samples() const noexcept { return static_cast<size_t>(samples_); }
  /// The entry of a kernel's shape; its address is stable (std::map nodes).
  entry& of(const gemm_desc& d, const std::string& kernel = {}) { return (*table_)[{kernel, d}]; }

  /// sim_compute::calibrated: the GEMM rates to charge from (the context's
  /// calibration, the same on every rank), and where they came from.
  void set_rates(std::map<dtype, gemm_rates> rates, std::string origin) {
    rates_ = std::move(rates), origin_ = std::move(origin);
  }
  /// sim_compute::calibrated: d's flops over the calibrated rate of its
  /// shape, the figure the cost model reads (detail::gemm_seconds). Throws
  /// std::invalid_argument where the calibration has no rates for d's
  /// element type.
  [[nodiscard]] double calibrated_seconds(const gemm_desc& d) const {
    const auto it = rates_.find(d.in);
    if (it == rates_.end() || it->second.empty())
      throw std::invalid_argument("OVERLAP_SIM_COMPUTE=calibrated: the calibration (" + origin_ +
                                  ") has no GEMM rates for " + std::string(to_string(d.in)) +
                                  "; measure them with overlap-calibrate --dtypes " + std::string(to_string(d.in)));
    if (d.m <= 0 || d.n <= 0 || d.k <= 0) return 0;
    return 2.0 * double(d.m) * double(d.n) * double(d.k) / it->second.at(d.m, d.n, d.k);
  }

 private:
  sim_compute mode_;
  int samples_;
  table own_;
  table* table_;  ///< own_ or the simulation's
  std::map<dtype, gemm_rates> rates_;
  std::string origin_;
};

/// Runs `inner` and charges simulated time as sim_timings says: while the
/// shape is sampled, its real time; then the median of the samples, with
/// the GEMM computed (steady) or not (skipped). Under calibrated it never
/// runs `inner` and charges the calibration's figure from the first call. A GEMM that may run again on
/// the same operands (it overwrites c, reading nothing of it) takes all its
/// samples on its first call, back to back, and is charged their median from
/// that call on. Otherwise a shape that runs once per call of an op (bulk's
/// GEMM, the other-operands blocks) would be charged its first, cold runs
/// on every rank of a short simulation, while the calibration the cost
/// model reads times warm runs. Not thread-safe, like every kernel.
class simulated_kernel final : public gemm_kernel {
 public:
  /// Throws std::invalid_argument under sim_compute::calibrated where the
  /// timings have no rates for d's element type.
  simulated_kernel(std::shared_ptr<const gemm_kernel> inner, std::shared_ptr<sim_timings> timings, const gemm_desc& d)
      : inner_(std::move(inner)),
        timings_(std::move(timings)),
        entry_(&timings_->of(d, inner_->name())),
        accumulates_(d.accumulate) {
    if (timings_->mode() == sim_compute::calibrated) entry_->charge = timings_->calibrated_seconds(d);
  }

  void run(const gemm_operands& io) const override {
    mpi::untimed_scope untimed;
    sim_timings::entry& e = *entry_;
    if (timings_->mode() == sim_compute::calibrated) {
      mpi::charge_simulated(e.charge);  // the calibration timed its GEMMs on the simulated clock
      return;
    }
    if (e.runs.size() >= timings_->samples()) {
      if (timings_->mode() != sim_compute::skipped) inner_->run(io);
      mpi::charge_compute(e.charge);
      return;
    }
    const bool repeatable = !accumulates_ && io.c() != io.a() && io.c() != io.b() && io.c() != io.addend();
    double took = 0;
    do {
      const auto t0 = std::chrono::steady_clock::now();  // the real clock: SMPI's timers are simulated
      inner_->run(io);
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
  return std::make_shared<simulated_kernel>(std::move(k), timings, d);
}

}  // namespace overlap::backend
