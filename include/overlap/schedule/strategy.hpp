#pragma once
/// @file
/// What an op may run: its strategy (bulk, a ring, ...) and its algorithm
/// (which data travels). Options of both ops name them (ops/options.hpp); a
/// schedule (schedule.hpp) holds the ones chosen.

#include <array>

#include "overlap/core/enum_names.hpp"

namespace overlap {

/// How an op is carried out.
enum class strategy {
  bulk,  ///< one blocking collective and one GEMM (the baseline)
  ring,  ///< decomposed into ring steps, transfers overlapped with partial products
  /// as ring, with half of every transfer going each way round the ring, so
  /// both directions of every link carry data (for networks whose links are
  /// point to point, like a ring or torus). Any rank count; at 2 ranks it runs
  /// the ring schedule (a one-way ring already uses both directions there).
  bidirectional,
  /// the library chooses: the cost model's fastest candidate, or bulk when all
  /// ranks share one node and no calibration is loaded (docs/design.md,
  /// "Choosing a schedule")
  automatic,
  /// two levels, for groups spanning several nodes of several ranks each
  /// (equal counts): each shard crosses the network once per node, on the
  /// lane of the ranks with its local index, while each node's ranks pass
  /// it on over shared memory (docs/design.md, "The hierarchical schedule").
  /// matmul_reduce_scatter runs it backwards: partial sums go round each node
  /// and cross to the next node once per node. Where the ranks are not on
  /// several such nodes both ops run their ring. Never chosen by automatic.
  hierarchical,
  /// the all-to-all ops' decomposition (all_to_all_matmul,
  /// matmul_all_to_all): 1 + R / 2 steps, one distance s each (rank p
  /// sends to p + s and p - s and receives from both, so both directions of
  /// every link carry data at every step), the blocks of one distance
  /// computed while the next distance's travel. The matmul ops and ring attention have no such plan and
  /// reject it.
  pairwise,
};

/// Which data an op moves between the ranks (the result and its
/// distribution are the same either way).
enum class algorithm {
  /// the library chooses (see strategy::automatic and docs/design.md,
  /// "Choosing a schedule")
  automatic,
  /// the data the op's name says: all_gather_matmul gathers the sharded
  /// operand, matmul_reduce_scatter reduces and scatters the partial products
  named,
  /// the other operands travel instead: all_gather_matmul gathers (or
  /// exchanges) the other operand and sends the output blocks (or partial
  /// sums) to their owners; matmul_reduce_scatter exchanges the input blocks
  /// each rank needs for its own output. Moves less than `named` for thin
  /// products (all-gather: K*N + M*N instead of M*K for lhs_rows). Runs as
  /// non-blocking collectives and point-to-point blocks, this rank's own
  /// product computed while the inputs move and every output block sent as
  /// soon as it is computed; it is not a ring (strategy bulk or automatic;
  /// ring and bidirectional are rejected), and not with all_gather_matmul's
  /// gathered_out, which needs the sharded operand gathered anyway (the plan
  /// runs `named` there).
  others,
};

/// The names of strategy's values, as the environment, messages and JSON spell them.
template <>
struct enum_names<strategy> {
  /// Every value with its name.
  static constexpr std::array<enum_entry<strategy>, 6> entries{{{strategy::bulk, "bulk"},
                                                                {strategy::ring, "ring"},
                                                                {strategy::bidirectional, "bidirectional"},
                                                                {strategy::automatic, "automatic"},
                                                                {strategy::hierarchical, "hierarchical"},
                                                                {strategy::pairwise, "pairwise"}}};
};
/// The names of algorithm's values, as the environment, messages and JSON spell them.
template <>
struct enum_names<algorithm> {
  /// Every value with its name.
  static constexpr std::array<enum_entry<algorithm>, 3> entries{
      {{algorithm::automatic, "automatic"}, {algorithm::named, "named"}, {algorithm::others, "others"}}};
};
}  // namespace overlap
