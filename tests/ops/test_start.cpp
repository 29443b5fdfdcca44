// Started ops (start_all_gather_matmul, start_matmul_reduce_scatter): every
// variant, schedule and algorithm, f32 and bf16, with the caller computing
// something of its own between start and wait(), against the naive
// reference; one op in flight per context (other ops, a second start and
// clear_plans throw until wait()); bad input fails at start on every rank
// with nothing started; a handle destroyed unwaited waits; a second context
// runs its own op while the first one's is in flight; test() polls a started
// op to completion without blocking.
#include <gtest/gtest.h>
#include <mpi.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "ag_cases.hpp"
#include "rs_cases.hpp"

using namespace testing_support;

namespace {

template <class T>
void started_cases(uint32_t seed) {
  overlap::context ctx(MPI_COMM_WORLD);
  for (const plan_choice& choice : plan_choices) {
    for (auto variant : {overlap::gathered::lhs_rows, overlap::gathered::lhs_cols, overlap::gathered::rhs_rows,
                         overlap::gathered::rhs_cols}) {
      ag_case cs{variant, choice.strategy, 21, 11, 16, split::skewed, 1, seed % 2 == 0, seed++};
      cs.algorithm = choice.algorithm;
      cs.started = true;
      cs.accumulate = seed % 3 == 0;
      cs.bias = true;
      cs.act = overlap::activation::gelu;
      run_ag_case<T>(ctx, cs);
    }
    for (auto sc : {overlap::scattered::rows, overlap::scattered::cols}) {
      rs_case cs{sc, choice.strategy, 18, 13, 20, split::first_empty, split::skewed, 0, seed++};
      cs.algorithm = choice.algorithm;
      cs.started = true;
      cs.accumulate = seed % 3 == 0;
      run_rs_case<T>(ctx, cs);
    }
  }
  EXPECT_FALSE(ctx.busy());
}

TEST(start, every_variant_and_schedule_f32) { started_cases<float>(1); }
TEST(start, every_variant_and_schedule_bf16) { started_cases<overlap::bfloat16>(700); }

/// An lhs_rows problem of this rank: 3 rows of A, b 4 x 2, c (3R) x 2.
struct small_problem {
  std::vector<float> a = std::vector<float>(3 * 4, 1.0F), b = std::vector<float>(4 * 2, 1.0F), c;
  explicit small_problem(int R) : c(static_cast<size_t>(3 * R) * 2, 0.0F) {}
  [[nodiscard]] overlap::matrix_view<const float> av() const { return {a.data(), 3, 4}; }
  [[nodiscard]] overlap::matrix_view<const float> bv() const { return {b.data(), 4, 2}; }
  overlap::matrix_view<float> cv() { return {c.data(), static_cast<int64_t>(c.size() / 2), 2}; }
};

TEST(start, one_op_in_flight_per_context) {
  overlap::context ctx(MPI_COMM_WORLD);
  small_problem p(ctx.size()), q(ctx.size());
  overlap::pending op = overlap::start_all_gather_matmul<float>(ctx, p.av(), p.bv(), p.cv());
  EXPECT_TRUE(op.valid());
  EXPECT_TRUE(ctx.busy());
  auto expect_in_flight = [](auto&& call) {
    try {
      call();
      ADD_FAILURE() << "ran while an op was in flight";
    } catch (const std::logic_error& e) {
      EXPECT_NE(std::string(e.what()).find("in flight"), std::string::npos) << e.what();
    }
  };
  expect_in_flight([&] { overlap::all_gather_matmul<float>(ctx, q.av(), q.bv(), q.cv()); });
  expect_in_flight([&] { (void)overlap::start_all_gather_matmul<float>(ctx, q.av(), q.bv(), q.cv()); });
  expect_in_flight([&] { ctx.clear_plans(); });
  op.wait();
  EXPECT_FALSE(op.valid());
  EXPECT_FALSE(ctx.busy());
  for (float v : p.c) EXPECT_EQ(v, 4.0F);
  op.wait();                                                       // a waited handle holds nothing: a no-op
  overlap::all_gather_matmul<float>(ctx, q.av(), q.bv(), q.cv());  // usable again
  for (float v : q.c) EXPECT_EQ(v, 4.0F);
}

TEST(start, test_polls_without_blocking_and_completes_like_wait) {
  overlap::context ctx(MPI_COMM_WORLD);
  small_problem p(ctx.size());
  overlap::ag_options opt;
  opt.strategy = overlap::strategy::ring;
  overlap::pending op = overlap::start_all_gather_matmul<float>(ctx, p.av(), p.bv(), p.cv(), opt);
  // Poll as a caller would between pieces of its own work. The watchdog ends
  // a ring that never finishes, so this loop is bounded; the wall-clock bound
  // reports a test() that never turns true instead of spinning forever.
  const double give_up = MPI_Wtime() + 120;
  int polls = 0;
  while (!op.test()) {
    ++polls;
    EXPECT_TRUE(op.valid());
    EXPECT_TRUE(ctx.busy());
    if (MPI_Wtime() > give_up) {
      ADD_FAILURE() << "test() still false after 120 s (" << polls << " polls)";
      op.wait();
      break;
    }
  }
  EXPECT_FALSE(op.valid());
  EXPECT_FALSE(ctx.busy());
  for (float v : p.c) EXPECT_EQ(v, 4.0F);
  EXPECT_TRUE(op.test());  // a completed (or empty) handle tests true, as MPI_REQUEST_NULL does
  EXPECT_TRUE(overlap::pending().test());
  overlap::all_gather_matmul<float>(ctx, p.av(), p.bv(), p.cv());  // the context is free again
  for (float v : p.c) EXPECT_EQ(v, 4.0F);
}

TEST(start, bad_input_fails_at_start_on_every_rank) {
  overlap::context ctx(MPI_COMM_WORLD);
  const int R = ctx.size(), p = ctx.rank();
  small_problem pr(R);
  // The last rank's b has 5 rows: K disagrees with its a.
  std::vector<float> b5(5 * 2, 1.0F);
  const overlap::matrix_view<const float> b = p == R - 1 ? overlap::matrix_view<const float>{b5.data(), 5, 2} : pr.bv();
  try {
    overlap::pending op = overlap::start_all_gather_matmul<float>(ctx, pr.av(), b, pr.cv());
    ADD_FAILURE() << "started with bad input";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("on rank " + std::to_string(R - 1)), std::string::npos) << e.what();
  }
  EXPECT_FALSE(ctx.busy());
}

TEST(start, an_unwaited_handle_waits_when_destroyed) {
  overlap::context ctx(MPI_COMM_WORLD);
  small_problem p(ctx.size());
  { overlap::pending op = overlap::start_all_gather_matmul<float>(ctx, p.av(), p.bv(), p.cv()); }
  EXPECT_FALSE(ctx.busy());
  for (float v : p.c) EXPECT_EQ(v, 4.0F);
}

TEST(start, another_context_runs_meanwhile) {
  overlap::context first(MPI_COMM_WORLD), second(MPI_COMM_WORLD);
  for (uint32_t round = 0; round < 3; ++round) {
    small_problem p(first.size());
    overlap::ag_options opt;
    opt.strategy = overlap::strategy::ring;
    overlap::pending op = overlap::start_all_gather_matmul<float>(first, p.av(), p.bv(), p.cv(), opt);
    // While first's ring runs on its worker, second runs a blocking op of its own.
    rs_case rs{
        overlap::scattered::cols, overlap::strategy::ring, 12, 10, 15, split::skewed, split::skewed, 0, 950 + round};
    run_rs_case<float>(second, rs);
    op.wait();
    for (float v : p.c) EXPECT_EQ(v, 4.0F);
  }
}

}  // namespace
