#pragma once
/// @file
/// strategy::automatic's measured choice for one call shape
/// (OVERLAP_AUTOMATIC=measured, the default): the cost model ranks the
/// candidates, the first calls of the shape run its best ones in turn,
/// timed, and later calls run the fastest measured. On a real machine the
/// model's inputs are noisy and its errors exceed the margins it chooses by
/// (docs/results.md, "Measured choice"); a training job calls one shape
/// thousands of times, so timing a few calls costs less than one wrong
/// choice. This is the bookkeeping only, the same on every rank: it is fed
/// times the ranks agreed on (the slowest rank's), so every rank runs the
/// same candidate on every call. ops/measured_plans.hpp runs it.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "overlap/schedule/schedule.hpp"

namespace overlap::detail {

/// Which candidates of the model's table are measured, at most `most`: the
/// model's choice first (ties keep its order of simplicity), bulk, then the
/// fastest predicted of each kind not yet among them (the one-lane ring,
/// the two-lane ring, moving the other operands), fastest first. Bulk is
/// always measured, so that the measured choice is never one slower than
/// bulk by more than the timing's noise; one of each kind, because the
/// model's errors are largest between kinds (it ranked three piece counts
/// of the other operands above the ring that ran faster on the emulated
/// star: docs/results.md, "Measured choice"). Candidates the model could
/// not price (a dry build failed) are left out.
[[nodiscard]] inline std::vector<candidate> measured_candidates(const schedule& by_model, size_t most = 3) {
  const candidate chosen{by_model.strategy, by_model.algorithm, by_model.chunks, by_model.predicted_s};
  auto kind = [](const candidate& c) {
    return c.algorithm == algorithm::others ? 3 : static_cast<int>(c.strategy);  // bulk, ring, bidirectional
  };
  std::vector<candidate> rest;
  for (const candidate& c : by_model.candidates)
    if (kind(c) != kind(chosen) && c.predicted_s < std::numeric_limits<double>::infinity()) rest.push_back(c);
  // Stable: equal predictions keep the model's order (simplest first).
  std::stable_sort(rest.begin(), rest.end(),
                   [](const candidate& a, const candidate& b) { return a.predicted_s < b.predicted_s; });
  std::vector<candidate> ranked{chosen};
  auto has_kind = [&](int k) {
    for (const candidate& c : ranked)
      if (kind(c) == k) return true;
    return false;
  };
  const int bulk = static_cast<int>(strategy::bulk);
  for (const candidate& c : rest)
    if (kind(c) == bulk && !has_kind(bulk) && ranked.size() < most) ranked.push_back(c);
  for (const candidate& c : rest)
    if (!has_kind(kind(c)) && ranked.size() < most) ranked.push_back(c);
  return ranked;
}

/// The measured choice of one call shape. Measuring: every call runs the
/// candidate whose turn it is, rounds() timed calls each (the first call of
/// a plan pays its page faults: the fastest of its calls counts). Settled:
/// calls run the fastest candidate (the earliest on a tie); one call in
/// drift_every is timed, and a time off the settled one by more than
/// drift_bound either way measures all candidates again, as does every
/// `recheck` calls (0: never).
class measured_choice {
 public:
  /// Timed calls per candidate on a real machine.
  static constexpr int default_rounds = 2;
  static constexpr int64_t drift_every = 50;
  static constexpr double drift_bound = 1.25;

  /// The call a turn runs: its candidate and whether it is timed.
  struct turn {
    size_t candidate = 0;
    bool timed = false;
  };

  /// `key` names the shape in the calibration's saved choices, `call` in
  /// words; `rounds` timed calls per candidate (1 where a call's time does
  /// not vary: SMPI's timing-only runs, measured_plans.hpp).
  measured_choice(std::vector<candidate> candidates, int64_t recheck, std::string key, std::string call,
                  int rounds = default_rounds)
      : candidates_(std::move(candidates)),
        recheck_(recheck),
        key_(std::move(key)),
        call_(std::move(call)),
        rounds_(std::max(rounds, 1)) {
    if (candidates_.empty()) throw std::logic_error("overlap: a measured choice needs a candidate");
    restart("first calls");
  }

  /// Timed calls per candidate.
  [[nodiscard]] int rounds() const noexcept { return rounds_; }

  /// The next call's turn (a call is being made: counts it).
  turn next_call() {
    if (settled_) {
      ++calls_since_;
      if (recheck_ > 0 && calls_since_ >= recheck_) {
        restart("re-checked after " + std::to_string(recheck_) + " calls");
      } else {
        return {chosen_, calls_since_ % drift_every == 0};
      }
    }
    return {current_, true};
  }
  /// The candidate the next call would run, without counting a call.
  [[nodiscard]] size_t running() const noexcept { return settled_ ? chosen_ : current_; }
  /// The candidate whose plan is worth keeping beside the running one: the
  /// fastest measured so far (or the settled choice).
  [[nodiscard]] size_t leader() const noexcept { return chosen_; }

  /// A timed call's seconds, the slowest rank's (the same on every rank).
  void record(double seconds) {
    if (settled_) {
      if (seconds > settled_s_ * drift_bound || seconds * drift_bound < settled_s_) {
        char t[96];
        std::snprintf(t, sizeof t, "a call took %.3f ms against %.3f ms", seconds * 1e3, settled_s_ * 1e3);
        restart(std::string("re-measured: ") + t);
      }
      return;
    }
    ++version_;
    double& best = candidates_[current_].measured_s;
    if (best < 0 || seconds < best) best = seconds;
    if (++round_ < rounds_) return;
    if (candidates_[chosen_].measured_s < 0 || best < candidates_[chosen_].measured_s) chosen_ = current_;
    round_ = 0;
    advance();
  }

  /// A candidate whose plan could not be built (agreed on every rank): never chosen.
  void skip(size_t i) {
    ++version_;
    candidates_[i].measured_s = std::numeric_limits<double>::infinity();
    if (!settled_ && i == current_) {
      round_ = 0;
      advance();
    }
  }

  /// Settles on candidate i with its time, taken from an earlier job's
  /// calibration file (`origin`); later drift checks and re-checks apply.
  void settle_on(size_t i, double seconds, const std::string& origin) {
    candidates_[i].measured_s = seconds;
    chosen_ = i;
    settle("saved by an earlier job in " + origin);
  }

  [[nodiscard]] bool settled() const noexcept { return settled_; }
  /// The settled choice (or the leader while measuring).
  [[nodiscard]] const candidate& chosen() const { return candidates_[chosen_]; }
  [[nodiscard]] const std::vector<candidate>& candidates() const noexcept { return candidates_; }
  [[nodiscard]] const std::string& key() const noexcept { return key_; }
  [[nodiscard]] const std::string& call() const noexcept { return call_; }
  /// How the settled times were found, e.g. "timed on 2 calls each".
  [[nodiscard]] const std::string& evidence() const noexcept { return evidence_; }
  /// Why the candidates are (or were last) measured.
  [[nodiscard]] const std::string& reason() const noexcept { return reason_; }
  /// Times the candidates were measured (1 after the first calls).
  [[nodiscard]] int measurements() const noexcept { return measurements_; }
  /// Changes whenever a time is recorded or the phase changes (not on
  /// untimed calls): describing the choice again is needed only then.
  [[nodiscard]] int64_t version() const noexcept { return version_; }
  /// True once per settling: the caller saves the choice, then clears it.
  bool take_news() noexcept { return std::exchange(news_, false); }

 private:
  void restart(std::string why) {
    ++version_;
    reason_ = std::move(why);
    for (candidate& c : candidates_)
      if (c.measured_s < std::numeric_limits<double>::infinity()) c.measured_s = -1;
    settled_ = false;
    current_ = 0, round_ = 0, calls_since_ = 0;
    ++measurements_;
    while (current_ < candidates_.size() && candidates_[current_].measured_s >= 0) ++current_;  // skipped ones
    chosen_ = current_ < candidates_.size() ? current_ : 0;
    if (current_ == candidates_.size()) settle("no candidate could be built");
  }
  void advance() {
    ++current_;
    while (current_ < candidates_.size() && candidates_[current_].measured_s >= 0) ++current_;
    if (current_ == candidates_.size())
      settle("timed on " + std::to_string(rounds_) + (rounds_ == 1 ? " call" : " calls") + " each (" + reason_ + ")");
  }
  void settle(std::string evidence) {
    ++version_;
    settled_ = true, news_ = true;
    evidence_ = std::move(evidence);
    settled_s_ = candidates_[chosen_].measured_s;
    calls_since_ = 0;
  }

  std::vector<candidate> candidates_;
  int64_t recheck_;
  std::string key_, call_;
  int rounds_;
  bool settled_ = false, news_ = false;
  size_t current_ = 0, chosen_ = 0;
  int round_ = 0, measurements_ = 0;
  int64_t calls_since_ = 0, version_ = 0;
  double settled_s_ = 0;
  std::string evidence_, reason_;
};

/// A timed call of a measured choice: its seconds on this rank (< 0: none
/// pending), until the ranks agree on the slowest rank's.
struct timed_call {
  std::shared_ptr<measured_choice> choice;
  double seconds = -1;
};

}  // namespace overlap::detail
