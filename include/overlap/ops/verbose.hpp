#pragma once
/// @file
/// What verbose plans print (OVERLAP_VERBOSE=1): shard lists, the ring
/// schedule of a plan, the progress policy and the GEMM path.

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "overlap/ops/options.hpp"
#include "overlap/runtime/context.hpp"

namespace overlap::detail {

/// "a, b, c" as a list: how verbose plans print shard sizes.
inline std::string list(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

/// A ring plan's schedule, as verbose plans print it ("" for bulk). Plan:
/// strategy, lanes, n_steps, window, and steps whose first has nr x nc.
template <class Plan>
std::string ring_summary(overlap::strategy asked, const Plan& plan, int chunks, bool chosen, size_t slot_bytes) {
  if (plan.strategy == strategy::bulk || plan.steps.empty()) return "";  // empty: the op's plans hold the steps
  std::string s;
  if (asked != plan.strategy) s += " (" + std::string(to_string(asked)) + " asked)";
  const auto& first = plan.steps.front();
  // The largest piece a kernel computes (hierarchical lane 0 entries only move sums).
  auto area = [](const auto& st) { return st.kernel ? st.nr * st.nc : int64_t{-1}; };
  const auto busiest = std::max_element(plan.steps.begin(), plan.steps.end(),
                                        [&](const auto& x, const auto& y) { return area(x) < area(y); });
  s += ", piece kernel " + busiest->kernel->name() +
       (plan.pack.packer ? " reading b packed once per call (" + std::to_string(plan.pack.packed.size()) + " bytes)"
                         : std::string(""));
  // Under progress none a lane's next send goes out when the one before is
  // expected to complete during the next step (engine::ring_window::ahead).
  const std::string ahead = plan.window.ahead ? ", the next released ahead of a step it would wait through" : "";
  if (plan.strategy == strategy::hierarchical)
    return s + ", lane 0 between nodes, lane 1 inside them, " + std::to_string(plan.n_steps) + " steps of " +
           (chunks == 1 ? std::string("one shard") : "one of " + std::to_string(chunks) + " pieces of a shard") +
           ", receives posted " + std::to_string(plan.window.lead) + " steps ahead" +
           (plan.window.paced ? ", sends paced (one in flight per lane" + ahead + ")" : "") + ", " +
           std::to_string(slot_bytes) + " bytes of slots";
  return s + ", " + std::to_string(plan.lanes) + (plan.lanes == 1 ? " lane, " : " lanes, ") +
         std::to_string(plan.n_steps) + " steps, " + std::to_string(chunks) + " chunks per shard" +
         (plan.lanes == 2 ? " half" : "") + (chosen ? " (plan's choice)" : " (configured)") + ", receives posted " +
         std::to_string(plan.window.lead) + " steps ahead, sends in flight up to " +
         std::to_string(plan.window.send_slack + 1) + " steps" +
         (plan.window.paced ? " (paced: one in flight per lane" + ahead + ")" : "") + ", " +
         std::to_string(slot_bytes) + " bytes of slots, rank 0's first piece " + std::to_string(first.nr) + " x " +
         std::to_string(first.nc);
}

/// Prints a built plan on rank 0 when the config is verbose: the op's own
/// description, its ring schedule, the progress policy and the GEMM path.
inline void log_built_plan(const context& ctx, const std::string& what, const std::string& ring, dtype t) {
  ctx.log_plan(what + ring + ", progress " + describe_progress(ctx.config()) + ", gemm " + ctx.gemm_path(t));
}

}  // namespace overlap::detail
