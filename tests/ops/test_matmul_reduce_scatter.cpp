// matmul_reduce_scatter against the naive reference: both scatterings x
// strategies x backends, uneven and empty K shards and output shards, padded
// views and chunk counts.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "named_cases.hpp"
#include "rs_cases.hpp"

using namespace testing_support;
using overlap::backend_kind;
using overlap::scattered;
using overlap::strategy;

namespace {

const std::vector<scattered> rs_layouts = {scattered::rows, scattered::cols};
const std::vector<backend_kind> rs_backends = {backend_kind::onednn, backend_kind::eigen};

// One registered case: a scattering, a schedule, a backend, a chunk count (0:
// the plan chooses), a shape and the split of K; each runs with and without
// padded views, and with the output split the other way round too.
struct rs_param {
  scattered sc;
  plan_choice choice;
  backend_kind backend;
  int chunks;
  sweep_shape sh;
  split how;
  uint32_t seed;
};

std::vector<rs_param> rs_params() {
  std::vector<rs_param> out;
  uint32_t seed = 1;
  for (scattered sc : rs_layouts)
    for (const plan_choice& choice : plan_choices)
      for (backend_kind be : rs_backends)
        for (int chunks : {0, 2, 3})
          for (const sweep_shape& sh : sweep_shapes)
            for (split how : every_split) out.push_back({sc, choice, be, chunks, sh, how, seed++});
  return out;
}

std::string rs_param_name(const ::testing::TestParamInfo<rs_param>& info) {
  const rs_param& c = info.param;
  return case_name(std::string(overlap::to_string(c.sc)) + "_" + to_string(c.choice) + "_" +
                   overlap::to_string(c.backend) + "_chunks" + std::to_string(c.chunks) + "_m" +
                   std::to_string(c.sh.m) + "n" + std::to_string(c.sh.n) + "k" + std::to_string(c.sh.k) + "_" +
                   to_string(c.how));
}

class rs_test : public suite_with_contexts<rs_param> {};

TEST_P(rs_test, matches_reference) {
  const rs_param& c = GetParam();
  overlap::config cfg;
  cfg.backend = c.backend;
  cfg.rs_chunks = c.chunks;
  overlap::context& ctx = suite_context(cfg);
  for (const int64_t pad : {0, 3}) {
    // K and the output are split differently, so both kinds of unevenness meet.
    const split out = c.how == split::balanced ? split::skewed : split::balanced;
    rs_case cs{c.sc, c.choice.strategy, c.sh.m, c.sh.n, c.sh.k, c.how, out, pad, c.seed};
    cs.algorithm = c.choice.algorithm;
    SCOPED_TRACE(cs.name() + " chunks=" + std::to_string(c.chunks));
    run_rs_case<float>(ctx, cs);
    cs.k_split = out, cs.out_split = c.how;
    run_rs_case<float>(ctx, cs);
  }
}

INSTANTIATE_TEST_SUITE_P(all, rs_test, ::testing::ValuesIn(rs_params()), rs_param_name);

using rs_reuse_param = std::tuple<scattered, plan_choice, backend_kind>;
class rs_reuse : public ::testing::TestWithParam<rs_reuse_param> {};

// A repeated call with uneven shards reuses its plan: built once, on every rank.
TEST_P(rs_reuse, plan_is_built_once) {
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

std::string rs_reuse_name(const ::testing::TestParamInfo<rs_reuse_param>& info) {
  return std::string(overlap::to_string(std::get<0>(info.param))) + "_" + to_string(std::get<1>(info.param)) + "_" +
         overlap::to_string(std::get<2>(info.param));
}

INSTANTIATE_TEST_SUITE_P(all, rs_reuse,
                         ::testing::Combine(::testing::ValuesIn(rs_layouts), ::testing::ValuesIn(plan_choices),
                                            ::testing::ValuesIn(rs_backends)),
                         rs_reuse_name);

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

// On a flat ring whose accumulators are c's type and c dense, the owner
// computes its product into c before the accumulator arrives in a slot and
// adds it with the epilogue at the next step (the last after the ring); its
// sends complete by the first step that rewrites their slot. Both element
// types, both ring strategies, bias and both activations, accumulate, paced
// and unpaced, chunk counts 1-4, uneven and empty K shards and outputs.
TEST(rs_owner_ahead, matches_reference_with_the_epilogue) {
  uint32_t seed = 40;
  for (const overlap::paced_sends paced : {overlap::paced_sends::on, overlap::paced_sends::off})
    for (const int chunks : {1, 2, 4}) {
      overlap::config cfg;
      cfg.paced = paced, cfg.rs_chunks = chunks == 1 ? 0 : chunks;  // 0: the plan chooses
      overlap::context ctx(MPI_COMM_WORLD, cfg);
      for (auto sc : {scattered::rows, scattered::cols})
        for (auto s : {strategy::ring, strategy::bidirectional})
          for (auto act : {overlap::activation::gelu, overlap::activation::relu, overlap::activation::none}) {
            rs_case cs{sc, s, 14, 9, 13, split::skewed, split::first_empty, 0, seed++};
            cs.bias = act != overlap::activation::none;
            cs.act = act;
            cs.accumulate = act == overlap::activation::none;
            SCOPED_TRACE(cs.name() + " chunks=" + std::to_string(chunks));
            run_rs_case<float>(ctx, cs);
            run_rs_case<double>(ctx, cs);
          }
    }
}

}  // namespace
