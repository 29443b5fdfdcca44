#pragma once
/// @file
/// Options of the ops. Every field must agree across the ranks of a call;
/// a disagreement raises std::invalid_argument on every rank.

#include <array>

#include "overlap/enum_names.hpp"
#include "overlap/epilogue.hpp"
#include "overlap/matrix.hpp"

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

/// Which operand of all_gather_matmul is sharded, and along which dimension.
enum class gathered {
  lhs_rows,  ///< a: this rank's rows of A (M_r x K), b: K x N_loc, c = AG_rows(A) @ b (M x N_loc)
  lhs_cols,  ///< a: M x K_r, b: K x N_loc (all K rows), c = AG_cols(A) @ b (M x N_loc)
  rhs_rows,  ///< a: M_loc x K (all K cols), b: K_r x N, c = a @ AG_rows(B) (M_loc x N)
  rhs_cols,  ///< a: M_loc x K, b: K x N_r, c = a @ AG_cols(B) (M_loc x N)
};

template <>
struct enum_names<strategy> {
  static constexpr std::array<enum_entry<strategy>, 5> entries{{{strategy::bulk, "bulk"},
                                                                {strategy::ring, "ring"},
                                                                {strategy::bidirectional, "bidirectional"},
                                                                {strategy::automatic, "automatic"},
                                                                {strategy::hierarchical, "hierarchical"}}};
};
template <>
struct enum_names<algorithm> {
  static constexpr std::array<enum_entry<algorithm>, 3> entries{
      {{algorithm::automatic, "automatic"}, {algorithm::named, "named"}, {algorithm::others, "others"}}};
};
template <>
struct enum_names<gathered> {
  static constexpr std::array<enum_entry<gathered>, 4> entries{{{gathered::lhs_rows, "lhs_rows"},
                                                                {gathered::lhs_cols, "lhs_cols"},
                                                                {gathered::rhs_rows, "rhs_rows"},
                                                                {gathered::rhs_cols, "rhs_cols"}}};
};

/// How matmul_reduce_scatter scatters the reduced product.
enum class scattered {
  rows,  ///< c is this rank's rows of sum_r P_r (M_r x N)
  cols,  ///< c is this rank's columns of sum_r P_r (M x N_r)
};

template <>
struct enum_names<scattered> {
  static constexpr std::array<enum_entry<scattered>, 2> entries{{{scattered::rows, "rows"}, {scattered::cols, "cols"}}};
};

/// A strided batch: `count` independent products of the same shapes and
/// options in one call. The views describe member 0; member i reads
/// a.data + i * a and b.data + i * b and writes c.data + i * c (and
/// gathered_out.data + i * out), strides in elements. An input's stride may
/// be 0: every member reads the same matrix (a weight shared by all heads).
/// The outputs' members must not overlap each other or any input member.
/// The bias, when given, is shared by every member.
///
/// The ring schedules move one message per step carrying every member's
/// piece, and compute the members' pieces one after the other while the next
/// step's message travels; bulk and algorithm::others run their collectives
/// member by member. count must agree across ranks; strides are each rank's
/// own.
struct batch {
  int64_t count = 1;
  int64_t a = 0, b = 0, c = 0;
  int64_t out = 0;  ///< all_gather_matmul's gathered_out
};

/// Options of all_gather_matmul.
///
/// transpose_a / transpose_b: the view is stored transposed; every shape rule
/// is about the logical operand op(a) = a^T. The backend reads it transposed
/// (no copy). gathered_out then holds the gathered operand in its stored
/// orientation (K x M for lhs_* with transpose_a).
struct ag_options {
  overlap::gathered gathered = overlap::gathered::lhs_rows;
  overlap::strategy strategy = overlap::strategy::automatic;
  overlap::algorithm algorithm = overlap::algorithm::automatic;
  bool transpose_a = false;
  bool transpose_b = false;
  overlap::epilogue epilogue;
  /// C += the op's result instead of C = (the epilogue included: C = C +
  /// act(op(a) @ op(b) + bias)), e.g. weight gradients summed over
  /// micro-batches; C's contents are read. Costs one copy of this rank's C
  /// and one addition pass over it per call.
  bool accumulate = false;
  /// Several products in one call (see overlap::batch); 1 by default.
  overlap::batch batch;
};

/// Options of matmul_reduce_scatter (transposes as in ag_options).
struct rs_options {
  overlap::scattered scattered = overlap::scattered::rows;
  overlap::strategy strategy = overlap::strategy::automatic;
  overlap::algorithm algorithm = overlap::algorithm::automatic;
  bool transpose_a = false;
  bool transpose_b = false;
  overlap::epilogue epilogue;
  /// bfloat16 only, ring only: send the travelling accumulators in bf16
  /// instead of fp32. Halves the traffic; every hop rounds the partial sum to
  /// bf16 (8 significant bits), so the error grows with the rank count: about
  /// R * 2^-8 of sum |a_k b_k| instead of one final rounding. The bulk
  /// strategy always reduces in fp32 (MPI has no bf16 sum).
  bool bf16_transfers = false;
  /// C += the op's result (see ag_options::accumulate).
  bool accumulate = false;
  /// Several products in one call (see overlap::batch; `out` is not used).
  overlap::batch batch;
};

}  // namespace overlap
