#pragma once
/// @file
/// all_to_all_matmul: a mixture-of-experts dispatch (the all-to-all that
/// sends every token row to the rank of its expert) followed by the
/// experts' products, decomposed by peer: each peer's rows are multiplied
/// by their experts' weights while the next peer's rows arrive.

#include "overlap/core/matrix.hpp"
#include "overlap/ops/expert_counts.hpp"
#include "overlap/ops/options.hpp"
#include "overlap/ops/pending.hpp"
#include "overlap/ops/token_exchange.hpp"
#include "overlap/runtime/context.hpp"

namespace overlap {
namespace detail {

/// The op's names and message tags (ops/op_id.hpp).
template <>
struct op_info<op_id::all_to_all_matmul> : owns_tags<op_id::all_to_all_matmul> {
  static constexpr entry_names names{"overlap::all_to_all_matmul",
                                     "overlap::start_all_to_all_matmul",
                                     "",
                                     "a2a_options",
                                     "strategy",
                                     "a2a_options.strategy",
                                     ""};
};

/// The op to the token exchange (ops/token_exchange.hpp): the input's rows travel.
struct a2a_dispatch {
  static constexpr op_id id = op_id::all_to_all_matmul;
  static constexpr travels what = travels::input;
  static constexpr const char* in_name = "x";
  static constexpr const char* out_name = "y";
};

}  // namespace detail

/// Dispatch, then the local experts' product: y = the rows every rank sends
/// to this rank's experts, each times its expert's weight.
///
/// - x (counts.sent_rows() x K): this rank's token rows, grouped by
///   destination rank q, then by q's local expert e (counts.send[q * E + e]
///   rows each, E = counts.experts); a token routed to several experts
///   appears once per expert.
/// - w (E * K x N): this rank's experts' weights, stacked: expert e's K x N
///   weight is rows [e * K, (e + 1) * K); with a2a_options::transpose_w,
///   E * N x K, expert e's weight transposed at rows [e * N, (e + 1) * N).
/// - y (counts.received_rows() x N), output: the received rows times their
///   expert's weight, grouped by source rank q, then by local expert e
///   (counts.recv[q * E + e] rows each), each block in the order rank q sent
///   its rows. This is MPI_Alltoallv's receive order; matmul_all_to_all
///   reads its input in the same order and returns rows in x's order.
///
/// Collective over ctx. E, K, N and the options must agree across ranks;
/// counts.recv on rank p must equal what every rank q's counts.send says
/// for p (exchange_expert_counts makes it so). Counts may be zero, and a
/// rank may send or receive no rows. Bad input on any rank (including
/// counts that disagree with a peer's) raises std::invalid_argument on
/// every rank before any transfer; the context stays usable. The first call
/// with E, K, N and these leading dimensions builds and caches a plan; the
/// counts are checked on every call (one MPI_Alltoall of E counts per
/// pair), and strategy::automatic prices bulk and pairwise for each call's
/// counts (one MPI_Allreduce).
template <class T>
void all_to_all_matmul(context& ctx, matrix_view<const T> x, matrix_view<const T> w, matrix_view<T> y,
                       const expert_counts& counts, const a2a_options& opt = {}) {
  static_assert(is_element_v<T>, "overlap supports float, double and bfloat16");
  detail::exchange_call<detail::a2a_dispatch>(
      ctx, detail::exchange_args<T>{x, w, y, {}, false, &counts, opt.transpose_w}, opt);
}

/// As above, and also writes the received rows themselves into
/// dispatched_out (counts.received_rows() x K, in y's row order): the
/// experts' inputs, which their backward pass needs.
template <class T>
void all_to_all_matmul(context& ctx, matrix_view<const T> x, matrix_view<const T> w, matrix_view<T> y,
                       matrix_view<T> dispatched_out, const expert_counts& counts, const a2a_options& opt = {}) {
  static_assert(is_element_v<T>, "overlap supports float, double and bfloat16");
  detail::exchange_call<detail::a2a_dispatch>(
      ctx, detail::exchange_args<T>{x, w, y, dispatched_out, true, &counts, opt.transpose_w}, opt);
}

/// all_to_all_matmul, started: the checks, the agreements and the plan
/// happen here, on the calling thread (bad input raises on every rank,
/// nothing started); the transfers and products then run on the context's
/// worker thread. y is complete after wait(). As for the other started ops
/// (start_all_gather_matmul): one op in flight per context, and x, w and y
/// must stay valid until wait(); counts is read before this returns.
template <class T>
[[nodiscard]] pending start_all_to_all_matmul(context& ctx, matrix_view<const T> x, matrix_view<const T> w,
                                              matrix_view<T> y, const expert_counts& counts,
                                              const a2a_options& opt = {}) {
  static_assert(is_element_v<T>, "overlap supports float, double and bfloat16");
  return detail::exchange_start<detail::a2a_dispatch>(
      ctx, detail::exchange_args<T>{x, w, y, {}, false, &counts, opt.transpose_w}, opt);
}

/// start_all_to_all_matmul with dispatched_out (see the call above), which
/// is also complete after wait() and must stay valid until then.
template <class T>
[[nodiscard]] pending start_all_to_all_matmul(context& ctx, matrix_view<const T> x, matrix_view<const T> w,
                                              matrix_view<T> y, matrix_view<T> dispatched_out,
                                              const expert_counts& counts, const a2a_options& opt = {}) {
  static_assert(is_element_v<T>, "overlap supports float, double and bfloat16");
  return detail::exchange_start<detail::a2a_dispatch>(
      ctx, detail::exchange_args<T>{x, w, y, dispatched_out, true, &counts, opt.transpose_w}, opt);
}

}  // namespace overlap
