// all_gather_matmul against the naive reference: every variant x strategy x
// backend, on shapes from 1x1x1 to primes, with empty and skewed shards,
// padded leading dimensions, chunked rings and the gathered by-product.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "ag_cases.hpp"
#include "named_cases.hpp"

using namespace testing_support;
using overlap::backend_kind;
using overlap::gathered;
using overlap::strategy;

namespace {

struct shape {
  int64_t m, n, k;
};
// 1x1x1; primes; sharded extent smaller than the rank count; a mid size.
const std::vector<shape> shapes = {{1, 1, 1}, {7, 13, 5}, {2, 3, 2}, {31, 17, 37}, {64, 40, 48}};
const std::vector<split> splits = {split::balanced, split::skewed, split::first_empty, split::last_takes_all};
const std::vector<gathered> variants = {gathered::lhs_rows, gathered::lhs_cols, gathered::rhs_rows, gathered::rhs_cols};
const std::vector<backend_kind> ag_backends = {backend_kind::onednn, backend_kind::eigen};

// One registered case: a layout, a schedule, a backend, a chunk count (0:
// the plan chooses), a shape and a split; each runs with and without padded
// leading dimensions.
struct ag_param {
  gathered variant;
  plan_choice choice;
  backend_kind backend;
  int chunks;
  shape sh;
  split how;
  uint32_t seed;
};

std::vector<ag_param> ag_params() {
  std::vector<ag_param> out;
  uint32_t seed = 1;
  for (gathered v : variants)
    for (const plan_choice& choice : plan_choices)
      for (backend_kind be : ag_backends)
        for (int chunks : {0, 1, 3})
          for (const shape& sh : shapes)
            for (split how : splits) out.push_back({v, choice, be, chunks, sh, how, seed++});
  return out;
}

std::string ag_param_name(const ::testing::TestParamInfo<ag_param>& info) {
  const ag_param& c = info.param;
  return case_name(std::string(overlap::to_string(c.variant)) + "_" + to_string(c.choice) + "_" +
                   overlap::to_string(c.backend) + "_chunks" + std::to_string(c.chunks) + "_m" +
                   std::to_string(c.sh.m) + "n" + std::to_string(c.sh.n) + "k" + std::to_string(c.sh.k) + "_" +
                   to_string(c.how));
}

class ag_test : public suite_with_contexts<ag_param> {};

TEST_P(ag_test, matches_reference) {
  const ag_param& c = GetParam();
  overlap::config cfg;
  cfg.backend = c.backend;
  cfg.ag_chunks = c.chunks;
  overlap::context& ctx = suite_context(cfg);
  for (const int64_t pad : {0, 3}) {
    // gathered_out needs the sharded operand gathered: the others cases
    // keep their padded views without it.
    ag_case cs{c.variant, c.choice.strategy,
               c.sh.m,    c.sh.n,
               c.sh.k,    c.how,
               pad,       pad != 0 && c.choice.algorithm != overlap::algorithm::others,
               c.seed};
    cs.algorithm = c.choice.algorithm;
    SCOPED_TRACE(cs.name() + " chunks=" + std::to_string(c.chunks));
    run_ag_case<float>(ctx, cs);
  }
}

INSTANTIATE_TEST_SUITE_P(all, ag_test, ::testing::ValuesIn(ag_params()), ag_param_name);

using ag_reuse_param = std::tuple<gathered, plan_choice, backend_kind>;
class ag_reuse : public ::testing::TestWithParam<ag_reuse_param> {};

// A repeated call reuses the cached plan and still computes the right thing
// with new data at new addresses.
TEST_P(ag_reuse, plan_reuse_with_new_buffers) {
  const auto [variant, choice, backend] = GetParam();
  overlap::config cfg;
  cfg.backend = backend;
  overlap::context ctx(MPI_COMM_WORLD, cfg);
  // Skewed shards: the ranks' local shapes differ, their plans must still agree.
  for (uint32_t seed = 1; seed <= 3; ++seed) {
    ag_case cs{variant, choice.strategy, 9, 11, 10, split::skewed, 1, false, seed};
    cs.algorithm = choice.algorithm;
    run_ag_case<float>(ctx, cs);
  }
  EXPECT_EQ(ctx.cached_plans(), 1u);
  EXPECT_EQ(ctx.plans_built(), 1u) << "the plan was rebuilt although nothing changed";
}

std::string ag_reuse_name(const ::testing::TestParamInfo<ag_reuse_param>& info) {
  return std::string(overlap::to_string(std::get<0>(info.param))) + "_" + to_string(std::get<1>(info.param)) + "_" +
         overlap::to_string(std::get<2>(info.param));
}

INSTANTIATE_TEST_SUITE_P(all, ag_reuse,
                         ::testing::Combine(::testing::ValuesIn(variants), ::testing::ValuesIn(plan_choices),
                                            ::testing::ValuesIn(ag_backends)),
                         ag_reuse_name);

// Shards of different sizes from one call to the next: ranks that still hold a
// plan for their own shape must not run it against peers that moved on.
TEST(ag_plan_cache, ranks_rebuild_when_peers_changed_shape) {
  overlap::context ctx(MPI_COMM_WORLD);
  const int p = ctx.rank();
  for (int round = 0; round < 3; ++round) {
    // Round 0: sizes 2,2,..; round 1: 3,3,..; round 2: rank 0 back to 2, others 3.
    const int64_t mine = (round == 0 || (round == 2 && p == 0)) ? 2 : 3;
    const int64_t k = 5, n = 4;
    const auto a = random_matrix<float>(mine, k, 100 + round * 10 + p);
    const auto b = random_matrix<float>(k, n, 7);
    std::vector<int64_t> all(static_cast<size_t>(ctx.size()));
    MPI_Allgather(&mine, 1, MPI_INT64_T, all.data(), 1, MPI_INT64_T, MPI_COMM_WORLD);
    int64_t m = 0;
    for (auto v : all) m += v;
    matrix<float> c(m, n);
    overlap::all_gather_matmul<float>(ctx, a.cview(), b.cview(), c.view());
    // Reference: gather A by hand.
    matrix<float> full(m, k);
    int64_t row = 0;
    for (int r = 0; r < ctx.size(); ++r) {
      const auto ar = random_matrix<float>(all[r], k, 100 + round * 10 + r);
      for (int64_t i = 0; i < all[r]; ++i)
        for (int64_t j = 0; j < k; ++j) full(row + i, j) = ar(i, j);
      row += all[r];
    }
    expect_near_block(c, naive_matmul(full, b), 0, 0, k, "round " + std::to_string(round));
  }
}

// double goes through the Eigen backend.
TEST(ag_double, matches_reference) {
  overlap::context ctx(MPI_COMM_WORLD);
  uint32_t seed = 1;
  for (auto variant : {gathered::lhs_rows, gathered::lhs_cols, gathered::rhs_rows, gathered::rhs_cols})
    for (const plan_choice& choice : plan_choices) {
      ag_case cs{variant, choice.strategy, 13, 7, 11, split::skewed, 1, true, seed++};
      cs.algorithm = choice.algorithm;
      run_ag_case<double>(ctx, cs);
      cs.with_out = false;
      run_ag_case<double>(ctx, cs);
    }
}

// Benchmark phases (config.phases), bulk and ring alike, lhs_rows with
// uneven shards: comm only leaves C as it was and still gathers A into
// gathered_out; compute only skips every transfer, so a rank's own rows of C
// (its shard times B) are right and nothing else is promised.
TEST(ag_phases, each_half_alone) {
  const int R = world_size(), p = world_rank();
  const int64_t n = 9, k = 11;
  const std::vector<int64_t> rows = shard_sizes(5 * R + 3, R, split::skewed);
  const int64_t m = offset_of(rows, R), mine = rows[static_cast<size_t>(p)], r0 = offset_of(rows, p);
  const matrix<float> a = random_matrix<float>(m, k, 1), b = random_matrix<float>(k, n, 2);
  const matrix<float> ap = slice(a, r0, 0, mine, k);
  const reference ref = naive_matmul(a, b);
  for (const auto strat : {strategy::bulk, strategy::ring})
    for (const auto ph : {overlap::ring_phases::comm_only, overlap::ring_phases::compute_only}) {
      SCOPED_TRACE(std::string(overlap::to_string(strat)) +
                   (ph == overlap::ring_phases::comm_only ? " comm only" : " compute only"));
      overlap::config cfg;
      cfg.phases = ph;
      overlap::context ctx(MPI_COMM_WORLD, cfg);
      matrix<float> c(m, n), out(m, k);
      for (auto& v : c.data) v = -7.0f;
      overlap::ag_options opt;
      opt.strategy = strat;
      overlap::all_gather_matmul<float>(ctx, ap.cview(), b.cview(), c.view(), out.view(), opt);
      if (ph == overlap::ring_phases::comm_only) {
        for (float v : c.data) ASSERT_EQ(v, -7.0f);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < k; ++j) ASSERT_EQ(out(i, j), a(i, j)) << i << "," << j;
      } else {
        expect_near_block(slice(c, r0, 0, mine, n), ref, r0, 0, k, "own rows");
      }
    }
}

}  // namespace
