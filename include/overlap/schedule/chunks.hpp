#pragma once
/// @file
/// How a ring plan resolves the strategy asked for and chooses its chunks
/// per shard (docs/design.md, "Chunks").

#include <algorithm>
#include <cstdint>

#include "overlap/schedule/strategy.hpp"

namespace overlap::detail {

/// The strategy a plan runs for the requested one on R ranks when no cost
/// model decides (schedule/choose.hpp): automatic is bulk when all ranks
/// share one node (shared-memory copies take the cores that compute, so
/// there is nothing to hide) and ring otherwise;
/// bidirectional needs two distinct neighbours (R >= 3), and at R <= 2 the
/// one-way ring already carries data both ways on the only link.
inline overlap::strategy resolve_strategy(overlap::strategy s, int ranks, bool one_node) {
  if (s == strategy::automatic) return one_node ? strategy::bulk : strategy::ring;
  if (s == strategy::bidirectional && ranks <= 2) return strategy::ring;
  return s;
}

/// The (min_chunks, preferred) of each op.
struct chunk_rule {
  int min_chunks, preferred;
};
inline constexpr chunk_rule ag_chunk_rule{1, 2}, rs_chunk_rule{2, 3};

/// What a ring plan's chunk count depends on. Every field must be the same
/// on every rank (global sizes), so that all ranks choose alike.
struct chunk_request {
  int configured = 0;     ///< config.ag_chunks / rs_chunks; 0: the plan chooses
  chunk_rule rule{1, 2};  ///< the op's minimum and preferred counts
  int ranks = 1, lanes = 1;
  int64_t piece_units = 0;     ///< the extent (per lane) that chunks split
  int64_t bytes_per_unit = 0;  ///< message bytes per unit of that extent
  bool one_node = false;       ///< all ranks share one node
  int64_t knee_units = 0;      ///< the largest context::piece_knee over ranks
};

/// Chunks per shard (per lane) a ring plan uses: the configured count, or,
/// when it is 0, the plan's choice. A ring exposes about one piece's product
/// (all-gather: the last; reduce-scatter: the first) that nothing overlaps,
/// 1 / (ranks * lanes * chunks) of the work, so the plan aims at 12 pieces or
/// more in all. It starts from `preferred` chunks or more, which give the
/// engine's window two messages in flight per lane (all-gather: 2,
/// reduce-scatter: 3; with one in flight the link drains between steps: a
/// bidirectional reduce-scatter on the emulated 4-node ring ran 2.1x slower
/// with 2 chunks than with 3, docs/design.md "Chunks"). Then, in two stages:
///   - above `preferred`, fewer chunks while a piece's message would fall
///     below 512 KiB (per-message latency; on TCP this size still streams at
///     the link rate) or its product below max(128, knee_units) wide along
///     the split dimension;
///   - below `preferred`, down to min_chunks, only while a piece would fall
///     below the hard floors: 128 KiB, or max(32, knee_units) wide.
/// knee_units is the largest over ranks of context::piece_knee (below
/// AVX-512 oneDNN's sgemm switches to slower kernels for thinner pieces, 1.7x
/// their rows' cost); the measurements behind the floors are in
/// docs/design.md ("Chunks", "Pieces: shapes from measured rates").
/// min_chunks is 2 for reduce-scatter, whose accumulator of one chunk travels
/// while the next is computed. Inputs must be global sizes (the same on every
/// rank) so that all ranks choose alike. When all ranks share one node, MPI
/// copies through shared memory with the cores that compute: there is
/// nothing to overlap (docs/results.md measures comm only against compute
/// there), so the plan takes min_chunks, the fewest and largest GEMMs.
inline int plan_chunks(const chunk_request& r) {
  if (r.configured > 0) return r.configured;
  if (r.one_node) return r.rule.min_chunks;
  const int pieces = r.ranks * r.lanes;
  auto below = [&](int c, int64_t units, int64_t bytes) {
    return r.piece_units / c < std::max(units, r.knee_units) || r.piece_units / c * r.bytes_per_unit < bytes;
  };
  int c = std::max({r.rule.min_chunks, r.rule.preferred, (12 + pieces - 1) / pieces});
  while (c > r.rule.preferred && below(c, 128, int64_t{512} << 10)) --c;
  while (c > r.rule.min_chunks && below(c, 32, int64_t{128} << 10)) --c;
  return c;
}

}  // namespace overlap::detail
