// Ways a job can go wrong that must end with the same clear error on every
// rank instead of a hang, a crash or a wrong result: ranks that make
// different calls, failures on one rank only (configuration, environment,
// limits of MPI), aliased outputs, communicators the library cannot use,
// a bf16 path this CPU lacks; and the bounded plan cache.
#include <gtest/gtest.h>

#include <chrono>
#include <climits>
#include <cstdlib>
#include <functional>
#include <string>

#include "ag_cases.hpp"
#include "overlap/backend/onednn.hpp"
#include "overlap/mpi/simulator.hpp"
#include "overlap/ops/checks.hpp"
#include "overlap/runtime/plan_cache.hpp"
#include "rs_cases.hpp"

using namespace testing_support;
using overlap::gathered;
using overlap::strategy;

namespace {

/// Runs `call` on every rank and expects exception E whose message contains
/// `needle` on every rank (checked collectively).
template <class E = std::invalid_argument>
void expect_everywhere(const std::function<void()>& call, const std::string& needle) {
  bool ok = false;
  try {
    call();
    ADD_FAILURE() << "no exception; expected one mentioning '" << needle << "'";
  } catch (const E& e) {
    ok = std::string(e.what()).find(needle) != std::string::npos;
    EXPECT_TRUE(ok) << "message: " << e.what() << "\nexpected it to mention: " << needle;
  }
  int mine = ok ? 1 : 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  EXPECT_EQ(all, 1) << "some rank did not throw the expected error";
}

/// A valid lhs_rows problem (2 rows of A per rank, K = 3, N = 4) in T.
template <class T>
struct ag_problem {
  matrix<T> a{2, 3}, b{3, 4}, c;
  explicit ag_problem(int ranks) : c(2 * static_cast<int64_t>(ranks), 4) {}
  void run(overlap::context& ctx, strategy s = strategy::ring) {
    overlap::ag_options opt;
    opt.strategy = s;
    overlap::all_gather_matmul<T>(ctx, a.cview(), b.cview(), c.view(), opt);
  }
};

struct robustness : ::testing::Test {
  overlap::context ctx{MPI_COMM_WORLD};
  int p = ctx.rank();
  int last = ctx.size() - 1;
  /// The context still works after a rejected call.
  void expect_usable() {
    run_ag_case<float>(ctx, {gathered::lhs_rows, strategy::ring, 6, 5, 4, split::skewed, 0, false, 3});
  }
};

// ---- ranks that make different calls ----

TEST_F(robustness, element_type_differs_across_ranks) {
  if (ctx.size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  for (strategy s : {strategy::ring, strategy::bulk})
    for (bool cached : {false, true}) {
      ag_problem<float> f(ctx.size());
      ag_problem<double> d(ctx.size());
      if (cached) {  // every rank holds plans for both types already
        f.run(ctx, s);
        d.run(ctx, s);
      }
      expect_everywhere(
          [&] { p == last ? d.run(ctx, s) : f.run(ctx, s); },
          "rank 0 called all_gather_matmul<f32>, rank " + std::to_string(last) + " called all_gather_matmul<f64>");
      expect_usable();
    }
}

TEST_F(robustness, op_differs_across_ranks) {
  if (ctx.size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  for (strategy s : {strategy::ring, strategy::bulk}) {
    ag_problem<float> ag(ctx.size());
    matrix<float> a(ctx.size(), 3), b(3, 5), c(1, 5);
    overlap::rs_options rs;
    rs.strategy = s;
    expect_everywhere(
        [&] {
          if (p == last)
            overlap::matmul_reduce_scatter<float>(ctx, a.cview(), b.cview(), c.view(), rs);
          else
            ag.run(ctx, s);
        },
        "called matmul_reduce_scatter<f32>");
    expect_usable();
  }
}

// ---- failures on one rank only ----

TEST_F(robustness, invalid_config_on_one_rank) {
  overlap::config cfg;
  if (p == last) cfg.ag_chunks = -1;
  expect_everywhere([&] { overlap::context bad(MPI_COMM_WORLD, cfg); },
                    "overlap::context: on rank " + std::to_string(last) + ": config.ag_chunks (-1)");
  expect_usable();
}

TEST_F(robustness, malformed_environment_on_one_rank) {
  if (p == last) setenv("OVERLAP_AG_CHUNKS", "abc", 1);
  expect_everywhere([&] { overlap::context bad(MPI_COMM_WORLD); },
                    "on rank " + std::to_string(last) + ": overlap: OVERLAP_AG_CHUNKS='abc' must be an integer");
  unsetenv("OVERLAP_AG_CHUNKS");
  expect_usable();
}

// The same variable read by the program itself (config::from_env(), as the
// apps do) and handed to a context: every rank hears of it, none waits.
TEST_F(robustness, malformed_environment_read_by_the_program_on_one_rank) {
  if (p == last) setenv("OVERLAP_AG_CHUNKS", "abc", 1);
  const overlap::config cfg = overlap::config::from_env();
  unsetenv("OVERLAP_AG_CHUNKS");
  expect_everywhere([&] { overlap::context bad(MPI_COMM_WORLD, cfg); },
                    "on rank " + std::to_string(last) + ": overlap: OVERLAP_AG_CHUNKS='abc' must be an integer");
  expect_usable();
}

TEST_F(robustness, leading_dimension_beyond_mpi_limits_on_one_rank) {
  // A strided shard travels as an MPI vector type, whose stride is an int:
  // an ld beyond INT_MAX cannot be expressed. Only rank `last` has it:
  // every rank must hear of it. The plan fails before any data is read, so
  // the view may claim rows the allocation lacks.
  if (ctx.size() == 1) GTEST_SKIP() << "a one-rank ring transfers nothing: no datatype is built";
  ag_problem<float> f(ctx.size());
  auto av = f.a.cview();
  if (p == last) av.ld = int64_t{INT_MAX} + 7;
  expect_everywhere(
      [&] {
        overlap::ag_options opt;
        opt.strategy = strategy::ring;
        overlap::all_gather_matmul<float>(ctx, av, f.b.cview(), f.c.view(), opt);
      },
      "exceeds the MPI count limit INT_MAX");
  expect_usable();
}

TEST_F(robustness, one_row_shard_with_a_leading_dimension_beyond_mpi_limits_is_sent_as_a_row) {
  // A one-row view may have any ld: its row is contiguous, and travels as a
  // count of floats, not a vector type. Checked against plain loops.
  const auto a = random_matrix<float>(2, 3, 11 + static_cast<uint32_t>(p));
  const auto b = random_matrix<float>(3, 4, 99);
  auto av = a.cview();
  if (p == last) av.rows = 1, av.ld = int64_t{INT_MAX} + 7;
  matrix<float> c(2 * static_cast<int64_t>(ctx.size()) - 1, 4);
  overlap::ag_options opt;
  opt.strategy = strategy::ring;
  overlap::all_gather_matmul<float>(ctx, av, b.cview(), c.view(), opt);
  int64_t row = 0;
  for (int r = 0; r < ctx.size(); ++r) {
    const auto ar = random_matrix<float>(2, 3, 11 + static_cast<uint32_t>(r));
    for (int64_t i = 0; i < (r == last ? 1 : 2); ++i, ++row)
      for (int64_t j = 0; j < 4; ++j) {
        double want = 0;
        for (int64_t q = 0; q < 3; ++q) want += double(ar(i, q)) * double(b(q, j));
        EXPECT_EQ(double(c(row, j)), want) << "row " << row << " col " << j << " (rank " << r << "'s shard)";
      }
  }
}

TEST(settings, integers_out_of_range_are_rejected_not_wrapped) {
  // Refused values are recorded in config.problems (the context raises them).
  const auto refused = [] { return !overlap::config::from_env().problems.empty(); };
  setenv("OVERLAP_AG_CHUNKS", "4294967298", 1);
  EXPECT_TRUE(refused());
  setenv("OVERLAP_AG_CHUNKS", "-1", 1);
  EXPECT_TRUE(refused());
  unsetenv("OVERLAP_AG_CHUNKS");
  setenv("OVERLAP_PROGRESS_INTERVAL_US", "99999999999999999999", 1);
  EXPECT_TRUE(refused());
  setenv("OVERLAP_PROGRESS_INTERVAL_US", "1000001", 1);
  EXPECT_TRUE(refused());
  setenv("OVERLAP_PROGRESS_INTERVAL_US", "1000000", 1);
  EXPECT_EQ(overlap::config::from_env().progress_interval.count(), 1000000);
  unsetenv("OVERLAP_PROGRESS_INTERVAL_US");
  for (const char* v : {"OVERLAP_TIMEOUT_S", "OVERLAP_PLAN_CACHE"}) {
    setenv(v, "1e3", 1);
    EXPECT_TRUE(refused()) << v;
    unsetenv(v);
  }
  setenv("OVERLAP_PLAN_CACHE", "0", 1);
  EXPECT_TRUE(refused());
  unsetenv("OVERLAP_PLAN_CACHE");
  setenv("OVERLAP_ON_FATAL", "ignore", 1);
  EXPECT_TRUE(refused());
  setenv("OVERLAP_ON_FATAL", "throw", 1);
  EXPECT_EQ(overlap::config::from_env().on_fatal, overlap::fatal_policy::throw_error);
  unsetenv("OVERLAP_ON_FATAL");
  setenv("OVERLAP_BF16_GEMM", "widened", 1);
  EXPECT_EQ(overlap::config::from_env().bf16, overlap::bf16_gemm::widened);
  unsetenv("OVERLAP_BF16_GEMM");
}

TEST(settings, the_longest_progress_interval_does_not_delay_destruction) {
  overlap::config cfg;
  cfg.progress_interval = std::chrono::microseconds(1000000);
  auto* ctx = new overlap::context(MPI_COMM_WORLD, cfg);
  ag_problem<float> f(ctx->size());
  f.run(*ctx);  // the thread has watched a group and sleeps its full interval
  const auto t0 = std::chrono::steady_clock::now();
  delete ctx;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 0.5) << "destroying a context took " << s << " s";
}

// ---- communicators the library cannot use ----

TEST(communicators, null_is_rejected) {
  try {
    overlap::context bad(MPI_COMM_NULL);
    ADD_FAILURE() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("MPI_COMM_NULL"), std::string::npos) << e.what();
  }
}

// SimGrid SMPI 3.32 has no MPI_Intercomm_create (it aborts the simulation),
// so this case is built only against a real MPI.
#if !defined(SMPI_H)
TEST(communicators, inter_communicator_is_rejected) {
  int size = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (size < 2) GTEST_SKIP() << "an inter-communicator needs two groups of ranks";
  MPI_Comm half = MPI_COMM_NULL, inter = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half);
  MPI_Intercomm_create(half, 0, MPI_COMM_WORLD, rank % 2 == 0 ? 1 : 0, 99, &inter);
  try {
    overlap::context bad(inter);
    ADD_FAILURE() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("inter-communicator"), std::string::npos) << e.what();
  }
  MPI_Comm_free(&inter);
  MPI_Comm_free(&half);
}
#endif

// ---- outputs that alias inputs ----

TEST_F(robustness, reduce_scatter_output_aliasing_b_is_rejected) {
  // c (this rank's rows of the M x N sum) placed over b on the last rank.
  const int64_t m = ctx.size();
  matrix<float> a(m, 3), b(3, 5);
  matrix<float> c(1, 5);
  expect_everywhere(
      [&] {
        overlap::matrix_view<float> cv = p == last ? b.view().block(1, 0, 1, 5) : c.view();
        overlap::matmul_reduce_scatter<float>(ctx, a.cview(), b.cview(), cv);
      },
      "c overlaps b in memory");
  expect_usable();
}

TEST_F(robustness, gathered_out_aliasing_a_is_rejected) {
  ag_problem<float> f(ctx.size());
  matrix<float> big(2 * static_cast<int64_t>(ctx.size()) + 2, 3);
  expect_everywhere(
      [&] {
        // gathered_out covers rows 0.. of `big` and, on the last rank, a sits in it.
        auto av = p == last ? big.cview().block(1, 0, 2, 3) : f.a.cview();
        overlap::all_gather_matmul<float>(ctx, av, f.b.cview(), f.c.view(), big.view().block(0, 0, f.c.rows, 3));
      },
      "gathered_out overlaps a in memory");
  expect_usable();
}

TEST_F(robustness, bias_inside_output_is_rejected) {
  ag_problem<float> f(ctx.size());
  overlap::ag_options opt;
  opt.epilogue.bias = f.c.data.data() + 4;  // row 1 of c
  expect_everywhere([&] { overlap::all_gather_matmul<float>(ctx, f.a.cview(), f.b.cview(), f.c.view(), opt); },
                    "c overlaps the epilogue's bias");
}

// Interleaved but disjoint views of one buffer are legal: A in columns 0..2,
// C in columns 3..6 of the same row-major storage.
TEST_F(robustness, interleaved_disjoint_views_are_accepted) {
  const int64_t R = ctx.size(), rows = 2 * R;
  matrix<float> both(rows, 7);
  const auto A = random_matrix<float>(rows, 3, 11), B = random_matrix<float>(3, 4, 12);
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j) both(i, j) = A(2 * p + i, j);
  overlap::all_gather_matmul<float>(ctx, both.cview().block(0, 0, 2, 3), B.cview(), both.view().block(0, 3, rows, 4));
  const auto ref = naive_matmul(A, B);
  matrix<float> c(rows, 4);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < 4; ++j) c(i, j) = both(i, 3 + j);
  expect_near_block(c, ref, 0, 0, 3, "interleaved views");
}

TEST(aliasing, exact_overlap_of_strided_blocks) {
  // Against a brute-force byte map, on small random blocks.
  std::mt19937 gen(5);
  for (int trial = 0; trial < 3000; ++trial) {
    auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen); };
    const int64_t rx = pick(0, 4), cx = pick(0, 5), ldx = cx + pick(0, 4);
    const int64_t ry = pick(0, 4), cy = pick(0, 5), ldy = cy + pick(0, 4);
    const uintptr_t bx = 100, by = static_cast<uintptr_t>(100 + pick(-30, 30));
    std::vector<int> hit(400, 0);
    for (int64_t i = 0; i < rx; ++i)
      for (int64_t j = 0; j < cx; ++j) hit[bx + static_cast<uintptr_t>(i * ldx + j)] |= 1;
    bool brute = false;
    for (int64_t i = 0; i < ry; ++i)
      for (int64_t j = 0; j < cy; ++j) brute |= (hit[by + static_cast<uintptr_t>(i * ldy + j)] & 1) != 0;
    ASSERT_EQ(overlap::detail::blocks_overlap(bx, rx, cx, ldx, by, ry, cy, ldy), brute)
        << rx << "x" << cx << "/" << ldx << " at " << bx << " vs " << ry << "x" << cy << "/" << ldy << " at " << by;
  }
}

// ---- the bf16 path ----

TEST(bf16_path, native_is_used_or_refused_clearly) {
  if (world_rank() == 0)
    std::printf("oneDNN ISA here: %s; bf16 matmul: %s\n", overlap::backend::detail::effective_isa(),
                overlap::backend::detail::native_bf16() ? "native" : "none (widened path)");
  overlap::config cfg;
  cfg.bf16 = overlap::bf16_gemm::native;
  if (overlap::backend::detail::native_bf16()) {
    overlap::context ctx(MPI_COMM_WORLD, cfg);
    EXPECT_NE(ctx.gemm_path(overlap::dtype::bf16).find("native"), std::string::npos);
    run_ag_case<overlap::bfloat16>(ctx, {gathered::lhs_cols, strategy::ring, 7, 5, 9, split::skewed});
  } else {
    expect_everywhere([&] { overlap::context ctx(MPI_COMM_WORLD, cfg); }, "bf16: OVERLAP_BF16_GEMM=native");
  }
}

TEST(bf16_path, widened_on_any_cpu) {
  overlap::config cfg;
  cfg.bf16 = overlap::bf16_gemm::widened;
  overlap::context ctx(MPI_COMM_WORLD, cfg);
  EXPECT_NE(ctx.gemm_path(overlap::dtype::bf16).find("widened"), std::string::npos);
  for (gathered g : {gathered::lhs_rows, gathered::lhs_cols, gathered::rhs_rows, gathered::rhs_cols})
    for (strategy s : {strategy::bulk, strategy::ring, strategy::bidirectional}) {
      ag_case cs{g, s, 7, 6, 9, split::skewed, 1, true, 4};
      cs.transpose_a = g == gathered::rhs_cols;
      cs.act = overlap::activation::gelu;
      cs.bias = true;
      run_ag_case<overlap::bfloat16>(ctx, cs);
    }
  for (overlap::scattered sc : {overlap::scattered::rows, overlap::scattered::cols})
    for (strategy s : {strategy::bulk, strategy::ring, strategy::bidirectional})
      for (bool bf16_transfers : {false, true}) {
        rs_case cs;
        cs.scattered = sc, cs.strategy = s, cs.m = 7, cs.n = 6, cs.k = 11, cs.k_split = split::skewed;
        cs.bias = true, cs.act = overlap::activation::relu, cs.transpose_b = true;
        cs.bf16_transfers = bf16_transfers;
        run_rs_case<overlap::bfloat16>(ctx, cs);
      }
}

// ---- the plan cache ----

TEST(plan_cache, is_bounded_and_can_be_cleared) {
  overlap::config cfg;
  cfg.plan_cache = 3;
  overlap::context ctx(MPI_COMM_WORLD, cfg);
  for (int64_t n = 1; n <= 8; ++n) {
    run_ag_case<float>(ctx, {gathered::lhs_rows, strategy::ring, 5, n, 3, split::skewed});
    EXPECT_LE(ctx.cached_plans(), 3u);
  }
  EXPECT_EQ(ctx.cached_plans(), 3u);
  // The most recent shapes are the cached ones: no rebuild for n = 8.
  const size_t built = ctx.plans_built();
  run_ag_case<float>(ctx, {gathered::lhs_rows, strategy::ring, 5, 8, 3, split::skewed});
  EXPECT_EQ(ctx.plans_built(), built);
  // One rank clears its cache: the others notice and rebuild with it.
  if (ctx.rank() == ctx.size() - 1) ctx.clear_plans();
  run_ag_case<float>(ctx, {gathered::lhs_rows, strategy::ring, 5, 8, 3, split::skewed});
  EXPECT_EQ(ctx.plans_built(), built + 1);
  ctx.clear_plans();
  EXPECT_EQ(ctx.cached_plans(), 0u);
  run_ag_case<float>(ctx, {gathered::lhs_rows, strategy::ring, 5, 8, 3, split::skewed});
  EXPECT_EQ(ctx.cached_plans(), 1u);
  // New shapes and cleared plans are built, not built again after an eviction.
  EXPECT_EQ(ctx.plans_rebuilt(), 0u);
}

TEST(plan_cache, remembers_a_bounded_number_of_evictions) {
  using overlap::detail::plan_base;
  overlap::detail::plan_cache cache(1);
  auto store = [&](int64_t k) { cache.store({k, 7}, std::make_unique<plan_base>()); };
  const auto n = static_cast<int64_t>(overlap::detail::plan_cache::remembered_evictions);
  // Key 0, then n + 1 others: the cache evicts 0 .. n, and remembers 1 .. n.
  for (int64_t k = 0; k <= n + 1; ++k) store(k);
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_NE(cache.find({n + 1, 7}), nullptr);
  EXPECT_EQ(cache.find({n, 7}), nullptr);
  store(0);  // evicted too long ago: a first build, as far as the cache knows
  EXPECT_EQ(cache.rebuilt(), 0u);
  store(2);
  EXPECT_EQ(cache.rebuilt(), 1u);
  EXPECT_EQ(cache.built(), static_cast<size_t>(n) + 4);
  EXPECT_EQ(cache.release().size(), 1u);
  EXPECT_EQ(cache.size(), 0u);
}

TEST(plan_cache, counts_an_eviction_for_one_rebuild) {
  overlap::detail::plan_cache cache(1);
  auto store = [&](int64_t k) { cache.store({k}, std::make_unique<overlap::detail::plan_base>()); };
  store(1);
  store(2);  // evicts 1
  store(1);  // built again; evicts 2
  EXPECT_EQ(cache.rebuilt(), 1u);
  store(1);  // replaced while cached (a peer lacked its plan): no eviction since, no rebuild
  EXPECT_EQ(cache.rebuilt(), 1u);
  store(2);
  EXPECT_EQ(cache.rebuilt(), 2u);
}

TEST(plan_cache, counts_and_reports_plans_built_again_after_eviction) {
  overlap::config cfg;
  cfg.plan_cache = 2;
  overlap::context ctx(MPI_COMM_WORLD, cfg);
  auto call = [&](int64_t n) {
    run_ag_case<float>(ctx, {gathered::rhs_cols, strategy::ring, 4, n, 3, split::balanced});
  };
  // Under SMPI the ranks are threads of one process and share its stderr:
  // rank 0 alone captures it there, and sees every rank's warnings.
  const bool capture = !overlap::mpi::simulated || ctx.rank() == 0;
  if (capture) testing::internal::CaptureStderr();
  // Three shapes in turn through a cache of two: after the first round every
  // call rebuilds the plan the previous call evicted.
  for (int round = 0; round < 3; ++round)
    for (int64_t n = 1; n <= 3; ++n) call(n);
  const std::string said = capture ? testing::internal::GetCapturedStderr() : std::string();
  EXPECT_EQ(ctx.plans_built(), 9u);
  EXPECT_EQ(ctx.plans_rebuilt(), 6u);
  const std::string warning = "raise OVERLAP_PLAN_CACHE";
  const size_t at = said.find(warning);
  if (ctx.rank() == 0) {
    ASSERT_NE(at, std::string::npos) << said;
    EXPECT_NE(said.find("the plan cache (plan_cache = 2) had evicted, 2 rebuilt so far"), std::string::npos) << said;
    EXPECT_EQ(said.find(warning, at + 1), std::string::npos) << "warned more than once: " << said;
  } else if (capture) {
    EXPECT_EQ(at, std::string::npos) << "only rank 0 warns: " << said;
  }
  // The two most recent shapes stay cached; a shape never seen is no rebuild.
  call(3);
  call(7);
  EXPECT_EQ(ctx.plans_built(), 10u);
  EXPECT_EQ(ctx.plans_rebuilt(), 6u);
}

TEST(plan_cache, sizes_may_differ_across_ranks) {
  overlap::config cfg;
  cfg.plan_cache = 1 + world_rank() % 3;
  overlap::context ctx(MPI_COMM_WORLD, cfg);
  for (int round = 0; round < 3; ++round)
    for (int64_t n = 1; n <= 4; ++n)
      run_ag_case<float>(ctx, {gathered::lhs_cols, strategy::ring, 5, n, 7, split::last_takes_all});
}

}  // namespace
