#pragma once
/// @file
/// Choosing a call's schedule: what the caller forced (options and config)
/// is taken as asked; strategy::automatic asks the cost model to compare the
/// candidates (bulk, ring, bidirectional, moving the other operands) and
/// takes the simplest one predicted within 3% (the model's error band) of
/// the fastest: bulk before ring before bidirectional before the other
/// operands in fewer pieces before more. Runs on every rank with the same
/// inputs (the exchanged sizes and one calibration), so all ranks choose
/// alike.

#include <algorithm>
#include <exception>
#include <limits>
#include <optional>
#include <vector>

#include "overlap/calibrate/measure.hpp"
#include "overlap/runtime/context.hpp"
#include "overlap/schedule/chunks.hpp"
#include "overlap/schedule/model.hpp"
#include "overlap/schedule/schedule.hpp"

namespace overlap::detail {

/// What a call asked for.
struct schedule_request {
  overlap::strategy strategy = overlap::strategy::automatic;
  overlap::algorithm algorithm = overlap::algorithm::automatic;
  bool others_allowed = true;   ///< false: the call wants the gathered operand (gathered_out)
  bool hierarchical = false;    ///< the op has a hierarchical schedule (else it runs ring)
  bool bidirectional = true;    ///< the op has a two-lane ring (else it runs ring)
  int hierarchical_chunks = 1;  ///< pieces per shard of the hierarchical schedule
  /// Pieces the other-operands algorithm may gather its operand in, thinnest
  /// last (empty: it gathers none); with more than one the cost model picks,
  /// where the context has a calibration, else `others_rule` is taken.
  std::vector<int> others_pieces;
  int others_rule = 0;
};

/// A candidate must be predicted this much faster than every simpler one to
/// be taken (the model's error band).
inline constexpr double model_margin = 1.03;

/// The first of `options` (simplest first: bulk, ring, bidirectional, the
/// other operands in fewer pieces before more) whose predicted time is within
/// model_margin of the fastest's. Two lanes starve more easily than one
/// where ranks share cores and links queue deeply: where the model saw ring
/// and bidirectional alike, bidirectional ran slower on the emulated 4-node
/// ring (docs/layer.md).
inline size_t simplest_within_margin(const std::vector<schedule>& options) {
  double fastest = options.front().predicted_s;
  for (const schedule& s : options) fastest = std::min(fastest, s.predicted_s);
  size_t i = 0;
  while (options[i].predicted_s > fastest * model_margin) ++i;
  return i;
}

/// The cost model's choice among priced options (predicted_s set, simplest
/// first): the simplest within the margin, carrying every candidate's
/// prediction.
inline schedule model_choice(const std::vector<schedule>& options) {
  std::vector<candidate> table;
  table.reserve(options.size());
  for (const schedule& s : options) table.push_back({s.strategy, s.algorithm, s.chunks, s.predicted_s});
  schedule chosen = options[simplest_within_margin(options)];
  chosen.by_model = true;
  chosen.candidates = std::move(table);
  return chosen;
}

/// Moving the other operands, gathered in `pieces`.
inline schedule others_schedule(int pieces) {
  schedule x;
  x.strategy = strategy::bulk, x.algorithm = algorithm::others, x.chunks = pieces;
  return x;
}

/// The other-operands schedules a request allows, one per piece count.
inline std::vector<schedule> others_options(const schedule_request& req) {
  std::vector<schedule> out;
  for (int pieces : req.others_pieces) out.push_back(others_schedule(pieces));
  if (out.empty()) out.push_back(others_schedule(req.others_rule));
  return out;
}

/// Collective: each option's predicted seconds (predicted_s), the slowest
/// rank's: every rank prices the plan it would run (work_of(schedule):
/// the plan built dry, listed for the model), and the ranks take the
/// maximum of each, so that all choose alike. An option whose dry build
/// fails on a rank is priced at infinity everywhere (never chosen; its real
/// build would fail, agreed, too).
template <class WorkOf>
void predict_slowest(context& ctx, const link_rates& l, const gemm_rates& g, std::vector<schedule>& options,
                     WorkOf&& work_of) {
  std::vector<double> seconds;
  seconds.reserve(options.size());
  for (const schedule& s : options) {
    double x = std::numeric_limits<double>::infinity();
    try {
      x = predict(l, g, ctx.size(), work_of(s));
    } catch (const std::exception&) {
    }
    seconds.push_back(x);
  }
  slowest_everywhere(ctx, seconds, "choosing a schedule");
  for (size_t i = 0; i < options.size(); ++i) options[i].predicted_s = seconds[i];
}

/// A forced algorithm::others: the piece count the model predicts fastest
/// where the context holds a calibration of its links and element type
/// (nothing is measured for it), else the rule's. Collective.
template <class WorkOf>
schedule forced_others(context& ctx, const schedule_request& req, dtype t, WorkOf&& work_of) {
  std::vector<schedule> options = others_options(req);
  const std::optional<calibration>& cal = ctx.calibration();
  if (options.size() < 2 || ctx.size() < 2 || !cal || !cal->has(ctx.links()) || !cal->has(t))
    return others_schedule(req.others_rule);
  predict_slowest(ctx, cal->links.at(ctx.links()), cal->gemm.at(t), options, work_of);
  schedule best = *std::min_element(options.begin(), options.end(),
                                    [](const schedule& x, const schedule& y) { return x.predicted_s < y.predicted_s; });
  best.predicted_s = -1;  // not the model's choice of schedule, only of its pieces
  return best;
}

/// What the context's shape allows, decided here once for every op.
struct allowed_strategies {
  /// Two lanes need two distinct neighbours: 3 or more ranks (at 2 the
  /// one-way ring already carries data both ways on the only link), and an
  /// op that has a two-lane ring.
  bool bidirectional = false;
  /// Two or more nodes of two or more ranks each (context::two_levels), and
  /// an op that has a hierarchical schedule.
  bool hierarchical = false;
  /// Nothing travels on one rank; on one node without a calibration,
  /// shared-memory copies take the cores that compute (docs/results.md
  /// measures nothing to hide there): automatic is bulk.
  bool automatic_is_bulk = false;
};
inline allowed_strategies allowed(const context& ctx, const schedule_request& req) {
  allowed_strategies a;
  a.bidirectional = req.bidirectional && ctx.size() >= 3;
  a.hierarchical = req.hierarchical && ctx.two_levels();
  a.automatic_is_bulk = ctx.size() == 1 || (ctx.one_node() && !ctx.calibration());
  return a;
}

/// The strategy a forced request runs: what the context does not allow
/// runs as the ring.
inline overlap::strategy runnable(overlap::strategy asked, const allowed_strategies& can) {
  if ((asked == strategy::bidirectional && !can.bidirectional) ||
      (asked == strategy::hierarchical && !can.hierarchical))
    return strategy::ring;
  return asked;
}

/// Collective on a plan miss (every rank runs it with the same inputs).
/// chunks_for(lanes): the chunk count of a ring with that many lanes;
/// work_of(schedule): the plan of a candidate on this rank, as the model
/// prices it.
template <class ChunksFor, class WorkOf>
schedule choose_schedule(context& ctx, const schedule_request& req, dtype t, ChunksFor&& chunks_for, WorkOf&& work_of) {
  auto fixed = [&](overlap::strategy s, overlap::algorithm a) {
    schedule x;
    x.strategy = s, x.algorithm = a;
    x.lanes = lanes_of(s);
    x.chunks = s == strategy::bulk ? 0 : chunks_for(x.lanes);
    return x;
  };
  if (req.algorithm == algorithm::others && req.others_allowed) return forced_others(ctx, req, t, work_of);
  const allowed_strategies can = allowed(ctx, req);
  if (req.strategy != strategy::automatic) {
    const overlap::strategy s = runnable(req.strategy, can);
    if (s != strategy::hierarchical) return fixed(s, algorithm::named);
    schedule x;  // lane 0 between nodes, lane 1 inside them
    x.strategy = strategy::hierarchical, x.algorithm = algorithm::named, x.lanes = 2;
    x.chunks = req.hierarchical_chunks;
    return x;
  }
  if (can.automatic_is_bulk) return fixed(strategy::bulk, algorithm::named);
  calibration& cal = ctx.calibration_to_complete();
  measure_missing(ctx, cal, ctx.links(), t);
  const link_rates& l = cal.links.at(ctx.links());
  const gemm_rates& g = cal.gemm.at(t);

  std::vector<schedule> options{fixed(strategy::bulk, algorithm::named), fixed(strategy::ring, algorithm::named)};
  if (can.bidirectional) options.push_back(fixed(strategy::bidirectional, algorithm::named));
  if (req.algorithm == algorithm::automatic && req.others_allowed)
    for (const schedule& s : others_options(req)) options.push_back(s);
  predict_slowest(ctx, l, g, options, work_of);
  return model_choice(options);
}

}  // namespace overlap::detail
