#pragma once
// One matmul_reduce_scatter case: global A (M x K) and B (K x N) are built on
// every rank, K is split over the ranks (this rank gets A[:, K_r], B[K_r, :]),
// the output is split by rows or columns, and this rank's c is compared with
// its block of the naive product A @ B.
#include <gtest/gtest.h>

#include <sstream>

#include "overlap/overlap.hpp"
#include "reference.hpp"
#include "started.hpp"

namespace testing_support {

struct rs_case {
  overlap::scattered scattered = overlap::scattered::rows;
  overlap::strategy strategy = overlap::strategy::ring;
  int64_t m = 1, n = 1, k = 1;
  split k_split = split::balanced;    ///< how K is shared
  split out_split = split::balanced;  ///< how the output is scattered
  int64_t pad = 0;
  uint32_t seed = 1;
  bool transpose_a = false, transpose_b = false;
  overlap::activation act = overlap::activation::none;
  bool bias = false;
  bool bf16_transfers = false;
  overlap::algorithm algorithm = overlap::algorithm::automatic;
  bool accumulate = false;  ///< C += result, C starting with this rank's values
  bool started = false;     ///< start_matmul_reduce_scatter, independent work, wait()

  [[nodiscard]] std::string name() const {
    std::ostringstream s;
    s << "rs " << overlap::to_string(scattered) << "/" << overlap::to_string(strategy) << "/"
      << overlap::to_string(algorithm) << " m=" << m << " n=" << n << " k=" << k << " k:" << to_string(k_split)
      << " out:" << to_string(out_split) << " pad=" << pad << (transpose_a ? " a^T" : "") << (transpose_b ? " b^T" : "")
      << " act=" << overlap::to_string(act) << (bias ? " +bias" : "") << (bf16_transfers ? " bf16-transfers" : "")
      << (accumulate ? " +=" : "");
    return s.str();
  }
};

/// One rank's share of a case: the global A and B, this rank's slices as
/// stored, c (stale values, or its earlier contents when accumulating), the bias.
template <class T>
struct rs_problem {
  matrix<T> A, B, a, b, c;
  int64_t ooff = 0;  ///< where this rank's output block starts
  matrix<double> before;
  std::vector<double> bias_ref;
  std::vector<T> bias;
};

/// Builds this rank's share of case cs (B seeded with b_seed when given:
/// members of a batch may share it).
template <class T>
rs_problem<T> make_rs_problem(const overlap::context& ctx, const rs_case& cs, int64_t b_seed = -1) {
  const int R = ctx.size(), p = ctx.rank();
  rs_problem<T> pr;
  pr.A = random_matrix<T>(cs.m, cs.k, cs.seed);
  pr.B = random_matrix<T>(cs.k, cs.n, static_cast<uint32_t>(b_seed >= 0 ? b_seed : cs.seed + 1000));
  const auto ks = shard_sizes(cs.k, R, cs.k_split);
  const int64_t koff = offset_of(ks, p);
  const auto a_log = slice(pr.A, 0, koff, cs.m, ks[p]);
  const auto b_log = slice(pr.B, koff, 0, ks[p], cs.n);
  pr.a = cs.transpose_a ? transposed(a_log, cs.pad) : slice(a_log, 0, 0, a_log.rows, a_log.cols, cs.pad);
  pr.b = cs.transpose_b ? transposed(b_log, cs.pad) : slice(b_log, 0, 0, b_log.rows, b_log.cols, cs.pad);
  const bool rows = cs.scattered == overlap::scattered::rows;
  const auto os = shard_sizes(rows ? cs.m : cs.n, R, cs.out_split);
  pr.ooff = offset_of(os, p);
  pr.c = rows ? matrix<T>(os[p], cs.n, cs.pad) : matrix<T>(cs.m, os[p], cs.pad);
  for (auto& v : pr.c.data) v = T(-999);
  if (cs.accumulate) pr.before = fill_before(pr.c, cs.seed * 13 + p);
  pr.bias = make_bias<T>(pr.c.cols, p, cs.bias, pr.bias_ref);
  return pr;
}

/// The options of case cs, with the problem's bias.
template <class T>
overlap::rs_options rs_options_of(const rs_case& cs, const rs_problem<T>& pr) {
  overlap::rs_options opt;
  opt.scattered = cs.scattered;
  set_common_options(opt, cs, pr.bias);
  opt.bf16_transfers = cs.bf16_transfers;
  opt.accumulate = cs.accumulate;
  return opt;
}

/// Runs the op of case cs on views of the operands (blocking or started).
template <class T>
void call_rs(overlap::context& ctx, const rs_case& cs, overlap::matrix_view<const T> a, overlap::matrix_view<const T> b,
             overlap::matrix_view<T> c, const overlap::rs_options& opt) {
  if (cs.started) {
    overlap::pending op = overlap::start_matmul_reduce_scatter<T>(ctx, a, b, c, opt);
    independent_work(ctx);
    op.wait();
  } else {
    overlap::matmul_reduce_scatter<T>(ctx, a, b, c, opt);
  }
}

/// Compares this rank's c with its block of the naive product A @ B (and
/// the epilogue); returns the largest relative error.
template <class T>
double check_rs_problem(const overlap::context& ctx, const rs_case& cs, const rs_problem<T>& pr,
                        const std::string& what = "") {
  const int R = ctx.size();
  const bool rows = cs.scattered == overlap::scattered::rows;
  const matrix<T>& c = pr.c;
  auto ref = naive_matmul(pr.A, pr.B);
  // This rank's block of the reference, then the epilogue with its bias.
  reference mine{matrix<double>(c.rows, c.cols), matrix<double>(c.rows, c.cols)};
  for (int64_t i = 0; i < c.rows; ++i)
    for (int64_t j = 0; j < c.cols; ++j) {
      mine.value(i, j) = ref.value(rows ? pr.ooff + i : i, rows ? j : pr.ooff + j);
      mine.magnitude(i, j) = ref.magnitude(rows ? pr.ooff + i : i, rows ? j : pr.ooff + j);
    }
  reference_epilogue(mine, pr.bias_ref, cs.act);
  if (cs.accumulate) add_before(mine, pr.before);
  // bf16 transfers round the partial sum at each of the R - 1 hops (documented
  // in rs_options::bf16_transfers).
  const double hops = cs.bf16_transfers && cs.strategy != overlap::strategy::bulk ? (R - 1) * std::ldexp(1.0, -8) : 0.0;
  return expect_near_block(c, mine, 0, 0, cs.k, cs.name() + what + " rank " + std::to_string(ctx.rank()),
                           hops + (cs.accumulate ? accumulate_rounding<T>() : 0.0));
}

template <class T>
double run_rs_case(overlap::context& ctx, const rs_case& cs) {
  rs_problem<T> pr = make_rs_problem<T>(ctx, cs);
  call_rs<T>(ctx, cs, pr.a.cview(), pr.b.cview(), pr.c.view(), rs_options_of(cs, pr));
  return check_rs_problem(ctx, cs, pr);
}

}  // namespace testing_support
