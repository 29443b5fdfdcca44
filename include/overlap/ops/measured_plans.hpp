#pragma once
/// @file
/// strategy::automatic measuring its candidates (OVERLAP_AUTOMATIC=measured,
/// schedule/measured.hpp keeps the books): the plan cache holds one entry
/// per call shape, as for any call, whose plans are the candidates'. Each
/// is built when its turn comes and freed once it has lost (at most two
/// are alive: the running one and the fastest so far). A timed call's
/// seconds are agreed as the slowest rank's in one small MPI_Allreduce:
/// right after the call, or, for a started op, when the next call on the
/// context is prepared (the worker must not call a collective of its own).
/// Every decision follows from agreed times and from the calls themselves,
/// so all ranks run the same candidate on every call.

#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "overlap/config.hpp"
#include "overlap/mpi/simulator.hpp"
#include "overlap/runtime/context.hpp"
#include "overlap/runtime/plan_cache.hpp"
#include "overlap/runtime/watchdog.hpp"
#include "overlap/schedule/measured.hpp"
#include "overlap/schedule/schedule.hpp"

namespace overlap::detail {

/// Whether a call prepared counts as a call of its shape (it runs), or only
/// asks which schedule runs (op_schedule).
enum class call_use { runs, asks };

/// True where automatic measures: the cost model chose (automatic asked, a
/// model exists), the config says measured, and both halves of a schedule
/// run (a benchmark's compute-only or comm-only run times nothing real).
inline bool measures(const context& ctx, const schedule& by_model) {
  return by_model.by_model && ctx.config().automatic == automatic_choice::measured &&
         ctx.config().phases == ring_phases::both;
}

/// The name of a shape in the calibration's saved choices: the op, the
/// ranks and nodes, and the agreed fingerprint of every rank's sizes and
/// options (the same on every rank, and in a later job with the same shapes).
inline std::string choice_key(const context& ctx, const std::string& op, uint64_t fingerprint) {
  char hex[24];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fingerprint));
  return op + "/" + std::to_string(ctx.size()) + "r" + std::to_string(ctx.nodes()) + "n/" + hex;
}

/// Timed calls per candidate: one in SMPI's timing-only runs
/// (sim_compute::skipped and calibrated), where a candidate's simulated
/// time is the same on every call (GEMMs and copies charged, buffers shared
/// and faulted in once), and a second call of a 1024-rank other-operands
/// schedule costs minutes of the simulation; else measured_choice's default.
inline int measured_rounds(const context& ctx) {
  const sim_compute sim = ctx.config().sim;
  return mpi::simulated && (sim == sim_compute::skipped || sim == sim_compute::calibrated)
             ? 1
             : measured_choice::default_rounds;
}

/// The measured choice of a shape the model ranked (`by_model`): its
/// candidates, settled at once on the one an earlier job saved in the
/// context's calibration under the same key, if it is still a candidate.
inline std::shared_ptr<measured_choice> choice_for(const context& ctx, const schedule& by_model, std::string key,
                                                   std::string call) {
  auto choice = std::make_shared<measured_choice>(measured_candidates(by_model), ctx.config().automatic_recheck,
                                                  std::move(key), std::move(call), measured_rounds(ctx));
  const std::optional<overlap::calibration>& cal = ctx.calibration();
  if (cal)
    if (auto it = cal->choices.find(choice->key()); it != cal->choices.end())
      for (size_t i = 0; i < choice->candidates().size(); ++i) {
        if (choice->candidates()[i].same_as(it->second.chosen)) {
          choice->settle_on(i, it->second.chosen.measured_s, cal->origin);
          break;
        }
      }
  return choice;
}

/// Collective when a timed call is pending (on every rank alike): agrees on
/// its seconds as the slowest rank's, feeds them to its choice, and when
/// that settles keeps the choice in the context's calibration (saved with
/// it: context::save_calibration) and, under OVERLAP_VERBOSE, says so on
/// rank 0.
inline void settle_timed_call(context& ctx, const char* op) {
  timed_call& t = ctx.last_timed();
  if (!t.choice) return;
  const timed_call mine = std::exchange(t, timed_call{});
  double slowest = 0;
  watched_collective(
      ctx, "MPI_Allreduce", [&] { return MPI_Allreduce(&mine.seconds, &slowest, 1, MPI_DOUBLE, MPI_MAX, ctx.comm()); },
      [&](MPI_Request* r) { return MPI_Iallreduce(&mine.seconds, &slowest, 1, MPI_DOUBLE, MPI_MAX, ctx.comm(), r); },
      [&] { return std::string(op) + " (agreeing on the time of automatic's last timed call)"; });
  measured_choice& c = *mine.choice;
  c.record(slowest);
  if (!c.take_news()) return;
  ctx.calibration_to_complete().choices[c.key()] = saved_choice{c.chosen(), c.call()};
  if (ctx.config().verbose && ctx.rank() == 0) {
    std::string times;
    for (const candidate& k : c.candidates())
      if (k.measured_s >= 0)
        times += " | " + to_string(k) + ": " + std::to_string(k.measured_s * 1e3).substr(0, 7) + " ms";
    std::fprintf(stderr, "overlap: automatic measured %s: runs %s (%s; slowest rank%s)\n", c.call().c_str(),
                 to_string(c.chosen()).c_str(), c.evidence().c_str(), times.c_str());
  }
}

/// The plan cache's entry of a shape whose automatic schedule is measured:
/// the candidates' plans (built when their turn comes), the problem they
/// are built for, and the choice.
template <class Plan, class Global>
class measured_plans final : public plan_base {
 public:
  measured_plans(Global g, schedule by_model, std::shared_ptr<measured_choice> choice, uint64_t fp)
      : g_(std::move(g)), by_model_(std::move(by_model)), choice_(std::move(choice)) {
    fingerprint = fp;
    automatic = true;
    plans_.resize(choice_->candidates().size());
  }

  [[nodiscard]] bool measuring() const noexcept override { return !choice_->settled(); }
  [[nodiscard]] const Global& global() const noexcept { return g_; }
  [[nodiscard]] const std::shared_ptr<measured_choice>& choice() const noexcept { return choice_; }

  /// The plan of candidate i, built by `make(schedule)` if it is not (a
  /// collective, agreed build: it throws alike on every rank), after the
  /// plans of every candidate but i and the leader are freed.
  template <class Make>
  Plan& plan_for(size_t i, Make&& make) {
    for (size_t j = 0; j < plans_.size(); ++j)
      if (j != i && j != choice_->leader()) plans_[j].reset();
    if (!plans_[i]) {
      plans_[i] = make(schedule_of(choice_->candidates()[i]));
      described_ = {};
    }
    // Described again only when something changed: a settled call allocates nothing.
    if (described_.first != i || described_.second != choice_->version()) {
      describe(i);
      described_ = {i, choice_->version()};
    }
    return *plans_[i];
  }

 private:
  /// The running plan's schedule with the evidence: the model's table with
  /// the times measured so far; the entry's words for plan_reports.
  void describe(size_t i) {
    Plan& p = *plans_[i];
    schedule& s = p.sched;
    s.by_model = true;
    s.by_measurement = choice_->settled();
    s.evidence = choice_->settled() ? choice_->evidence() : std::string();
    s.predicted_s = choice_->candidates()[i].predicted_s;
    s.candidates = by_model_.candidates;
    for (candidate& k : s.candidates)
      for (const candidate& m : choice_->candidates())
        if (k.same_as(m)) k.measured_s = m.measured_s;
    p.schedule_words = to_string(s);
    summary = p.summary;
    schedule_words = choice_->settled() ? p.schedule_words
                                        : "measuring automatic's candidates (" + choice_->reason() + "), now " +
                                              to_string(choice_->candidates()[i]) + "; " + p.schedule_words;
  }

  Global g_;
  schedule by_model_;
  std::shared_ptr<measured_choice> choice_;
  std::vector<std::unique_ptr<Plan>> plans_;  ///< by candidate; null: not built, or freed
  /// The candidate and choice version the words describe.
  std::pair<size_t, int64_t> described_{static_cast<size_t>(-1), -1};
};

}  // namespace overlap::detail
