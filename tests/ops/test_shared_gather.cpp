// all_gather_matmul with several products of one gather (the Q, K, V
// projections of one activation): every variant, schedule and algorithm,
// f32 and bf16, transposes, an activation, accumulate, uneven and empty
// shards and products of different widths, each output against the naive
// reference; bad lists fail on every rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "overlap/overlap.hpp"
#include "reference.hpp"

using namespace testing_support;

namespace {

struct shared_case {
  overlap::gathered variant;
  overlap::strategy strategy;
  overlap::algorithm algorithm;
  bool tx, to;  ///< the gathered operand / the others stored transposed
  overlap::activation act;
  bool accumulate;
  uint32_t seed;
};

/// Runs one case: x (m x k for lhs_*, k x n for rhs_*) sharded with `how`,
/// three others of widths 4, 1 and 6 (+ rank % 2: each rank its own).
template <class T>
void run_shared(overlap::context& ctx, const shared_case& cs) {
  using overlap::gathered;
  const int R = ctx.size(), p = ctx.rank();
  const bool lhs = cs.variant == gathered::lhs_rows || cs.variant == gathered::lhs_cols;
  const bool shard_rows = cs.variant == gathered::lhs_rows || cs.variant == gathered::rhs_rows;
  const int64_t m = 3 * R + 2, k = 9, n = 2 * R + 3;
  const int64_t x_rows = lhs ? m : k, x_cols = lhs ? k : n;
  const auto X = random_matrix<T>(x_rows, x_cols, cs.seed);
  const auto sizes = shard_sizes(shard_rows ? x_rows : x_cols, R, split::skewed);
  const int64_t off = offset_of(sizes, p), len = sizes[p];
  const auto x_log = shard_rows ? slice(X, off, 0, len, x_cols) : slice(X, 0, off, x_rows, len);
  const auto x_stored = cs.tx ? transposed(x_log) : x_log;
  std::vector<matrix<T>> others, stored, cs_out;
  std::vector<matrix<double>> before;
  std::vector<overlap::matrix_view<const T>> other_views;
  std::vector<overlap::matrix_view<T>> out_views;
  for (int64_t i = 0; i < 3; ++i) {
    const int64_t width = (i == 0 ? 4 : i == 1 ? 1 : 6) + p % 2;
    others.push_back(lhs ? random_matrix<T>(k, width, cs.seed * 5 + static_cast<uint32_t>(i * 7 + p))
                         : random_matrix<T>(width, k, cs.seed * 5 + static_cast<uint32_t>(i * 7 + p)));
    stored.push_back(cs.to ? transposed(others.back()) : others.back());
    cs_out.push_back(lhs ? matrix<T>(m, width, 1) : matrix<T>(width, n, 1));
    for (auto& v : cs_out.back().data) v = T(-999);
    before.push_back(cs.accumulate ? fill_before(cs_out.back(), cs.seed + static_cast<uint32_t>(i)) : matrix<double>());
  }
  for (const auto& s : stored) other_views.push_back(s.cview());
  for (auto& c : cs_out) out_views.push_back(c.view());
  overlap::ag_options opt;
  opt.gathered = cs.variant, opt.strategy = cs.strategy, opt.algorithm = cs.algorithm;
  (lhs ? opt.transpose_a : opt.transpose_b) = cs.tx;
  (lhs ? opt.transpose_b : opt.transpose_a) = cs.to;
  opt.epilogue.activation = cs.act;
  opt.accumulate = cs.accumulate;
  overlap::all_gather_matmul<T>(ctx, x_stored.cview(), other_views, out_views, opt);
  for (size_t i = 0; i < others.size(); ++i) {
    auto ref = lhs ? naive_matmul(X, others[i]) : naive_matmul(others[i], X);
    reference_epilogue(ref, {}, cs.act);
    if (cs.accumulate) add_before(ref, before[i]);
    expect_near_block(cs_out[i], ref, 0, 0, k,
                      std::string(overlap::to_string(cs.variant)) + "/" + overlap::to_string(cs.strategy) + "/" +
                          overlap::to_string(cs.algorithm) + " product " + std::to_string(i) + " rank " +
                          std::to_string(p),
                      cs.accumulate ? accumulate_rounding<T>() : 0.0);
  }
}

template <class T>
void every_case(uint32_t seed) {
  overlap::context ctx(MPI_COMM_WORLD);
  for (const plan_choice& choice : plan_choices)
    for (auto variant : {overlap::gathered::lhs_rows, overlap::gathered::lhs_cols, overlap::gathered::rhs_rows,
                         overlap::gathered::rhs_cols})
      for (int flavour = 0; flavour < 3; ++flavour) {
        shared_case cs{variant,          choice.strategy,
                       choice.algorithm, flavour == 1,
                       flavour >= 1,     flavour == 2 ? overlap::activation::gelu : overlap::activation::none,
                       flavour == 2,     seed++};
        run_shared<T>(ctx, cs);
      }
}

TEST(shared_gather, every_variant_and_schedule_f32) { every_case<float>(1); }
TEST(shared_gather, every_variant_and_schedule_bf16) { every_case<overlap::bfloat16>(500); }

TEST(shared_gather, bad_lists_fail_on_every_rank) {
  overlap::context ctx(MPI_COMM_WORLD);
  const int R = ctx.size(), p = ctx.rank();
  std::vector<float> a(2 * 3, 1.0F), b1(3 * 2, 1.0F), b2(4 * 2, 1.0F), c(static_cast<size_t>(2 * R) * 2);
  const overlap::matrix_view<const float> av{a.data(), 2, 3};
  const overlap::matrix_view<float> cv{c.data(), 2 * R, 2};
  auto expect_invalid = [&](auto&& call, const std::string& part) {
    try {
      call();
      ADD_FAILURE() << "no error; wanted " << part;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  // Only the last rank gives a second operand with another K (4 rows, not 3).
  const overlap::matrix_view<const float> second = p == R - 1 ? overlap::matrix_view<const float>{b2.data(), 4, 2}
                                                              : overlap::matrix_view<const float>{b1.data(), 3, 2};
  expect_invalid(
      [&] {
        overlap::all_gather_matmul<float>(ctx, av, {{b1.data(), 3, 2}, second}, {cv, cv});
      },
      "on rank " + std::to_string(R - 1) +
          ": overlap::all_gather_matmul (several products): operand 1 "
          "has contracting extent 4, operand 0 has 3");
  expect_invalid(
      [&] {
        overlap::all_gather_matmul<float>(ctx, av, {{b1.data(), 3, 2}}, {cv, cv});
      },
      "one output per other operand");
  overlap::ag_options with_bias;
  std::vector<float> bias(2, 0.0F);
  with_bias.epilogue.bias = bias.data();
  expect_invalid(
      [&] {
        overlap::all_gather_matmul<float>(ctx, av, {{b1.data(), 3, 2}}, {cv}, with_bias);
      },
      "a bias is per output");
  // The context is still usable.
  overlap::all_gather_matmul<float>(ctx, av, {{b1.data(), 3, 2}}, {cv});
  EXPECT_EQ(c[0], 3.0F);
}

}  // namespace
