#pragma once
/// @file
/// Options of the ops. Every field must agree across the ranks of a call;
/// a disagreement raises std::invalid_argument on every rank.

#include <array>

#include "overlap/core/enum_names.hpp"
#include "overlap/core/epilogue.hpp"
#include "overlap/core/matrix.hpp"
#include "overlap/schedule/strategy.hpp"

namespace overlap {

/// Which operand of all_gather_matmul is sharded, and along which dimension.
enum class gathered {
  lhs_rows,  ///< a: this rank's rows of A (M_r x K), b: K x N_loc, c = AG_rows(A) @ b (M x N_loc)
  lhs_cols,  ///< a: M x K_r, b: K x N_loc (all K rows), c = AG_cols(A) @ b (M x N_loc)
  rhs_rows,  ///< a: M_loc x K (all K cols), b: K_r x N, c = a @ AG_rows(B) (M_loc x N)
  rhs_cols,  ///< a: M_loc x K, b: K x N_r, c = a @ AG_cols(B) (M_loc x N)
};

/// The names of gathered's values, as the environment, messages and JSON spell them.
template <>
struct enum_names<gathered> {
  /// Every value with its name.
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

/// The names of scattered's values, as the environment, messages and JSON spell them.
template <>
struct enum_names<scattered> {
  /// Every value with its name.
  static constexpr std::array<enum_entry<scattered>, 2> entries{{{scattered::rows, "rows"}, {scattered::cols, "cols"}}};
};

/// How matmul_all_reduce splits the sum into the blocks that travel while
/// it is reduced and then gathered: rows or columns of C. Either way every
/// rank ends with all of C.
enum class reduced {
  rows,  ///< blocks of C's rows (M split over the ranks)
  cols,  ///< blocks of C's columns (N split over the ranks): for C with few rows
};

/// The names of reduced's values, as the environment, messages and JSON spell them.
template <>
struct enum_names<reduced> {
  /// Every value with its name.
  static constexpr std::array<enum_entry<reduced>, 2> entries{{{reduced::rows, "rows"}, {reduced::cols, "cols"}}};
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
  int64_t count = 1;  ///< products in the call (>= 1; must agree across ranks)
  ///@{
  /// Elements from one member's a, b and c to the next's (0: shared by every member).
  int64_t a = 0, b = 0, c = 0;
  ///@}
  int64_t out = 0;  ///< all_gather_matmul's gathered_out
};

/// Options of all_gather_matmul.
///
/// transpose_a / transpose_b: the view is stored transposed; every shape rule
/// is about the logical operand op(a) = a^T. The backend reads it transposed
/// (no copy). gathered_out then holds the gathered operand in its stored
/// orientation (K x M for lhs_* with transpose_a).
struct ag_options {
  overlap::gathered gathered = overlap::gathered::lhs_rows;      ///< which operand is sharded, and how; must agree
  overlap::strategy strategy = overlap::strategy::automatic;     ///< the schedule; must agree
  overlap::algorithm algorithm = overlap::algorithm::automatic;  ///< which data travels; must agree
  bool transpose_a = false;                                      ///< a is stored transposed; must agree
  bool transpose_b = false;                                      ///< b is stored transposed; must agree
  overlap::epilogue epilogue;                                    ///< bias and activation, after the product
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
  overlap::scattered scattered = overlap::scattered::rows;       ///< how the sum is split over the ranks; must agree
  overlap::strategy strategy = overlap::strategy::automatic;     ///< the schedule; must agree
  overlap::algorithm algorithm = overlap::algorithm::automatic;  ///< which data travels; must agree
  bool transpose_a = false;                                      ///< a is stored transposed; must agree
  bool transpose_b = false;                                      ///< b is stored transposed; must agree
  overlap::epilogue epilogue;                                    ///< bias and activation, after the sum
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

/// Options of matmul_all_reduce (transposes as in ag_options). algorithm
/// may be automatic or named: the op has no other-operands algorithm.
struct ar_options {
  overlap::reduced reduced = overlap::reduced::rows;             ///< how the sum is split while it travels; must agree
  overlap::strategy strategy = overlap::strategy::automatic;     ///< the schedule; must agree
  overlap::algorithm algorithm = overlap::algorithm::automatic;  ///< automatic or named; must agree
  bool transpose_a = false;                                      ///< a is stored transposed; must agree
  bool transpose_b = false;                                      ///< b is stored transposed; must agree
  overlap::epilogue epilogue;                                    ///< bias and activation, after the sum
  /// bfloat16 only, rings only: partial sums travel in bf16 (see rs_options::bf16_transfers).
  bool bf16_transfers = false;
  /// C += the op's result (see ag_options::accumulate).
  bool accumulate = false;
  /// Several products in one call (see overlap::batch; `out` is not used).
  overlap::batch batch;
};

/// Options of the all-to-all ops (all_to_all_matmul, matmul_all_to_all).
/// strategy may be bulk (MPI_Alltoallv and the experts' GEMMs one after the
/// other), pairwise (one peer's block computed while the next one's
/// travels) or automatic (the cost model prices both for this call's
/// counts; bulk on one rank, and on one node without a calibration).
struct a2a_options {
  overlap::strategy strategy = overlap::strategy::automatic;  ///< bulk, pairwise or automatic; must agree
  /// w holds each expert's weight transposed (this rank's own layout): w is
  /// E * N x K, expert e's N x K block at rows [e * N, (e + 1) * N), read as
  /// its transpose (the backward pass's product with the forward's weight).
  bool transpose_w = false;
};

}  // namespace overlap
