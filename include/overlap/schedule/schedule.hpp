#pragma once
/// @file
/// The schedule of a call as a plain value: what runs (strategy, algorithm,
/// lanes, chunks) and, when the library chose it, every candidate it
/// compared with the cost model's predicted time. A plan holds one;
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

/// The schedule in one line, with the model's table when it chose.
[[nodiscard]] inline std::string to_string(const schedule& s) {
  std::string out = to_string(candidate{s.strategy, s.algorithm, s.chunks, s.predicted_s});
  if (!s.by_model) return out;
  out += " (cost model's choice; predicted";
  for (const candidate& c : s.candidates) {
    char t[32];
    std::snprintf(t, sizeof t, "%.3f ms", c.predicted_s * 1e3);
    out += std::string(" | ") + to_string(c) + ": " + t;
  }
  return out + ")";
}

}  // namespace overlap
