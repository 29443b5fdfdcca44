// Bad input: every rank must raise std::invalid_argument (never hang, never
// compute), the message must name the argument and the rule, and the context
// must stay usable for a following valid call.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "ag_cases.hpp"
#include "rejects.hpp"

using namespace testing_support;
using overlap::gathered;
using overlap::strategy;

namespace {

/// expect_all_ranks_reject, then an all_gather_matmul on the same context.
void expect_all_ranks_reject(overlap::context& ctx, const std::string& needle, const std::function<void()>& bad) {
  testing_support::expect_all_ranks_reject(needle, bad, [&] {
    run_ag_case<float>(ctx, {gathered::lhs_rows, strategy::ring, 6, 5, 4, split::skewed, 0, false, 3});
  });
}

struct fixture : ::testing::Test {
  overlap::context ctx{MPI_COMM_WORLD};
  int p = ctx.rank();
  int last = ctx.size() - 1;  ///< the rank that passes the bad argument
  // A valid lhs_rows problem: 2 rows of A per rank, K = 3, N = 4.
  matrix<float> a{2, 3}, b{3, 4};
  matrix<float> c{2 * static_cast<int64_t>(ctx.size()), 4};
  void call(overlap::matrix_view<const float> av, overlap::matrix_view<const float> bv, overlap::matrix_view<float> cv,
            overlap::ag_options opt = {}) {
    overlap::all_gather_matmul<float>(ctx, av, bv, cv, opt);
  }
};

TEST_F(fixture, negative_size) {
  expect_all_ranks_reject(ctx, "a.rows (-1) must be >= 0", [&] {
    auto av = a.cview();
    if (p == last) av.rows = -1;
    call(av, b.cview(), c.view());
  });
}

TEST_F(fixture, ld_smaller_than_cols) {
  expect_all_ranks_reject(ctx, "b.ld (2) must be >= b.cols (4)", [&] {
    auto bv = b.cview();
    if (p == last) bv.ld = 2;
    call(a.cview(), bv, c.view());
  });
}

TEST_F(fixture, null_data) {
  expect_all_ranks_reject(ctx, "c.data must not be null", [&] {
    auto cv = c.view();
    if (p == last) cv.data = nullptr;
    call(a.cview(), b.cview(), cv);
  });
}

TEST_F(fixture, view_does_not_fit_variant) {
  expect_all_ranks_reject(ctx, "b.rows (4) must equal a.cols (3)", [&] {
    matrix<float> wrong_b(4, 4);  // K must be a.cols = 3
    call(a.cview(), p == last ? wrong_b.cview() : b.cview(), c.view());
  });
}

TEST_F(fixture, output_rows_do_not_match_gathered_rows) {
  expect_all_ranks_reject(ctx, "must equal M = sum of a.rows over ranks", [&] {
    matrix<float> short_c(c.rows - 1, 4);
    call(a.cview(), b.cview(), p == last ? short_c.view() : c.view());
  });
}

TEST_F(fixture, invalid_enum_value) {
  expect_all_ranks_reject(ctx, "ag_options.strategy has an invalid value 17", [&] {
    overlap::ag_options opt;
    if (p == last) opt.strategy = static_cast<strategy>(17);
    call(a.cview(), b.cview(), c.view(), opt);
  });
}

TEST_F(fixture, others_algorithm_with_a_ring_strategy) {
  expect_all_ranks_reject(
      ctx, "ag_options.algorithm others is not a ring schedule; ag_options.strategy ring cannot run it", [&] {
        overlap::ag_options opt;
        opt.algorithm = overlap::algorithm::others;
        if (p == last) opt.strategy = strategy::ring;
        call(a.cview(), b.cview(), c.view(), opt);
      });
}

// The bias remembers its element type: a double bias on a float op is
// rejected on every rank (a void* or int* bias does not compile, see
// tests/compile_fail).
TEST_F(fixture, bias_of_another_element_type) {
  const std::vector<double> bias(static_cast<size_t>(c.cols), 1.0);
  expect_all_ranks_reject(ctx, "the epilogue's bias holds f64 values; this op's element type is f32", [&] {
    overlap::ag_options opt;
    if (p == last) opt.epilogue.bias = bias.data();
    call(a.cview(), b.cview(), c.view(), opt);
  });
}

TEST_F(fixture, invalid_algorithm_value) {
  expect_all_ranks_reject(ctx, "ag_options.algorithm has an invalid value 9", [&] {
    overlap::ag_options opt;
    if (p == last) opt.algorithm = static_cast<overlap::algorithm>(9);
    call(a.cview(), b.cview(), c.view(), opt);
  });
}

// The rules below span ranks; with one rank there is no one to disagree with.
TEST_F(fixture, contracting_dim_disagrees_across_ranks) {
  if (ctx.size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  expect_all_ranks_reject(ctx, "a.cols (K) must agree across ranks", [&] {
    matrix<float> a5(2, 5), b5(5, 4);
    call(p == last ? a5.cview() : a.cview(), p == last ? b5.cview() : b.cview(), c.view());
  });
}

TEST_F(fixture, options_disagree_across_ranks) {
  if (ctx.size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  expect_all_ranks_reject(ctx, "ag_options.strategy differs across ranks", [&] {
    overlap::ag_options opt;
    opt.strategy = p == last ? strategy::bulk : strategy::ring;
    call(a.cview(), b.cview(), c.view(), opt);
  });
}

TEST_F(fixture, algorithm_disagrees_across_ranks) {
  if (ctx.size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  expect_all_ranks_reject(ctx, "ag_options.algorithm differs across ranks", [&] {
    overlap::ag_options opt;
    opt.strategy = strategy::bulk;
    opt.algorithm = p == last ? overlap::algorithm::others : overlap::algorithm::named;
    call(a.cview(), b.cview(), c.view(), opt);
  });
}

TEST_F(fixture, config_disagrees_across_ranks) {
  if (ctx.size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  overlap::config cfg;
  cfg.ag_chunks = p == last ? 2 : 1;
  overlap::context other(MPI_COMM_WORLD, cfg);
  // `other` can never agree; the recovery check runs on the fixture's context.
  expect_all_ranks_reject(ctx, "config.ag_chunks differs across ranks",
                          [&] { overlap::all_gather_matmul<float>(other, a.cview(), b.cview(), c.view()); });
}

TEST(context_errors, double_on_onednn_is_rejected) {
  overlap::config cfg;
  cfg.backend = overlap::backend_kind::onednn;
  overlap::context ctx(MPI_COMM_WORLD, cfg);
  matrix<double> a(1, 1), b(1, 1), c(static_cast<int64_t>(ctx.size()), 1);
  EXPECT_THROW(overlap::all_gather_matmul<double>(ctx, a.cview(), b.cview(), c.view()), std::invalid_argument);
}

// One rank's backend cannot multiply the dtype: every rank hears of it, also
// the ranks whose backend can (nothing on the bad rank may throw before the
// ranks agree, the plan's rate knee included).
TEST_F(fixture, backend_without_the_dtype_on_one_rank) {
  overlap::config cfg;
  cfg.backend = p == last ? overlap::backend_kind::eigen : overlap::backend_kind::automatic;
  overlap::context mixed(MPI_COMM_WORLD, cfg);
  matrix<overlap::bfloat16> x(2, 2), y(2, 2), z(2 * static_cast<int64_t>(ctx.size()), 2);
  expect_all_ranks_reject(ctx, "no bf16 matmul", [&] {
    overlap::all_gather_matmul<overlap::bfloat16>(mixed, x.cview(), y.cview(), z.view());
  });
}

// A malformed variable is recorded in the config, not thrown (from_env is
// local): the context's constructor refuses it.
TEST(context_errors, bad_environment_value) {
  const auto refused = [](const char* variable) {
    const std::string problems = overlap::config::from_env().problems;
    EXPECT_NE(problems.find(variable), std::string::npos) << variable << ": " << problems;
  };
  setenv("OVERLAP_AG_CHUNKS", "zero", 1);
  refused("OVERLAP_AG_CHUNKS='zero'");
  setenv("OVERLAP_AG_CHUNKS", "2", 1);
  EXPECT_EQ(overlap::config::from_env().ag_chunks, 2);
  unsetenv("OVERLAP_AG_CHUNKS");
  setenv("OVERLAP_PROGRESS", "sometimes", 1);
  refused("OVERLAP_PROGRESS='sometimes'");
  setenv("OVERLAP_PROGRESS", "poll", 1);
  EXPECT_EQ(overlap::config::from_env().progress, overlap::progress_policy::poll);
  unsetenv("OVERLAP_PROGRESS");
  setenv("OVERLAP_RS_CHUNKS", "1", 1);
  refused("OVERLAP_RS_CHUNKS='1'");
  unsetenv("OVERLAP_RS_CHUNKS");
  setenv("OVERLAP_VERBOSE", "2", 1);
  EXPECT_EQ(overlap::config::from_env().verbose, 2);
  unsetenv("OVERLAP_VERBOSE");
  setenv("OVERLAP_POLL_CHUNKS", "0", 1);
  refused("OVERLAP_POLL_CHUNKS='0'");
  unsetenv("OVERLAP_POLL_CHUNKS");
}

}  // namespace

namespace {

// matmul_reduce_scatter: a valid problem has a = 4 x 3, b = 3 x 5 on every
// rank (K_r = 3), c = this rank's rows of the 4 x 5 sum (balanced).
struct rs_fixture : ::testing::Test {
  overlap::context ctx{MPI_COMM_WORLD};
  int p = ctx.rank();
  int last = ctx.size() - 1;
  matrix<float> a{4, 3}, b{3, 5};
  matrix<float> c{4 / ctx.size() + (p < 4 % ctx.size() ? 1 : 0), 5};
  void call(overlap::matrix_view<const float> av, overlap::matrix_view<const float> bv, overlap::matrix_view<float> cv,
            overlap::rs_options opt = {}) {
    overlap::matmul_reduce_scatter<float>(ctx, av, bv, cv, opt);
  }
};

TEST_F(rs_fixture, malformed_view) {
  expect_all_ranks_reject(ctx, "a.ld (1) must be >= a.cols (3)", [&] {
    auto av = a.cview();
    if (p == last) av.ld = 1;
    call(av, b.cview(), c.view());
  });
}

TEST_F(rs_fixture, local_k_mismatch) {
  expect_all_ranks_reject(ctx, "b.rows (4) must equal a.cols (3), this rank's K", [&] {
    matrix<float> b4(4, 5);
    call(a.cview(), p == last ? b4.cview() : b.cview(), c.view());
  });
}

TEST_F(rs_fixture, scattered_rows_do_not_add_up) {
  expect_all_ranks_reject(ctx, "the sum of c.rows over ranks (5) must equal a.rows (M = 4)", [&] {
    matrix<float> big(c.rows + 1, 5);
    call(a.cview(), b.cview(), p == last ? big.view() : c.view());
  });
}

TEST_F(rs_fixture, m_disagrees_across_ranks) {
  if (ctx.size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  expect_all_ranks_reject(ctx, "a.rows (M) must agree across ranks", [&] {
    matrix<float> a5(5, 3);
    call(p == last ? a5.cview() : a.cview(), b.cview(), c.view());
  });
}

TEST_F(rs_fixture, transpose_option_disagrees_across_ranks) {
  if (ctx.size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  expect_all_ranks_reject(ctx, "rs_options.transpose_b differs across ranks", [&] {
    overlap::rs_options opt;
    opt.transpose_b = p == last;
    matrix<float> bt(5, 3);  // b stored transposed on that rank: shapes stay valid locally
    call(a.cview(), p == last ? bt.cview() : b.cview(), c.view(), opt);
  });
}

TEST_F(rs_fixture, others_algorithm_with_bidirectional) {
  expect_all_ranks_reject(ctx, "rs_options.algorithm others is not a ring schedule", [&] {
    overlap::rs_options opt;
    opt.algorithm = overlap::algorithm::others;
    opt.strategy = strategy::bidirectional;
    call(a.cview(), b.cview(), c.view(), opt);
  });
}

TEST(context_errors, bad_chunk_counts) {
  overlap::config one_rs_chunk, negative_ag, no_poll_band, bad_policy;
  one_rs_chunk.rs_chunks = 1;
  negative_ag.ag_chunks = -1;
  no_poll_band.poll_chunks = 0;
  bad_policy.progress = static_cast<overlap::progress_policy>(7);
  for (const auto& cfg : {one_rs_chunk, negative_ag, no_poll_band, bad_policy})
    EXPECT_THROW(overlap::context(MPI_COMM_WORLD, cfg), std::invalid_argument);
}

}  // namespace
