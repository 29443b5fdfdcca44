#pragma once
// One all_gather_matmul case: builds the global problem on every rank, hands
// each rank its shard, runs the op and compares this rank's C (and the
// gathered by-product) with the naive reference.
#include <gtest/gtest.h>

#include <sstream>

#include "overlap/overlap.hpp"
#include "reference.hpp"
#include "started.hpp"

namespace testing_support {

struct ag_case {
  overlap::gathered variant = overlap::gathered::lhs_rows;
  overlap::strategy strategy = overlap::strategy::ring;
  int64_t m = 1, n = 1, k = 1;  ///< global sizes (the non-sharded local dim is varied per rank)
  split how = split::balanced;
  int64_t pad = 0;        ///< extra leading-dimension elements on every view
  bool with_out = false;  ///< also request the gathered operand
  uint32_t seed = 1;
  bool transpose_a = false, transpose_b = false;
  overlap::activation act = overlap::activation::none;
  bool bias = false;
  overlap::algorithm algorithm = overlap::algorithm::automatic;
  bool accumulate = false;  ///< C += result, C starting with this rank's values
  bool started = false;     ///< start_all_gather_matmul, independent work, wait()

  [[nodiscard]] std::string name() const {
    std::ostringstream s;
    s << overlap::to_string(variant) << "/" << overlap::to_string(strategy) << "/" << overlap::to_string(algorithm)
      << " m=" << m << " n=" << n << " k=" << k << " " << to_string(how) << " pad=" << pad
      << (with_out ? " +gathered_out" : "") << (transpose_a ? " a^T" : "") << (transpose_b ? " b^T" : "")
      << " act=" << overlap::to_string(act) << (bias ? " +bias" : "") << (accumulate ? " +=" : "");
    return s.str();
  }
};

/// Runs one case collectively on ctx; returns the largest relative error.
template <class T>
double run_ag_case(overlap::context& ctx, const ag_case& cs) {
  using overlap::gathered;
  const int R = ctx.size(), p = ctx.rank();
  const bool lhs = cs.variant == gathered::lhs_rows || cs.variant == gathered::lhs_cols;
  const bool shard_rows = cs.variant == gathered::lhs_rows || cs.variant == gathered::rhs_rows;
  // X is the gathered operand: A (m x k) for lhs_*, B (k x n) for rhs_*.
  const int64_t x_rows = lhs ? cs.m : cs.k, x_cols = lhs ? cs.k : cs.n;
  const auto X = random_matrix<T>(x_rows, x_cols, cs.seed);
  const auto sizes = shard_sizes(shard_rows ? x_rows : x_cols, R, cs.how);
  const int64_t off = offset_of(sizes, p), len = sizes[p];
  const auto x_log = shard_rows ? slice(X, off, 0, len, x_cols) : slice(X, 0, off, x_rows, len);
  // The other operand is this rank's own, with a rank-dependent local size.
  const int64_t other_local = (lhs ? cs.n : cs.m) + p % 2;
  const auto other =
      lhs ? random_matrix<T>(cs.k, other_local, cs.seed * 7 + p) : random_matrix<T>(other_local, cs.k, cs.seed * 7 + p);
  // Operands are stored transposed when the case says so.
  const bool tx = lhs ? cs.transpose_a : cs.transpose_b, to = lhs ? cs.transpose_b : cs.transpose_a;
  auto store = [&](const matrix<T>& m, bool t) {
    return t ? transposed(m, cs.pad) : slice(m, 0, 0, m.rows, m.cols, cs.pad);
  };
  const auto x_local = store(x_log, tx), other_stored = store(other, to);
  const auto& a = lhs ? x_local : other_stored;
  const auto& b = lhs ? other_stored : x_local;
  matrix<T> c = lhs ? matrix<T>(cs.m, other_local, cs.pad) : matrix<T>(other_local, cs.n, cs.pad);
  for (auto& v : c.data) v = T(-999);  // stale contents must be overwritten (or, accumulating, the padding kept)
  const matrix<double> before = cs.accumulate ? fill_before(c, cs.seed * 13 + p) : matrix<double>(0, 0);
  matrix<T> out = tx ? matrix<T>(x_cols, x_rows, cs.pad) : matrix<T>(x_rows, x_cols, cs.pad);
  std::vector<double> bias_ref;
  const auto bias = make_bias<T>(c.cols, p, cs.bias, bias_ref);

  overlap::ag_options opt;
  opt.gathered = cs.variant;
  set_common_options(opt, cs, bias);
  opt.accumulate = cs.accumulate;
  if (cs.started) {
    overlap::pending op =
        cs.with_out ? overlap::start_all_gather_matmul<T>(ctx, a.cview(), b.cview(), c.view(), out.view(), opt)
                    : overlap::start_all_gather_matmul<T>(ctx, a.cview(), b.cview(), c.view(), opt);
    independent_work(ctx);
    op.wait();
  } else if (cs.with_out) {
    overlap::all_gather_matmul<T>(ctx, a.cview(), b.cview(), c.view(), out.view(), opt);
  } else {
    overlap::all_gather_matmul<T>(ctx, a.cview(), b.cview(), c.view(), opt);
  }

  auto ref = lhs ? naive_matmul(X, other) : naive_matmul(other, X);
  reference_epilogue(ref, bias_ref, cs.act);
  if (cs.accumulate) add_before(ref, before);
  const double err = expect_near_block(c, ref, 0, 0, cs.k, cs.name() + " rank " + std::to_string(p),
                                       cs.accumulate ? accumulate_rounding<T>() : 0.0);
  if (cs.with_out) {
    for (int64_t i = 0; i < x_rows; ++i)
      for (int64_t j = 0; j < x_cols; ++j)
        if ((tx ? out(j, i) : out(i, j)) != X(i, j)) {
          ADD_FAILURE() << cs.name() << ": gathered_out at logical (" << i << "," << j
                        << ") differs from X = " << double(X(i, j));
          return err;
        }
  }
  return err;
}

}  // namespace testing_support
