// The accumulate option of both ops (C += the op's result), for weight
// gradients summed over micro-batches: every variant, schedule and algorithm,
// f32, bf16 and f64, epilogues and transposes, uneven and empty shards,
// against the naive reference plus C's contents before the call; two calls
// into one C sum both products; ranks that disagree on the option get an
// error on every rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "ag_cases.hpp"
#include "rs_cases.hpp"

using namespace testing_support;

namespace {

constexpr overlap::gathered all_gathered[] = {overlap::gathered::lhs_rows, overlap::gathered::lhs_cols,
                                              overlap::gathered::rhs_rows, overlap::gathered::rhs_cols};

/// Shapes of a case: plain, transposed with bias and GELU, and with padding.
struct flavour {
  bool ta, tb, bias;
  overlap::activation act;
  int64_t pad;
};
constexpr flavour flavours[] = {{false, false, false, overlap::activation::none, 0},
                                {true, true, true, overlap::activation::gelu, 0},
                                {false, true, false, overlap::activation::relu, 2}};

template <class T>
void all_gather_cases(overlap::context& ctx, uint32_t seed) {
  for (const plan_choice& choice : plan_choices)
    for (auto variant : all_gathered)
      for (const flavour& f : flavours) {
        ag_case cs{variant, choice.strategy, 23, 10, 17, split::skewed, f.pad, f.pad > 0, seed++};
        cs.algorithm = choice.algorithm;
        cs.transpose_a = f.ta, cs.transpose_b = f.tb, cs.bias = f.bias, cs.act = f.act;
        cs.accumulate = true;
        run_ag_case<T>(ctx, cs);
      }
}

template <class T>
void reduce_scatter_cases(overlap::context& ctx, uint32_t seed) {
  for (const plan_choice& choice : plan_choices)
    for (auto scattered : {overlap::scattered::rows, overlap::scattered::cols})
      for (const flavour& f : flavours) {
        rs_case cs{scattered, choice.strategy, 19, 14, 21, split::first_empty, split::skewed, f.pad, seed++};
        cs.algorithm = choice.algorithm;
        cs.transpose_a = f.ta, cs.transpose_b = f.tb, cs.bias = f.bias, cs.act = f.act;
        cs.accumulate = true;
        run_rs_case<T>(ctx, cs);
      }
}

TEST(accumulate, all_gather_matmul_f32) {
  overlap::context ctx(MPI_COMM_WORLD);
  all_gather_cases<float>(ctx, 1);
}
TEST(accumulate, all_gather_matmul_bf16) {
  overlap::context ctx(MPI_COMM_WORLD);
  all_gather_cases<overlap::bfloat16>(ctx, 100);
}
TEST(accumulate, all_gather_matmul_f64) {
  overlap::context ctx(MPI_COMM_WORLD);
  all_gather_cases<double>(ctx, 200);
}
TEST(accumulate, matmul_reduce_scatter_f32) {
  overlap::context ctx(MPI_COMM_WORLD);
  reduce_scatter_cases<float>(ctx, 300);
}
TEST(accumulate, matmul_reduce_scatter_bf16) {
  overlap::context ctx(MPI_COMM_WORLD);
  reduce_scatter_cases<overlap::bfloat16>(ctx, 400);
}
TEST(accumulate, matmul_reduce_scatter_f64) {
  overlap::context ctx(MPI_COMM_WORLD);
  reduce_scatter_cases<double>(ctx, 500);
}

/// Two micro-batches into one C: C = C0 + A1 B + A2 B, through the same
/// cached plan; then a call without the option overwrites C again.
TEST(accumulate, micro_batches_sum_and_plain_calls_overwrite) {
  overlap::context ctx(MPI_COMM_WORLD);
  const int R = ctx.size(), p = ctx.rank();
  const int64_t m = 5 * R + 3, k = 7, n = 4;  // lhs_rows: this rank's rows of A (uneven), b: k x n
  const auto rows = shard_sizes(m, R, split::skewed);
  const int64_t off = offset_of(rows, p);
  const auto A1 = random_matrix<float>(m, k, 11), A2 = random_matrix<float>(m, k, 12);
  const auto B = random_matrix<float>(k, n, 13 + static_cast<uint32_t>(p));
  const auto a1 = slice(A1, off, 0, rows[p], k), a2 = slice(A2, off, 0, rows[p], k);
  for (auto strategy : {overlap::strategy::bulk, overlap::strategy::ring}) {
    SCOPED_TRACE(overlap::to_string(strategy));
    matrix<float> c(m, n);
    const matrix<double> before = fill_before(c, 17 + static_cast<uint32_t>(p));
    overlap::ag_options opt;
    opt.strategy = strategy;
    opt.accumulate = true;
    overlap::all_gather_matmul<float>(ctx, a1.cview(), B.cview(), c.view(), opt);
    overlap::all_gather_matmul<float>(ctx, a2.cview(), B.cview(), c.view(), opt);
    reference want = naive_matmul(A1, B);
    const reference second = naive_matmul(A2, B);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        want.value(i, j) += second.value(i, j);
        want.magnitude(i, j) += second.magnitude(i, j);
      }
    add_before(want, before);
    expect_near_block(c, want, 0, 0, 2 * k, "two micro-batches");
    opt.accumulate = false;
    overlap::all_gather_matmul<float>(ctx, a1.cview(), B.cview(), c.view(), opt);
    expect_near_block(c, naive_matmul(A1, B), 0, 0, k, "a plain call after accumulating");
  }
}

TEST(accumulate, ranks_that_disagree_fail_on_every_rank) {
  overlap::context ctx(MPI_COMM_WORLD);
  const int R = ctx.size(), p = ctx.rank();
  if (R == 1) GTEST_SKIP() << "needs two ranks to disagree";
  std::vector<float> a(4 * 3, 1.0F), b(3 * 2, 1.0F), c(static_cast<size_t>(4 * R) * 2, 0.0F);
  overlap::ag_options opt;
  opt.accumulate = p == R - 1;
  try {
    overlap::all_gather_matmul<float>(ctx, {a.data(), 4, 3}, {b.data(), 3, 2}, {c.data(), 4 * R, 2}, opt);
    ADD_FAILURE() << "the op ran with ranks disagreeing on accumulate";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("ag_options.accumulate differs across ranks"), std::string::npos) << e.what();
  }
  overlap::rs_options ropt;
  ropt.accumulate = p == 0;
  std::vector<float> rc(static_cast<size_t>(p == 0 ? 4 * 2 : 0));
  try {
    overlap::matmul_reduce_scatter<float>(ctx, {a.data(), 4, 3}, {b.data(), 3, 2}, {rc.data(), p == 0 ? 4 : 0, 2},
                                          ropt);
    ADD_FAILURE() << "the op ran with ranks disagreeing on accumulate";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("rs_options.accumulate differs across ranks"), std::string::npos) << e.what();
  }
}

}  // namespace
