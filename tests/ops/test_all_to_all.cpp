// The all-to-all ops of a mixture-of-experts layer: all_to_all_matmul
// (dispatch, then the experts' product) and matmul_all_to_all (the experts'
// product, then combine), against naive products in double of the rows
// each rank would have sent or received (every rank regenerates every
// rank's inputs from their seeds). Every strategy (bulk, pairwise,
// automatic with and without a calibration) and element type; uneven
// counts, zero counts, a rank that sends nothing and one that receives
// nothing, a hot expert, one expert per rank and several, strided views;
// the started form; bad input on one rank (every rank throws, the context
// stays usable).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "calibrations.hpp"
#include "overlap/overlap.hpp"
#include "reference.hpp"
#include "rejects.hpp"

using namespace testing_support;

namespace {

/// How the test routes tokens: rows rank p sends to expert e of rank q.
enum class routing { uneven, zeros, silent_ranks, hot };
const char* to_string(routing r) {
  switch (r) {
    case routing::uneven: return "uneven";
    case routing::zeros: return "zeros";
    case routing::silent_ranks: return "silent_ranks";
    case routing::hot: return "hot";
  }
  return "?";
}
int64_t rows_to(routing how, int R, int p, int q, int e) {
  switch (how) {
    case routing::uneven: return (p * 7 + q * 3 + e * 5) % 5 + 1;
    case routing::zeros: return (p + 2 * q + 3 * e) % 3 == 0 ? 0 : (p + q + e) % 4 + 1;
    case routing::silent_ranks:  // the last rank sends nothing; rank 0's experts receive nothing
      if (R > 1 && (p == R - 1 || q == 0)) return 0;
      return (p + q + e) % 3 + 1;
    case routing::hot: return q == 0 && e == 0 ? 12 : 3;  // one expert gets 4x the others
  }
  return 0;
}

struct a2a_case {
  int experts = 2;
  routing how = routing::uneven;
  overlap::strategy strategy = overlap::strategy::pairwise;
  int64_t k = 16, n = 12;
  int64_t pad = 0;  ///< extra elements per row of every view
  uint32_t seed = 1;
  bool with_moved = true;
  bool started = false;
  bool transpose_w = false;  ///< the weights passed transposed (a2a_options::transpose_w)
  [[nodiscard]] std::string name() const {
    return std::string(overlap::to_string(strategy)) + ", " + std::to_string(experts) + " experts, " + to_string(how) +
           ", pad " + std::to_string(pad) + (started ? ", started" : "") + (with_moved ? ", dispatched_out" : "") +
           (transpose_w ? ", transpose_w" : "");
  }
};

/// Rank p's counts under the case's routing, the recv side computed here
/// (independently of exchange_expert_counts).
overlap::expert_counts counts_of(const a2a_case& cs, int R, int p) {
  overlap::expert_counts c;
  c.experts = cs.experts;
  for (int q = 0; q < R; ++q)
    for (int e = 0; e < cs.experts; ++e) {
      c.send.push_back(rows_to(cs.how, R, p, q, e));
      c.recv.push_back(rows_to(cs.how, R, q, p, e));
    }
  return c;
}

/// The first row of block (q, e) on one side of counts (send or recv).
int64_t block_row(const std::vector<int64_t>& side, int E, int q, int e) {
  int64_t r = 0;
  for (int i = 0; i < q * E + e; ++i) r += side[static_cast<size_t>(i)];
  return r;
}

/// Adds rows [r0, r0 + m) of a times b's block (b0, 0, k x n) into ref's rows from d0.
template <class T>
void add_block_product(reference& ref, int64_t d0, const matrix<T>& a, int64_t r0, int64_t m, const matrix<T>& b,
                       int64_t b0) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < b.cols; ++j) {
      double s = 0, g = 0;
      for (int64_t l = 0; l < a.cols; ++l) {
        const double v = double(a(r0 + i, l)) * double(b(b0 + l, j));
        s += v, g += std::abs(v);
      }
      ref.value(d0 + i, j) = s, ref.magnitude(d0 + i, j) = g;
    }
}

template <class T>
void run_case(overlap::context& ctx, const a2a_case& cs) {
  SCOPED_TRACE(cs.name());
  const int R = ctx.size(), p = ctx.rank(), E = cs.experts;
  const overlap::expert_counts want = counts_of(cs, R, p);
  const overlap::expert_counts counts = overlap::exchange_expert_counts(ctx, E, want.send);
  ASSERT_EQ(counts.recv, want.recv) << "exchange_expert_counts";
  // Every rank's inputs, from their seeds: x (dispatch's input) and w1 (its
  // experts), h (combine's input) and w2 (its experts).
  auto x_of = [&](int r) { return random_matrix<T>(counts_of(cs, R, r).sent_rows(), cs.k, cs.seed + r, cs.pad); };
  auto w1_of = [&](int r) { return random_matrix<T>(E * cs.k, cs.n, cs.seed + 100 + r, cs.pad); };
  auto h_of = [&](int r) {
    return random_matrix<T>(counts_of(cs, R, r).received_rows(), cs.n, cs.seed + 200 + r, cs.pad);
  };
  auto w2_of = [&](int r) { return random_matrix<T>(E * cs.n, cs.k, cs.seed + 300 + r, cs.pad); };
  overlap::a2a_options opt{cs.strategy};
  opt.transpose_w = cs.transpose_w;
  // The weights as the op reads them: each expert's block transposed with transpose_w.
  auto as_passed = [&](const matrix<T>& w, int64_t in) {
    if (!cs.transpose_w) return w;
    const int64_t out = w.cols;
    matrix<T> t(E * out, in, cs.pad);
    for (int e = 0; e < E; ++e)
      for (int64_t i = 0; i < in; ++i)
        for (int64_t j = 0; j < out; ++j) t(e * out + j, i) = w(e * in + i, j);
    return t;
  };

  // Dispatch: y's block (q, e) is rank q's rows for expert e of this rank times w1[e].
  const matrix<T> x = x_of(p), w1 = w1_of(p), w1_passed = as_passed(w1, cs.k);
  matrix<T> y(counts.received_rows(), cs.n, cs.pad), moved(counts.received_rows(), cs.k, cs.pad);
  if (cs.started) {
    overlap::pending op =
        cs.with_moved
            ? overlap::start_all_to_all_matmul(ctx, x.cview(), w1_passed.cview(), y.view(), moved.view(), counts, opt)
            : overlap::start_all_to_all_matmul(ctx, x.cview(), w1_passed.cview(), y.view(), counts, opt);
    volatile double busy = 0;  // the caller's own work meanwhile
    for (int i = 0; i < 10000; ++i) busy = busy + i;
    op.wait();
  } else if (cs.with_moved) {
    overlap::all_to_all_matmul(ctx, x.cview(), w1_passed.cview(), y.view(), moved.view(), counts, opt);
  } else {
    overlap::all_to_all_matmul(ctx, x.cview(), w1_passed.cview(), y.view(), counts, opt);
  }
  reference ref{matrix<double>(y.rows, cs.n), matrix<double>(y.rows, cs.n)};
  for (int q = 0; q < R; ++q) {
    const overlap::expert_counts cq = counts_of(cs, R, q);
    const matrix<T> xq = x_of(q);
    for (int e = 0; e < E; ++e) {
      const int64_t m = cq.send[size_t(p * E + e)], from = block_row(cq.send, E, p, e);
      const int64_t to = block_row(counts.recv, E, q, e);
      add_block_product(ref, to, xq, from, m, w1, e * cs.k);
      if (!cs.with_moved) continue;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < cs.k; ++j)
          ASSERT_EQ(double(moved(to + i, j)), double(xq(from + i, j)))
              << "dispatched_out row " << to + i << " (from rank " << q << ", expert " << e << ")";
    }
  }
  expect_near_block(y, ref, 0, 0, cs.k, "y");

  // Combine: out's block (q, e) is rank q's h rows from this rank for its
  // expert e times rank q's w2[e].
  const matrix<T> h = h_of(p), w2 = as_passed(w2_of(p), cs.n);
  matrix<T> out(counts.sent_rows(), cs.k, cs.pad);
  if (cs.started) {
    overlap::pending op = overlap::start_matmul_all_to_all(ctx, h.cview(), w2.cview(), out.view(), counts, opt);
    op.wait();
  } else {
    overlap::matmul_all_to_all(ctx, h.cview(), w2.cview(), out.view(), counts, opt);
  }
  reference back{matrix<double>(out.rows, cs.k), matrix<double>(out.rows, cs.k)};
  for (int q = 0; q < R; ++q) {
    const overlap::expert_counts cq = counts_of(cs, R, q);
    const matrix<T> hq = h_of(q), w2q = w2_of(q);
    for (int e = 0; e < E; ++e)
      add_block_product(back, block_row(counts.send, E, q, e), hq, block_row(cq.recv, E, p, e),
                        counts.send[size_t(q * E + e)], w2q, e * cs.n);
  }
  expect_near_block(out, back, 0, 0, cs.n, "out");
}

template <class T>
class all_to_all : public ::testing::Test {};
using element_types = ::testing::Types<float, double, overlap::bfloat16>;
TYPED_TEST_SUITE(all_to_all, element_types);

TYPED_TEST(all_to_all, every_strategy_and_routing_matches_the_reference) {
  overlap::context ctx(MPI_COMM_WORLD);
  uint32_t seed = 1;
  for (auto s : {overlap::strategy::bulk, overlap::strategy::pairwise, overlap::strategy::automatic})
    for (int experts : {1, 3})
      for (auto how : {routing::uneven, routing::zeros, routing::silent_ranks, routing::hot}) {
        a2a_case cs;
        cs.strategy = s, cs.experts = experts, cs.how = how, cs.seed = seed++;
        cs.with_moved = seed % 2 == 0;
        cs.pad = seed % 3 == 0 ? 3 : 0;
        cs.transpose_w = seed % 4 == 1;
        run_case<TypeParam>(ctx, cs);
      }
}

TYPED_TEST(all_to_all, automatic_asks_the_model_with_a_calibration) {
  // On one node without a calibration automatic is bulk; with one, the cost
  // model prices bulk and pairwise for every call's counts.
  overlap::context ctx(MPI_COMM_WORLD, with_calibration(write_file(slow_network().to_json(), "a2a-calibration")));
  uint32_t seed = 50;
  for (auto how : {routing::uneven, routing::hot, routing::silent_ranks}) {
    a2a_case cs;
    cs.strategy = overlap::strategy::automatic, cs.experts = 2, cs.how = how, cs.seed = seed++;
    cs.k = 64, cs.n = 48;
    run_case<TypeParam>(ctx, cs);
  }
  // Each op's plan says that the model chose, with both candidates' prices.
  if (ctx.size() < 2) return;
  int priced = 0;
  for (const auto& r : ctx.plan_reports()) {
    if (r.summary.find("all_to_all") == std::string::npos) continue;
    EXPECT_NE(r.schedule.find("cost model's choice"), std::string::npos) << r.summary << ": " << r.schedule;
    EXPECT_NE(r.schedule.find("pairwise"), std::string::npos) << r.schedule;
    ++priced;
  }
  EXPECT_EQ(priced, 2) << "one plan per op";
}

TYPED_TEST(all_to_all, started_ops_match_the_reference) {
  overlap::context ctx(MPI_COMM_WORLD);
  for (auto s : {overlap::strategy::bulk, overlap::strategy::pairwise}) {
    a2a_case cs;
    cs.strategy = s, cs.experts = 2, cs.how = routing::zeros, cs.started = true, cs.seed = 77;
    run_case<TypeParam>(ctx, cs);
    cs.with_moved = true, cs.seed = 78;  // and with dispatched_out
    run_case<TypeParam>(ctx, cs);
  }
}

/// A valid call on ctx after a rejected one: the context stays usable.
void valid_call(overlap::context& ctx) {
  a2a_case cs;
  cs.experts = 2, cs.seed = 9;
  run_case<float>(ctx, cs);
}

TEST(all_to_all_errors, bad_input_on_one_rank_fails_on_every_rank) {
  overlap::context ctx(MPI_COMM_WORLD);
  const int R = ctx.size(), p = ctx.rank(), E = 2;
  const int bad = R - 1;  // the rank with bad input
  a2a_case cs;
  cs.experts = E;
  overlap::expert_counts counts = counts_of(cs, R, p);
  const int64_t k = 8, n = 4;
  auto x = random_matrix<float>(counts.sent_rows(), k, 1);
  auto w = random_matrix<float>(E * k, n, 2);
  matrix<float> y(counts.received_rows(), n);
  // y with a row too many on one rank.
  matrix<float> y_long(counts.received_rows() + (p == bad ? 1 : 0), n);
  expect_all_ranks_reject(
      "y must be", [&] { overlap::all_to_all_matmul<float>(ctx, x.cview(), w.cview(), y_long.view(), counts); },
      [&] { valid_call(ctx); });
  // A strategy the op has no plan for.
  overlap::a2a_options ring{p == bad ? overlap::strategy::ring : overlap::strategy::pairwise};
  expect_all_ranks_reject(
      "a2a_options.strategy",
      [&] { overlap::all_to_all_matmul<float>(ctx, x.cview(), w.cview(), y.view(), counts, ring); },
      [&] { valid_call(ctx); });
  // A recv count that disagrees with its sender's (y sized to match, so that
  // this rank's own checks pass): noticed only across ranks.
  if (R >= 2) {
    overlap::expert_counts off = counts;
    if (p == bad) off.recv[0] += 1;  // rows from rank 0 for expert 0
    matrix<float> y_off(off.received_rows(), n);
    expect_all_ranks_reject(
        "expert_counts disagree",
        [&] { overlap::all_to_all_matmul<float>(ctx, x.cview(), w.cview(), y_off.view(), off); },
        [&] { valid_call(ctx); });
    // The combine's checks are the same path; a disagreement there too.
    matrix<float> h(off.received_rows(), n), w2 = random_matrix<float>(E * n, k, 3), out(off.sent_rows(), k);
    expect_all_ranks_reject(
        "expert_counts disagree",
        [&] { overlap::matmul_all_to_all<float>(ctx, h.cview(), w2.cview(), out.view(), off); },
        [&] { valid_call(ctx); });
    // Experts per rank differ: every rank's counts consistent with its own E.
    a2a_case one = cs;
    one.experts = p == bad ? 1 : E;
    const overlap::expert_counts c1 = counts_of(one, R, p);
    auto w1 = random_matrix<float>(one.experts * k, n, 4);
    auto x1 = random_matrix<float>(c1.sent_rows(), k, 5);
    matrix<float> y1(c1.received_rows(), n);
    expect_all_ranks_reject(
        "expert_counts.experts", [&] { overlap::all_to_all_matmul<float>(ctx, x1.cview(), w1.cview(), y1.view(), c1); },
        [&] { valid_call(ctx); });
  } else {
    overlap::expert_counts self = counts;
    self.recv[0] += 1;
    matrix<float> y_self(self.received_rows(), n);
    expect_all_ranks_reject(
        "from itself", [&] { overlap::all_to_all_matmul<float>(ctx, x.cview(), w.cview(), y_self.view(), self); },
        [&] { valid_call(ctx); });
  }
  // exchange_expert_counts with a count vector of the wrong size on one rank.
  std::vector<int64_t> send(size_t(R * E), 1);
  if (p == bad) send.pop_back();
  expect_all_ranks_reject(
      "send holds", [&] { (void)overlap::exchange_expert_counts(ctx, E, send); }, [&] { valid_call(ctx); });
}

TEST(all_to_all_errors, the_matmul_ops_reject_pairwise) {
  overlap::context ctx(MPI_COMM_WORLD);
  auto a = random_matrix<float>(4, 8, 1), b = random_matrix<float>(8, 4, 2);
  matrix<float> c(4 * ctx.size(), 4);
  overlap::ag_options opt;
  opt.strategy = overlap::strategy::pairwise;
  expect_all_ranks_reject(
      "pairwise", [&] { overlap::all_gather_matmul<float>(ctx, a.cview(), b.cview(), c.view(), opt); },
      [&] { valid_call(ctx); });
}

}  // namespace
