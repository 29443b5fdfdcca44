#pragma once
/// @file
/// A layer's local work other than the ops' GEMMs (attention, layer norms,
/// GELU, weight gradients) under SimGrid SMPI: sampled on its first real
/// runs of each kind and shape in the whole simulation, then charged their
/// median, and in timing-only runs no longer run at all. At 1024 simulated
/// ranks a rank's attention alone, run by every rank on one core, would
/// cost the simulation about a minute of real time per training step.

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "overlap/config.hpp"
#include "overlap/mpi/simulator.hpp"

namespace overlap::backend {

/// How a piece of local work reaches simulated time, by the context's
/// sim_compute:
/// - measured, or a real MPI: it runs, and SMPI times it as any host code;
/// - steady: it runs, charged the median of the first `samples` real runs
///   of its kind and shape in the simulation (whichever ranks took them);
/// - skipped, calibrated (timing only): as steady, but once sampled it
///   does not run: its outputs are then garbage, as the ops' results are.
/// Time is charged as this machine's (mpi::charge_compute: scaled by the
/// platform's host speed against smpi/host-speed, as SMPI scales host code).
/// The samples are the simulation's (mpi::process_wide), since the
/// simulated nodes are alike. Copyable; not thread-safe (SMPI runs one rank
/// at a time).
class work_sampler {
 public:
  /// A piece's kind and shape: the kind is a string literal, the shape's
  /// four numbers whatever sets its cost (unused ones zero).
  using key = std::pair<std::string, std::array<int64_t, 4>>;

  work_sampler() = default;  ///< runs every piece as it comes (SMPI times it)
  /// The context's setting (config::sim, config::sim_samples).
  work_sampler(sim_compute mode, int samples) : mode_(mode), samples_(size_t(std::max(samples, 1))) {}

  /// Runs `work`, or charges it, as above.
  template <class F>
  void operator()(const char* kind, const std::array<int64_t, 4>& shape, F&& work) const {
    if (!mpi::simulated || mode_ == sim_compute::measured) {
      work();
      return;
    }
    mpi::untimed_scope untimed;  // a simcall: look the entry up after it, others may have sampled meanwhile
    entry& e = process_wide_table()[{kind, shape}];
    if (e.runs.size() >= samples_) {
      if (mode_ == sim_compute::steady) work();
      mpi::charge_compute(e.charge);
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();  // the real clock: SMPI's timers are simulated
    work();
    double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    e.runs.push_back(took);
    if (e.runs.size() == samples_) {
      std::vector<double> sorted = e.runs;
      std::nth_element(sorted.begin(), sorted.begin() + std::ptrdiff_t(sorted.size() / 2), sorted.end());
      e.charge = took = sorted[sorted.size() / 2];
    }
    mpi::charge_compute(took);
  }

 private:
  struct entry {
    std::vector<double> runs;  ///< real seconds of the sampled runs
    double charge = 0;         ///< their median, once there are enough
  };
  static std::map<key, entry>& process_wide_table() {
    return mpi::process_wide<std::map<key, entry>>("overlap::backend::work_sampler::table");
  }

  sim_compute mode_ = sim_compute::measured;
  size_t samples_ = 1;
};

}  // namespace overlap::backend
