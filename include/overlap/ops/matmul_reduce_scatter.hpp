#pragma once
/// @file
/// matmul_reduce_scatter: partial products summed over the ranks and
/// scattered, decomposed into ring steps in which the accumulator travels.

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
struct rs_args {
  matrix_view<const T> a, b;
  matrix_view<T> c;
};

/// The op's traits type, defined in matmul_reduce_scatter-inl.hpp.
template <class T>
struct rs_op;

}  // namespace detail

/// c = this rank's shard of sum over ranks of op(a) @ op(b), where op(a) is
/// M x K_r and op(b) is K_r x N (the contracting dimension is sharded; K_r may
/// differ per rank, including zero). scattered = rows: c is M_r x N, the
/// rows of this rank in rank order; cols: c is M x N_r.
///
/// Collective over ctx: options, M and N must agree across ranks and the
/// ranks' c sizes must add up to M (rows) or N (cols). The ring strategy
/// passes accumulators round the ring, adding each partial product with
/// beta = 1, and never forms the full M x N product; bulk is one GEMM and
/// MPI_Reduce_scatter. The epilogue (bias, activation) is applied once, after
/// the last accumulation. Errors as for all_gather_matmul.
template <class T>
void matmul_reduce_scatter(context& ctx, matrix_view<const T> a, matrix_view<const T> b, matrix_view<T> c,
                           const rs_options& opt = {}) {
  static_assert(is_element_v<T>, "overlap supports float, double and bfloat16");
  detail::op_call<detail::rs_op<T>>(ctx, detail::rs_args<T>{a, b, c}, opt);
}

/// matmul_reduce_scatter, started: as start_all_gather_matmul (checks,
/// agreement and plan here, the ring on the context's worker thread, c
/// complete after wait(); one op in flight per context).
template <class T>
[[nodiscard]] pending start_matmul_reduce_scatter(context& ctx, matrix_view<const T> a, matrix_view<const T> b,
                                                  matrix_view<T> c, const rs_options& opt = {}) {
  static_assert(is_element_v<T>, "overlap supports float, double and bfloat16");
  return detail::op_start<detail::rs_op<T>>(ctx, detail::rs_args<T>{a, b, c}, opt);
}

/// The schedule matmul_reduce_scatter runs for these arguments (the same on
/// every rank): builds and caches the plan like a call, without computing.
/// Collective, with the same rules as the call.
template <class T>
schedule matmul_reduce_scatter_schedule(context& ctx, matrix_view<const T> a, matrix_view<const T> b, matrix_view<T> c,
                                        const rs_options& opt = {}) {
  static_assert(is_element_v<T>, "overlap supports float, double and bfloat16");
  return detail::op_schedule<detail::rs_op<T>>(ctx, detail::rs_args<T>{a, b, c}, opt);
}

}  // namespace overlap

// Header-only, the implementation comes with the declarations (flavour.hpp).
#ifndef OVERLAP_COMPILED
#include "overlap/ops/matmul_reduce_scatter-inl.hpp"
#endif
