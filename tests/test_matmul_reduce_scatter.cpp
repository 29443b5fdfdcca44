// matmul_reduce_scatter against the naive reference: both scatterings x
// strategies x backends, uneven and empty K shards and output shards, padded
// views and chunk counts.
#include <gtest/gtest.h>

#include <tuple>

#include "rs_cases.hpp"

using namespace testing_support;
using overlap::backend_kind;
using overlap::scattered;
using overlap::strategy;

namespace {

struct shape {
  int64_t m, n, k;
};
const shape shapes[] = {{1, 1, 1}, {7, 13, 5}, {2, 3, 2}, {31, 17, 37}, {40, 64, 48}};
const split splits[] = {split::balanced, split::skewed, split::first_empty, split::last_takes_all};

using param = std::tuple<scattered, plan_choice, backend_kind>;
class rs_test : public ::testing::TestWithParam<param> {};

TEST_P(rs_test, matches_reference) {
  const auto [sc, choice, backend] = GetParam();
  for (int chunks : {0, 2, 3}) {  // 0: the plan chooses
    overlap::config cfg;
    cfg.backend = backend;
    cfg.rs_chunks = chunks;
    overlap::context ctx(MPI_COMM_WORLD, cfg);
    uint32_t seed = 1;
    for (const auto& sh : shapes)
      for (const auto how : splits)
        for (const int64_t pad : {0, 3}) {
          // K and the output are split differently, so both kinds of unevenness meet.
          const split out = how == split::balanced ? split::skewed : split::balanced;
          rs_case cs{sc, choice.strategy, sh.m, sh.n, sh.k, how, out, pad, seed++};
          cs.algorithm = choice.algorithm;
          SCOPED_TRACE(cs.name() + " chunks=" + std::to_string(chunks));
          run_rs_case<float>(ctx, cs);
          cs.k_split = out, cs.out_split = how;
          run_rs_case<float>(ctx, cs);
        }
  }
}

std::string param_name(const ::testing::TestParamInfo<param>& info) {
  return std::string(overlap::to_string(std::get<0>(info.param))) + "_" + to_string(std::get<1>(info.param)) + "_" +
         overlap::to_string(std::get<2>(info.param));
}

INSTANTIATE_TEST_SUITE_P(all, rs_test,
                         ::testing::Combine(::testing::Values(scattered::rows, scattered::cols),
                                            ::testing::ValuesIn(plan_choices),
                                            ::testing::Values(backend_kind::onednn, backend_kind::eigen)),
                         param_name);

// A repeated call with uneven shards reuses its plan: built once, on every rank.
TEST_P(rs_test, plan_is_built_once) {
  const auto [sc, choice, backend] = GetParam();
  overlap::config cfg;
  cfg.backend = backend;
  overlap::context ctx(MPI_COMM_WORLD, cfg);
  for (uint32_t seed = 1; seed <= 3; ++seed) {
    rs_case cs{sc, choice.strategy, 9, 11, 10, split::skewed, split::first_empty, 1, seed};
    cs.algorithm = choice.algorithm;
    run_rs_case<float>(ctx, cs);
  }
  EXPECT_EQ(ctx.plans_built(), 1u) << "the plan was rebuilt although nothing changed";
}

TEST(rs_double, matches_reference) {
  overlap::context ctx(MPI_COMM_WORLD);
  uint32_t seed = 1;
  for (auto sc : {scattered::rows, scattered::cols})
    for (const plan_choice& choice : plan_choices)
      for (auto how : {split::skewed, split::first_empty}) {
        rs_case cs{sc, choice.strategy, 13, 11, 17, how, split::last_takes_all, 1, seed++};
        cs.algorithm = choice.algorithm;
        run_rs_case<double>(ctx, cs);
      }
}

}  // namespace
