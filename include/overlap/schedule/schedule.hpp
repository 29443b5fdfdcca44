#pragma once
/// @file
/// The schedule of a call as a plain value: what runs (strategy, algorithm,
/// lanes, chunks) and, when the library chose it, every candidate it
/// compared with the cost model's predicted time and, where it measured
/// them (OVERLAP_AUTOMATIC=measured), their measured times. A plan holds one;
/// all_gather_matmul_schedule() and matmul_reduce_scatter_schedule() return
/// it, OVERLAP_VERBOSE=1 prints it, and a caller forces one through the
/// options (strategy, algorithm) and the config (chunk counts).

#include <cstdio>
#include <string>
#include <vector>

#include "overlap/schedule/strategy.hpp"

namespace overlap {

/// One way to run a call, and what the cost model predicts it takes.
struct candidate {
  overlap::strategy strategy = overlap::strategy::bulk;      ///< never automatic
  overlap::algorithm algorithm = overlap::algorithm::named;  ///< never automatic
  int chunks = 0;           ///< ring steps per shard and lane (0: bulk); others: pieces gathered
  double predicted_s = -1;  ///< seconds on the slowest rank; < 0: not predicted
  /// Seconds on the slowest rank, the fastest of its timed calls; < 0: not
  /// measured (only the model's first candidates are: schedule::by_measurement).
  double measured_s = -1;

  /// Equal when they run the same way (times aside).
  [[nodiscard]] bool same_as(const candidate& o) const {
    return strategy == o.strategy && algorithm == o.algorithm && chunks == o.chunks;
  }
};

/// What a plan runs. Never automatic: automatic requests are resolved.
struct schedule {
  overlap::strategy strategy = overlap::strategy::bulk;      ///< what runs
  overlap::algorithm algorithm = overlap::algorithm::named;  ///< which data travels
  int lanes = 1;                                             ///< 2: bidirectional
  int chunks = 0;  ///< ring steps per shard and lane (0: bulk); others: pieces of the gathered operand
  /// The cost model chose among `candidates` (the call asked for automatic
  /// and the context has a model: see docs/design.md, "Choosing a schedule").
  bool by_model = false;
  /// The fastest of the candidates the model ranked first, as the ranks
  /// timed them on the calls they ran (OVERLAP_AUTOMATIC=measured, the
  /// default; docs/design.md, "Measured choice"); by_model holds too.
  bool by_measurement = false;
  /// With by_measurement: where the times come from ("timed on 2 calls each",
  /// or the calibration file that an earlier job saved them to).
  std::string evidence;
  double predicted_s = -1;            ///< the model's prediction for this schedule (< 0: none)
  std::vector<candidate> candidates;  ///< every schedule the model priced (by_model), in the order considered

  /// Equal when they run the same way (predictions aside).
  [[nodiscard]] bool same_as(const schedule& o) const {
    return strategy == o.strategy && algorithm == o.algorithm && lanes == o.lanes && chunks == o.chunks;
  }
};

/// "ring, 3 chunks" / "bulk, others".
[[nodiscard]] inline std::string to_string(const candidate& c) {
  std::string s = to_string(c.strategy);
  if (c.algorithm == algorithm::others) s += " moving the other operands";
  if (c.chunks > 0) s += ", " + std::to_string(c.chunks) + (c.chunks == 1 ? " chunk" : " chunks");
  return s;
}

/// A schedule's lanes: two for the bidirectional and hierarchical rings.
[[nodiscard]] inline int lanes_of(overlap::strategy s) {
  return s == strategy::bidirectional || s == strategy::hierarchical ? 2 : 1;
}

/// The schedule that runs a candidate (its predictions aside).
[[nodiscard]] inline schedule schedule_of(const candidate& c) {
  schedule s;
  s.strategy = c.strategy, s.algorithm = c.algorithm, s.chunks = c.chunks, s.lanes = lanes_of(c.strategy);
  return s;
}

/// The schedule in one line, with the model's table when it chose, and the
/// measured times when it was measured.
[[nodiscard]] inline std::string to_string(const schedule& s) {
  std::string out = to_string(candidate{s.strategy, s.algorithm, s.chunks, s.predicted_s});
  if (!s.by_model) return out;
  auto ms = [](double x) {
    char t[32];
    std::snprintf(t, sizeof t, "%.3f ms", x * 1e3);
    return std::string(t);
  };
  if (s.by_measurement) {
    out += " (measured choice, " + s.evidence + "; slowest rank";
    for (const candidate& c : s.candidates)
      if (c.measured_s >= 0) out += " | " + to_string(c) + ": " + ms(c.measured_s) + ", predicted " + ms(c.predicted_s);
    return out + ")";
  }
  out += " (cost model's choice; predicted";
  for (const candidate& c : s.candidates) out += " | " + to_string(c) + ": " + ms(c.predicted_s);
  return out + ")";
}

}  // namespace overlap
