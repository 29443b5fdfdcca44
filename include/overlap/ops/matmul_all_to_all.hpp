#pragma once
/// @file
/// matmul_all_to_all: the experts' products followed by a mixture-of-experts
/// combine (the all-to-all that returns every product row to the rank its
/// token came from), decomposed by peer: each peer's block leaves as soon
/// as it is computed, while the next one is computed.

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
struct op_info<op_id::matmul_all_to_all> : owns_tags<op_id::matmul_all_to_all> {
  static constexpr entry_names names{"overlap::matmul_all_to_all",
                                     "overlap::start_matmul_all_to_all",
                                     "",
                                     "a2a_options",
                                     "strategy",
                                     "a2a_options.strategy",
                                     ""};
};

/// The op to the token exchange (ops/token_exchange.hpp): the products travel.
struct a2a_combine {
  static constexpr op_id id = op_id::matmul_all_to_all;
  static constexpr travels what = travels::output;
  static constexpr const char* in_name = "h";
  static constexpr const char* out_name = "out";
};

}  // namespace detail

/// The local experts' product, then combine: out = this rank's token rows'
/// expert outputs, returned by the ranks that computed them.
///
/// - h (counts.received_rows() x F): the rows this rank's experts received,
///   in all_to_all_matmul's output order (by source rank q, then local
///   expert e, counts.recv[q * E + e] rows each).
/// - w (E * F x K): this rank's experts' weights, stacked: expert e's F x K
///   weight is rows [e * F, (e + 1) * F); with a2a_options::transpose_w,
///   E * K x F, expert e's weight transposed at rows [e * K, (e + 1) * K).
/// - out (counts.sent_rows() x K), output: row i is the product for row i
///   of the x that all_to_all_matmul dispatched with the same counts (by
///   destination rank q, then q's expert e, counts.send[q * E + e] rows
///   each). The caller weighs and sums each token's rows (its gates).
///
/// Collective over ctx, with all_to_all_matmul's rules: E, F, K and the
/// options must agree across ranks, the counts must agree with the peers'
/// (checked on every call), and bad input on any rank raises
/// std::invalid_argument on every rank before any transfer.
template <class T>
void matmul_all_to_all(context& ctx, matrix_view<const T> h, matrix_view<const T> w, matrix_view<T> out,
                       const expert_counts& counts, const a2a_options& opt = {}) {
  static_assert(is_element_v<T>, "overlap supports float, double and bfloat16");
  detail::exchange_call<detail::a2a_combine>(
      ctx, detail::exchange_args<T>{h, w, out, {}, false, &counts, opt.transpose_w}, opt);
}

/// matmul_all_to_all, started (see start_all_to_all_matmul): out is
/// complete after wait().
template <class T>
[[nodiscard]] pending start_matmul_all_to_all(context& ctx, matrix_view<const T> h, matrix_view<const T> w,
                                              matrix_view<T> out, const expert_counts& counts,
                                              const a2a_options& opt = {}) {
  static_assert(is_element_v<T>, "overlap supports float, double and bfloat16");
  return detail::exchange_start<detail::a2a_combine>(
      ctx, detail::exchange_args<T>{h, w, out, {}, false, &counts, opt.transpose_w}, opt);
}

}  // namespace overlap
