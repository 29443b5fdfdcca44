#pragma once
/// @file
/// all_gather_matmul with several products of one gather: the Q, K and V
/// projections of one activation, or the gate and up projections of a gated
/// MLP, gather the activation once.

#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "overlap/core/matrix.hpp"
#include "overlap/ops/all_gather_matmul.hpp"
#include "overlap/ops/options.hpp"
#include "overlap/runtime/context.hpp"
#include "overlap/runtime/failure.hpp"

namespace overlap {
namespace detail {

/// The operands of a shared gather, packed side by side: for lhs_*, the
/// others op(b_i) (K x N_i) as one K x sum N_i matrix and the outputs as one
/// M x sum N_i; for rhs_*, op(a_i) (M_i x K) stacked as sum M_i x K and the
/// outputs as sum M_i x N.
template <class T>
struct shared_gather_parts {
  bool lhs = true;
  int64_t k = -1;      ///< the contracting extent every other operand shares
  int64_t fixed = -1;  ///< the output extent every output shares (M for lhs_*, N for rhs_*)
  int64_t total = 0;   ///< sum of the outputs' other extents
  std::vector<int64_t> offsets;
  std::vector<T> packed, out;

  /// Local checks and packing; std::invalid_argument names the first bad operand.
  void prepare(const std::vector<matrix_view<const T>>& others, const std::vector<matrix_view<T>>& cs,
               const ag_options& opt) {
    lhs = opt.gathered == gathered::lhs_rows || opt.gathered == gathered::lhs_cols;
    if (others.empty() || others.size() != cs.size())
      fail("needs one output per other operand and at least one (" + std::to_string(others.size()) + " operands, " +
           std::to_string(cs.size()) + " outputs)");
    if (opt.epilogue.bias) fail("a bias is per output: make one call per output for biases");
    const bool t = lhs ? opt.transpose_b : opt.transpose_a;
    for (size_t i = 0; i < others.size(); ++i) {
      const int64_t own = check_other(i, others[i], t);
      check_output(i, cs[i], own);
      offsets.push_back(total);
      total += own;
    }
    packed.resize(static_cast<size_t>(k * total));
    out.resize(static_cast<size_t>(fixed * total));
    for (size_t i = 0; i < others.size(); ++i) pack(others[i], t, offsets[i]);
  }
  [[noreturn]] static void fail(const std::string& what) {
    throw std::invalid_argument("overlap::all_gather_matmul (several products): " + what);
  }
  /// Operand i (stored transposed when t): its own output extent; sets k.
  int64_t check_other(size_t i, const matrix_view<const T>& o, bool t) {
    const int64_t o_rows = t ? o.cols : o.rows, o_cols = t ? o.rows : o.cols;
    const int64_t kk = lhs ? o_rows : o_cols;
    if (o.rows > 0 && o.cols > 0 && (o.data == nullptr || o.ld < o.cols))
      fail("operand " + std::to_string(i) + " has no data or ld < cols");
    if (k >= 0 && kk != k)
      fail("operand " + std::to_string(i) + " has contracting extent " + std::to_string(kk) + ", operand 0 has " +
           std::to_string(k));
    k = kk;
    return lhs ? o_cols : o_rows;
  }
  /// Output i against its operand's extent `own`; sets fixed.
  void check_output(size_t i, const matrix_view<T>& c, int64_t own) {
    const int64_t c_own = lhs ? c.cols : c.rows, c_fixed = lhs ? c.rows : c.cols;
    if (c_own != own)
      fail("output " + std::to_string(i) + " is " + std::to_string(c.rows) + " x " + std::to_string(c.cols) + "; its " +
           (lhs ? "columns" : "rows") + " must match operand " + std::to_string(i) + "'s " + std::to_string(own));
    if (fixed >= 0 && c_fixed != fixed)
      fail("output " + std::to_string(i) + " has " + std::to_string(c_fixed) + (lhs ? " rows" : " columns") +
           ", output 0 has " + std::to_string(fixed));
    fixed = c_fixed;
    if (c.rows > 0 && c.cols > 0 && (c.data == nullptr || c.ld < c.cols))
      fail("output " + std::to_string(i) + " has no data or ld < cols");
  }
  /// op(o) into its place in packed (no transpose left).
  void pack(const matrix_view<const T>& o, bool t, int64_t at) {
    const int64_t rows = t ? o.cols : o.rows, cols = t ? o.rows : o.cols;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        const T v = t ? o(j, i) : o(i, j);
        if (lhs)
          packed[static_cast<size_t>(i * total + at + j)] = v;  // K x total
        else
          packed[static_cast<size_t>((at + i) * k + j)] = v;  // total x K
      }
  }
  [[nodiscard]] matrix_view<const T> packed_view() const {
    return lhs ? matrix_view<const T>{packed.data(), k, total} : matrix_view<const T>{packed.data(), total, k};
  }
  [[nodiscard]] matrix_view<T> out_view() {
    return lhs ? matrix_view<T>{out.data(), fixed, total} : matrix_view<T>{out.data(), total, fixed};
  }
  /// Output i's block of out into cs[i] (added to it when accumulating).
  void unpack(const std::vector<matrix_view<T>>& cs, bool accumulate) const {
    using wide = std::conditional_t<std::is_same_v<T, double>, double, float>;
    for (size_t n = 0; n < cs.size(); ++n) {
      const matrix_view<T>& c = cs[n];
      for (int64_t i = 0; i < c.rows; ++i)
        for (int64_t j = 0; j < c.cols; ++j) {
          const T v = lhs ? out[static_cast<size_t>(i * total + offsets[n] + j)]
                          : out[static_cast<size_t>((offsets[n] + i) * fixed + j)];
          c(i, j) = accumulate ? T(static_cast<wide>(c(i, j)) + static_cast<wide>(v)) : v;
        }
    }
  }
};

}  // namespace detail

/// One gather, several products: the sharded operand x (a for lhs_*, b for
/// rhs_*, as in the single call) is all-gathered once and multiplied by every
/// operand of `others`, product i into cs[i]:
/// lhs_*: cs[i] = op(AG(a)) @ op(others[i]) (K x N_i operands, M x N_i outputs);
/// rhs_*: cs[i] = op(others[i]) @ op(AG(b)) (M_i x K operands, M_i x N outputs).
/// The others are packed side by side, so every ring step computes the
/// piece of every product in one GEMM (sum N_i wide); the outputs are copied
/// out of one workspace at the end (for K in the hundreds and more, copies
/// cost little next to the GEMMs). opt applies to every product
/// (transpose_b or transpose_a to every other operand, the activation to
/// every output, accumulate to every output); a bias is per output and is
/// rejected (one call per output then), and there is no gathered_out.
///
/// Collective over ctx, with the single call's rules; bad input on any rank
/// (operand and output counts, shapes that differ between the others)
/// raises std::invalid_argument on every rank. The packed operands and the
/// workspace are allocated per call.
template <class T>
void all_gather_matmul(context& ctx, matrix_view<const T> x, const std::vector<matrix_view<const T>>& others,
                       const std::vector<matrix_view<T>>& cs, const ag_options& opt = {}) {
  static_assert(is_element_v<T>, "overlap supports float, double and bfloat16");
  ctx.check_usable("overlap::all_gather_matmul");
  detail::shared_gather_parts<T> parts;
  detail::failure local;
  try {
    parts.prepare(others, cs, opt);
  } catch (...) {
    local = detail::failure::capture(std::current_exception());
  }
  detail::agree_on(ctx, local, "overlap::all_gather_matmul (several products)");
  ag_options one = opt;
  (parts.lhs ? one.transpose_b : one.transpose_a) = false;  // packed as op(others[i])
  one.accumulate = false;                                   // added while unpacking
  if (parts.lhs)
    all_gather_matmul<T>(ctx, x, parts.packed_view(), parts.out_view(), one);
  else
    all_gather_matmul<T>(ctx, parts.packed_view(), x, parts.out_view(), one);
  parts.unpack(cs, opt.accumulate);
}

}  // namespace overlap
