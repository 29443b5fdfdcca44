#pragma once
/// @file
/// matmul_all_reduce: partial products summed over the ranks, the whole sum
/// on every rank. Decomposed into groups of C's rows (or columns): each
/// group is reduce-scattered on a ring while its pieces are computed, then
/// all-gathered while the next group's ring runs.

#include "overlap/core/flavour.hpp"
#include "overlap/core/matrix.hpp"
#include "overlap/ops/entry_points.hpp"
#include "overlap/ops/options.hpp"
#include "overlap/ops/pending.hpp"
#include "overlap/runtime/context.hpp"
#include "overlap/schedule/schedule.hpp"

namespace overlap {
namespace detail {

template <class T>
struct ar_args {
  matrix_view<const T> a, b;
  matrix_view<T> c;
};

/// The op's traits type, defined in matmul_all_reduce-inl.hpp.
template <class T>
struct ar_op;

}  // namespace detail

/// c = the sum over ranks of op(a) @ op(b), the same M x N matrix on every
/// rank, where op(a) is M x K_r and op(b) is K_r x N (the contracting
/// dimension is sharded; K_r may differ per rank, including zero): the
/// row-parallel linear layer without sequence parallelism.
///
/// Collective over ctx: options, M and N must agree across ranks, and c is
/// M x N on every rank. The ring strategies split C into groups of rows
/// (ar_options::reduced = rows) or columns; each group is reduce-scattered
/// by a ring of matmul_reduce_scatter, its pieces' products computed while
/// the partial sums travel, and then all-gathered while the next group's
/// ring runs. bulk is one GEMM and MPI_Allreduce. The epilogue (bias,
/// activation) is applied once, after the sum; the bias has N values.
/// Errors as for all_gather_matmul.
template <class T>
void matmul_all_reduce(context& ctx, matrix_view<const T> a, matrix_view<const T> b, matrix_view<T> c,
                       const ar_options& opt = {}) {
  static_assert(is_element_v<T>, "overlap supports float, double and bfloat16");
  detail::op_call<detail::ar_op<T>>(ctx, detail::ar_args<T>{a, b, c}, opt);
}

/// matmul_all_reduce, started: as start_all_gather_matmul (checks,
/// agreement and plan here, the rest on the context's worker thread, c
/// complete after wait(); one op in flight per context).
template <class T>
[[nodiscard]] pending start_matmul_all_reduce(context& ctx, matrix_view<const T> a, matrix_view<const T> b,
                                              matrix_view<T> c, const ar_options& opt = {}) {
  static_assert(is_element_v<T>, "overlap supports float, double and bfloat16");
  return detail::op_start<detail::ar_op<T>>(ctx, detail::ar_args<T>{a, b, c}, opt);
}

/// The schedule matmul_all_reduce runs for these arguments (the same on
/// every rank; for the ring strategies `chunks` is the number of groups):
/// builds and caches the plan like a call, without computing. Collective,
/// with the same rules as the call.
template <class T>
schedule matmul_all_reduce_schedule(context& ctx, matrix_view<const T> a, matrix_view<const T> b, matrix_view<T> c,
                                    const ar_options& opt = {}) {
  static_assert(is_element_v<T>, "overlap supports float, double and bfloat16");
  return detail::op_schedule<detail::ar_op<T>>(ctx, detail::ar_args<T>{a, b, c}, opt);
}

}  // namespace overlap

// Header-only, the implementation comes with the declarations (flavour.hpp).
#ifndef OVERLAP_COMPILED
#include "overlap/ops/matmul_all_reduce-inl.hpp"
#endif
