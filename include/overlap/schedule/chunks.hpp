#pragma once
/// @file
/// How a ring plan chooses its chunks per shard (docs/design.md, "Chunks").

#include <algorithm>
#include <cstdint>

#include "overlap/schedule/strategy.hpp"

namespace overlap::detail {

/// The (min_chunks, preferred) of each op.
struct chunk_rule {
  int min_chunks, preferred;
};
inline constexpr chunk_rule ag_chunk_rule{1, 2}, rs_chunk_rule{2, 3};

/// The floors of plan_chunks (why each, in its comment; the measurements in
/// docs/design.md, "Chunks", and docs/results.md, "Piece rate against piece
/// rows").
/// Pieces a ring aims at in all (ranks x lanes x chunks): about one piece's
/// product is exposed, so 12 leave about 1/12 of the work unhidden.
inline constexpr int ring_pieces_target = 12;
/// Above an op's preferred count: a piece's message stays at least this big
/// (per-message latency; on TCP this size still streams at the link rate)
/// and its product at least this many rows or columns wide.
inline constexpr int64_t soft_floor_bytes = int64_t{512} << 10;
inline constexpr int64_t soft_floor_units = 128;
/// Down to an op's minimum count: the floors below which a piece costs more
/// than it hides (a GEMM's rate falls off, messages turn latency-bound).
inline constexpr int64_t hard_floor_bytes = int64_t{128} << 10;
inline constexpr int64_t hard_floor_units = 32;

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
/// 1 / (ranks * lanes * chunks) of the work, so the plan aims at
/// ring_pieces_target pieces or more in all. It starts from `preferred` chunks or more, which give the
/// engine's window two messages in flight per lane (all-gather: 2,
/// reduce-scatter: 3; with one in flight the link drains between steps: a
/// bidirectional reduce-scatter on the emulated 4-node ring ran 2.1x slower
/// with 2 chunks than with 3, docs/design.md "Chunks"). Then, in two stages:
///   - above `preferred`, fewer chunks while a piece's message would fall
///     below soft_floor_bytes or its product below max(soft_floor_units,
///     knee_units) wide along the split dimension;
///   - below `preferred`, down to min_chunks, only while a piece would fall
///     below the hard floors: hard_floor_bytes, or max(hard_floor_units,
///     knee_units) wide.
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
  int c = std::max({r.rule.min_chunks, r.rule.preferred, (ring_pieces_target + pieces - 1) / pieces});
  while (c > r.rule.preferred && below(c, soft_floor_units, soft_floor_bytes)) --c;
  while (c > r.rule.min_chunks && below(c, hard_floor_units, hard_floor_bytes)) --c;
  return c;
}

}  // namespace overlap::detail
