#pragma once
// One matmul_all_reduce case: global A (M x K) and B (K x N) are built on
// every rank, K is split over the ranks (this rank gets A[:, K_r], B[K_r, :]),
// and every rank's c is compared with the whole naive product A @ B.
#include <gtest/gtest.h>

#include <sstream>

#include "overlap/overlap.hpp"
#include "reference.hpp"
#include "started.hpp"

namespace testing_support {

struct ar_case {
  overlap::reduced reduced = overlap::reduced::rows;
  overlap::strategy strategy = overlap::strategy::ring;
  int64_t m = 1, n = 1, k = 1;
  split k_split = split::balanced;  ///< how K is shared
  int64_t pad = 0;
  uint32_t seed = 1;
  bool transpose_a = false, transpose_b = false;
  overlap::activation act = overlap::activation::none;
  bool bias = false;
  bool bf16_transfers = false;
  overlap::algorithm algorithm = overlap::algorithm::automatic;
  bool accumulate = false;  ///< C += result, C starting with this rank's values
  bool started = false;     ///< start_matmul_all_reduce, independent work, wait()
  int64_t batch = 1;        ///< members; member i uses seeds seed + 100 i

  [[nodiscard]] std::string name() const {
    std::ostringstream s;
    s << "ar " << overlap::to_string(reduced) << "/" << overlap::to_string(strategy) << "/"
      << overlap::to_string(algorithm) << " m=" << m << " n=" << n << " k=" << k << " k:" << to_string(k_split)
      << " pad=" << pad << (transpose_a ? " a^T" : "") << (transpose_b ? " b^T" : "")
      << " act=" << overlap::to_string(act) << (bias ? " +bias" : "") << (bf16_transfers ? " bf16-transfers" : "")
      << (accumulate ? " +=" : "") << (started ? " started" : "") << " batch=" << batch;
    return s.str();
  }
};

/// One member of a case on this rank: the global A and B, this rank's
/// slices as stored, c (stale values, or its earlier contents when
/// accumulating), and the reference's earlier contents.
template <class T>
struct ar_member {
  matrix<T> A, B, a, b, c;
  matrix<double> before;
};

template <class T>
ar_member<T> make_ar_member(const overlap::context& ctx, const ar_case& cs, uint32_t seed) {
  const int R = ctx.size(), p = ctx.rank();
  ar_member<T> mb;
  mb.A = random_matrix<T>(cs.m, cs.k, seed);
  mb.B = random_matrix<T>(cs.k, cs.n, seed + 1000);
  const auto ks = shard_sizes(cs.k, R, cs.k_split);
  const int64_t koff = offset_of(ks, p);
  const auto a_log = slice(mb.A, 0, koff, cs.m, ks[p]);
  const auto b_log = slice(mb.B, koff, 0, ks[p], cs.n);
  mb.a = cs.transpose_a ? transposed(a_log, cs.pad) : slice(a_log, 0, 0, a_log.rows, a_log.cols, cs.pad);
  mb.b = cs.transpose_b ? transposed(b_log, cs.pad) : slice(b_log, 0, 0, b_log.rows, b_log.cols, cs.pad);
  mb.c = matrix<T>(cs.m, cs.n, cs.pad);
  for (auto& v : mb.c.data) v = T(-999);
  if (cs.accumulate) mb.before = fill_before(mb.c, seed * 13 + p);
  return mb;
}

/// Copies each member's views into one strided batch (members `stride`
/// elements apart) and back: the op sees one call.
template <class T>
struct ar_batch {
  std::vector<T> a, b, c;
  int64_t sa = 0, sb = 0, sc = 0;
};

/// Runs case cs (every member) and checks every member's c against the
/// naive product with the epilogue; returns the largest relative error.
template <class T>
double run_ar_case(overlap::context& ctx, const ar_case& cs) {
  std::vector<ar_member<T>> members;
  for (int64_t i = 0; i < cs.batch; ++i)
    members.push_back(make_ar_member<T>(ctx, cs, cs.seed + static_cast<uint32_t>(100 * i)));
  std::vector<double> bias_ref;
  const std::vector<T> bias = make_bias<T>(cs.n, 0, cs.bias, bias_ref);
  overlap::ar_options opt;
  opt.reduced = cs.reduced;
  set_common_options(opt, cs, bias);
  opt.bf16_transfers = cs.bf16_transfers;
  opt.accumulate = cs.accumulate;
  const ar_member<T>& m0 = members.front();
  // A batch lays its members out one after the other in one buffer per operand.
  ar_batch<T> bt;
  bt.sa = static_cast<int64_t>(m0.a.data.size()), bt.sb = static_cast<int64_t>(m0.b.data.size());
  bt.sc = static_cast<int64_t>(m0.c.data.size());
  for (const auto& mb : members) {
    bt.a.insert(bt.a.end(), mb.a.data.begin(), mb.a.data.end());
    bt.b.insert(bt.b.end(), mb.b.data.begin(), mb.b.data.end());
    bt.c.insert(bt.c.end(), mb.c.data.begin(), mb.c.data.end());
  }
  if (cs.batch > 1) opt.batch = {cs.batch, bt.sa, bt.sb, bt.sc, 0};
  const overlap::matrix_view<const T> a{bt.a.data(), m0.a.rows, m0.a.cols, m0.a.ld};
  const overlap::matrix_view<const T> b{bt.b.data(), m0.b.rows, m0.b.cols, m0.b.ld};
  const overlap::matrix_view<T> c{bt.c.data(), m0.c.rows, m0.c.cols, m0.c.ld};
  if (cs.started) {
    overlap::pending op = overlap::start_matmul_all_reduce<T>(ctx, a, b, c, opt);
    independent_work(ctx);
    op.wait();
  } else {
    overlap::matmul_all_reduce<T>(ctx, a, b, c, opt);
  }
  // bf16 transfers round the partial sum at each of the R - 1 hops (rs_options::bf16_transfers).
  const int R = ctx.size();
  const double hops = cs.bf16_transfers && cs.strategy != overlap::strategy::bulk ? (R - 1) * std::ldexp(1.0, -8) : 0.0;
  double worst = 0;
  for (int64_t i = 0; i < cs.batch; ++i) {
    ar_member<T>& mb = members[static_cast<size_t>(i)];
    std::copy_n(bt.c.begin() + i * bt.sc, bt.sc, mb.c.data.begin());
    reference ref = naive_matmul(mb.A, mb.B);
    reference_epilogue(ref, bias_ref, cs.act);
    if (cs.accumulate) add_before(ref, mb.before);
    const std::string what = cs.name() + " member " + std::to_string(i) + " rank " + std::to_string(ctx.rank());
    worst = std::max(
        worst, expect_near_block(mb.c, ref, 0, 0, cs.k, what, hops + (cs.accumulate ? accumulate_rounding<T>() : 0.0)));
    // Nothing is written beside c's rows (a padded view's gaps keep their values).
    for (int64_t r = 0; r < mb.c.rows; ++r)
      for (int64_t j = mb.c.cols; j < mb.c.ld; ++j)
        if (double(mb.c(r, j)) != double(T(-999)))
          ADD_FAILURE() << what << ": wrote the padding at (" << r << "," << j << ")";
  }
  return worst;
}

}  // namespace testing_support
