#pragma once
/// @file
/// all_gather_matmul: a product whose sharded operand would be all-gathered
/// first, decomposed into ring steps that overlap each shard's transfer with
/// the partial product of the shard before it.

#include "overlap/core/flavour.hpp"
#include "overlap/core/matrix.hpp"
#include "overlap/ops/entry_points.hpp"
#include "overlap/ops/options.hpp"
#include "overlap/ops/pending.hpp"
#include "overlap/runtime/context.hpp"
#include "overlap/schedule/schedule.hpp"

namespace overlap {
namespace detail {

/// The call's operands; `out` is the optional gathered by-product (has_out).
template <class T>
struct ag_args {
  matrix_view<const T> a, b;
  matrix_view<T> c, out;
  bool has_out = false;
};

/// The op's traits type, defined in all_gather_matmul-inl.hpp.
template <class T>
struct ag_op;

}  // namespace detail

/// C = op(a) @ op(b) where the operand named by opt.gathered is sharded over
/// the ranks of ctx and all-gathered on the fly (see ag_options / gathered).
///
/// Collective over ctx: every rank calls it with the same options; the
/// dimension that is not sharded must agree across ranks, shards may have any
/// size (including zero), and C's rows or columns follow rank order. Bad input
/// on any rank raises std::invalid_argument on every rank; the context stays
/// usable. The first call with a shape builds and caches a plan (sizes
/// exchanged, schedule, GEMM primitives, buffers); later calls reuse it.
template <class T>
void all_gather_matmul(context& ctx, matrix_view<const T> a, matrix_view<const T> b, matrix_view<T> c,
                       const ag_options& opt = {}) {
  static_assert(is_element_v<T>, "overlap supports float, double and bfloat16");
  detail::op_call<detail::ag_op<T>>(ctx, detail::ag_args<T>{a, b, c, {}, false}, opt);
}

/// As above, and also writes the gathered operand into gathered_out (in its
/// stored orientation: M x K for lhs_*, K x N for rhs_*, transposed when the
/// operand is), received directly into it.
template <class T>
void all_gather_matmul(context& ctx, matrix_view<const T> a, matrix_view<const T> b, matrix_view<T> c,
                       matrix_view<T> gathered_out, const ag_options& opt = {}) {
  static_assert(is_element_v<T>, "overlap supports float, double and bfloat16");
  detail::op_call<detail::ag_op<T>>(ctx, detail::ag_args<T>{a, b, c, gathered_out, true}, opt);
}

/// all_gather_matmul, started: the checks, the agreement and the plan happen
/// here, on the calling thread, with the call's rules (bad input raises
/// std::invalid_argument on every rank, nothing started); the transfers and
/// partial products then run on the context's worker thread while this
/// thread computes something independent, e.g. the weight-gradient GEMM of a
/// backward pass. c (and gathered_out) are complete after wait().
///
/// Collective over ctx (start); wait() is local. One op in flight per
/// context: until wait() returns, every op on ctx (and clear_plans) throws
/// std::logic_error; ops on other contexts and the caller's own MPI calls
/// may run (MPI_THREAD_MULTIPLE is required). a, b, c and the bias must stay
/// valid and c untouched until wait(); do not move or destroy ctx meanwhile.
/// The worker's GEMMs share the cores with what this thread computes.
template <class T>
[[nodiscard]] pending start_all_gather_matmul(context& ctx, matrix_view<const T> a, matrix_view<const T> b,
                                              matrix_view<T> c, const ag_options& opt = {}) {
  static_assert(is_element_v<T>, "overlap supports float, double and bfloat16");
  return detail::op_start<detail::ag_op<T>>(ctx, detail::ag_args<T>{a, b, c, {}, false}, opt);
}
/// As above, with the gathered operand also written into gathered_out.
template <class T>
[[nodiscard]] pending start_all_gather_matmul(context& ctx, matrix_view<const T> a, matrix_view<const T> b,
                                              matrix_view<T> c, matrix_view<T> gathered_out,
                                              const ag_options& opt = {}) {
  static_assert(is_element_v<T>, "overlap supports float, double and bfloat16");
  return detail::op_start<detail::ag_op<T>>(ctx, detail::ag_args<T>{a, b, c, gathered_out, true}, opt);
}

/// The schedule all_gather_matmul runs for these arguments (the same on
/// every rank): builds and caches the plan like a call, without computing.
/// Collective, with the same rules as the call.
template <class T>
schedule all_gather_matmul_schedule(context& ctx, matrix_view<const T> a, matrix_view<const T> b, matrix_view<T> c,
                                    const ag_options& opt = {}) {
  static_assert(is_element_v<T>, "overlap supports float, double and bfloat16");
  return detail::op_schedule<detail::ag_op<T>>(ctx, detail::ag_args<T>{a, b, c, {}, false}, opt);
}

}  // namespace overlap

// Header-only, the implementation comes with the declarations (flavour.hpp).
#ifndef OVERLAP_COMPILED
#include "overlap/ops/all_gather_matmul-inl.hpp"
#endif
