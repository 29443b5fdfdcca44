#pragma once
// One all_gather_matmul case: builds the global problem on every rank, hands
// each rank its shard, runs the op and compares this rank's C (and the
// gathered by-product) with the naive reference.
#include <gtest/gtest.h>

#include <sstream>

#include "overlap/overlap.hpp"
#include "reference.hpp"

namespace testing_support {

struct ag_case {
  overlap::gathered variant = overlap::gathered::lhs_rows;
  overlap::strategy strategy = overlap::strategy::ring;
  int64_t m = 1, n = 1, k = 1;  ///< global sizes (the non-sharded local dim is varied per rank)
  split how = split::balanced;
  int64_t pad = 0;              ///< extra leading-dimension elements on every view
  bool with_out = false;        ///< also request the gathered operand
  uint32_t seed = 1;

  [[nodiscard]] std::string name() const {
    std::ostringstream s;
    s << overlap::to_string(variant) << "/" << overlap::to_string(strategy) << " m=" << m << " n=" << n << " k=" << k
      << " " << to_string(how) << " pad=" << pad << (with_out ? " +gathered_out" : "");
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
  const auto x_local = shard_rows ? slice(X, off, 0, len, x_cols, cs.pad) : slice(X, 0, off, x_rows, len, cs.pad);
  // The other operand is this rank's own, with a rank-dependent local size.
  const int64_t other_local = (lhs ? cs.n : cs.m) + p % 2;
  const auto other = lhs ? random_matrix<T>(cs.k, other_local, cs.seed * 7 + p, cs.pad)
                         : random_matrix<T>(other_local, cs.k, cs.seed * 7 + p, cs.pad);
  const auto& a = lhs ? x_local : other;
  const auto& b = lhs ? other : x_local;
  matrix<T> c = lhs ? matrix<T>(cs.m, other_local, cs.pad) : matrix<T>(other_local, cs.n, cs.pad);
  for (auto& v : c.data) v = T(-999);  // stale contents must be overwritten
  matrix<T> out(x_rows, x_cols, cs.pad);

  overlap::ag_options opt;
  opt.gathered = cs.variant;
  opt.strategy = cs.strategy;
  if (cs.with_out) overlap::all_gather_matmul<T>(ctx, a.cview(), b.cview(), c.view(), out.view(), opt);
  else overlap::all_gather_matmul<T>(ctx, a.cview(), b.cview(), c.view(), opt);

  const auto ref = lhs ? naive_matmul(X, other) : naive_matmul(other, X);
  const double err = expect_near_block(c, ref, 0, 0, cs.k, cs.name() + " rank " + std::to_string(p));
  if (cs.with_out) {
    for (int64_t i = 0; i < x_rows; ++i)
      for (int64_t j = 0; j < x_cols; ++j)
        if (out(i, j) != X(i, j)) {
          ADD_FAILURE() << cs.name() << ": gathered_out(" << i << "," << j << ") = " << out(i, j) << ", expected "
                        << X(i, j);
          return err;
        }
  }
  return err;
}

}  // namespace testing_support
