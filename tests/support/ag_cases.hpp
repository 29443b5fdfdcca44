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

/// One rank's share of a case: the global X, its operands as stored, c
/// (filled with stale values, or, accumulating, with its earlier contents),
/// the gathered by-product and the bias.
template <class T>
struct ag_problem {
  bool lhs = true, tx = false;
  matrix<T> X, other, x_local, other_stored, c, out;
  matrix<double> before;
  std::vector<double> bias_ref;
  std::vector<T> bias;
  [[nodiscard]] const matrix<T>& a() const { return lhs ? x_local : other_stored; }
  [[nodiscard]] const matrix<T>& b() const { return lhs ? other_stored : x_local; }
};

/// Builds this rank's share of case cs (the other operand seeded with
/// other_seed when given: members of a batch may share it).
template <class T>
ag_problem<T> make_ag_problem(const overlap::context& ctx, const ag_case& cs, int64_t other_seed = -1) {
  using overlap::gathered;
  const int R = ctx.size(), p = ctx.rank();
  ag_problem<T> pr;
  pr.lhs = cs.variant == gathered::lhs_rows || cs.variant == gathered::lhs_cols;
  const bool lhs = pr.lhs, shard_rows = cs.variant == gathered::lhs_rows || cs.variant == gathered::rhs_rows;
  // X is the gathered operand: A (m x k) for lhs_*, B (k x n) for rhs_*.
  const int64_t x_rows = lhs ? cs.m : cs.k, x_cols = lhs ? cs.k : cs.n;
  pr.X = random_matrix<T>(x_rows, x_cols, cs.seed);
  const auto sizes = shard_sizes(shard_rows ? x_rows : x_cols, R, cs.how);
  const int64_t off = offset_of(sizes, p), len = sizes[p];
  const auto x_log = shard_rows ? slice(pr.X, off, 0, len, x_cols) : slice(pr.X, 0, off, x_rows, len);
  // The other operand is this rank's own, with a rank-dependent local size.
  const int64_t other_local = (lhs ? cs.n : cs.m) + p % 2;
  const auto seed = static_cast<uint32_t>(other_seed >= 0 ? other_seed : cs.seed * 7 + p);
  pr.other = lhs ? random_matrix<T>(cs.k, other_local, seed) : random_matrix<T>(other_local, cs.k, seed);
  // Operands are stored transposed when the case says so.
  pr.tx = lhs ? cs.transpose_a : cs.transpose_b;
  const bool to = lhs ? cs.transpose_b : cs.transpose_a;
  auto store = [&](const matrix<T>& m, bool t) {
    return t ? transposed(m, cs.pad) : slice(m, 0, 0, m.rows, m.cols, cs.pad);
  };
  pr.x_local = store(x_log, pr.tx), pr.other_stored = store(pr.other, to);
  pr.c = lhs ? matrix<T>(cs.m, other_local, cs.pad) : matrix<T>(other_local, cs.n, cs.pad);
  for (auto& v : pr.c.data) v = T(-999);  // stale contents must be overwritten (or, accumulating, the padding kept)
  if (cs.accumulate) pr.before = fill_before(pr.c, cs.seed * 13 + p);
  pr.out = pr.tx ? matrix<T>(x_cols, x_rows, cs.pad) : matrix<T>(x_rows, x_cols, cs.pad);
  pr.bias = make_bias<T>(pr.c.cols, p, cs.bias, pr.bias_ref);
  return pr;
}

/// Compares this rank's c (and the gathered by-product) with the naive
/// reference; returns the largest relative error.
template <class T>
double check_ag_problem(const overlap::context& ctx, const ag_case& cs, const ag_problem<T>& pr,
                        const std::string& what = "") {
  auto ref = pr.lhs ? naive_matmul(pr.X, pr.other) : naive_matmul(pr.other, pr.X);
  reference_epilogue(ref, pr.bias_ref, cs.act);
  if (cs.accumulate) add_before(ref, pr.before);
  const std::string name = cs.name() + what + " rank " + std::to_string(ctx.rank());
  const double err = expect_near_block(pr.c, ref, 0, 0, cs.k, name, cs.accumulate ? accumulate_rounding<T>() : 0.0);
  if (cs.with_out) {
    for (int64_t i = 0; i < pr.X.rows; ++i)
      for (int64_t j = 0; j < pr.X.cols; ++j)
        if ((pr.tx ? pr.out(j, i) : pr.out(i, j)) != pr.X(i, j)) {
          ADD_FAILURE() << name << ": gathered_out at logical (" << i << "," << j
                        << ") differs from X = " << double(pr.X(i, j));
          return err;
        }
  }
  return err;
}

/// The options of case cs, with the problem's bias.
template <class T>
overlap::ag_options ag_options_of(const ag_case& cs, const ag_problem<T>& pr) {
  overlap::ag_options opt;
  opt.gathered = cs.variant;
  set_common_options(opt, cs, pr.bias);
  opt.accumulate = cs.accumulate;
  return opt;
}

/// Runs the op of case cs on views of the operands (blocking or started).
template <class T>
void call_ag(overlap::context& ctx, const ag_case& cs, overlap::matrix_view<const T> a, overlap::matrix_view<const T> b,
             overlap::matrix_view<T> c, overlap::matrix_view<T> out, const overlap::ag_options& opt) {
  if (cs.started) {
    overlap::pending op = cs.with_out ? overlap::start_all_gather_matmul<T>(ctx, a, b, c, out, opt)
                                      : overlap::start_all_gather_matmul<T>(ctx, a, b, c, opt);
    independent_work(ctx);
    op.wait();
  } else if (cs.with_out) {
    overlap::all_gather_matmul<T>(ctx, a, b, c, out, opt);
  } else {
    overlap::all_gather_matmul<T>(ctx, a, b, c, opt);
  }
}

/// Runs one case collectively on ctx; returns the largest relative error.
template <class T>
double run_ag_case(overlap::context& ctx, const ag_case& cs) {
  ag_problem<T> pr = make_ag_problem<T>(ctx, cs);
  call_ag<T>(ctx, cs, pr.a().cview(), pr.b().cview(), pr.c.view(), pr.out.view(), ag_options_of(cs, pr));
  return check_ag_problem(ctx, cs, pr);
}

}  // namespace testing_support
