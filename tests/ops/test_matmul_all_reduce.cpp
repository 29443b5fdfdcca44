// matmul_all_reduce against the naive reference on every rank: both ways of
// splitting the sum x strategies x backends x chunk counts, uneven and empty
// K shards, padded views; then transposes, epilogues, accumulate, batches,
// started calls, bf16 (with bf16 transfers) and double, the hierarchical
// schedule on faked node layouts, a reused plan, and bad input.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "ar_cases.hpp"
#include "named_cases.hpp"
#include "rejects.hpp"

using namespace testing_support;
using overlap::backend_kind;
using overlap::reduced;
using overlap::strategy;

namespace {

const std::vector<strategy> strategies = {strategy::bulk, strategy::ring, strategy::bidirectional, strategy::automatic};

struct ar_param {
  reduced how;
  strategy st;
  backend_kind backend;
  int chunks, groups;
  sweep_shape sh;
  split k_split;
  uint32_t seed;
};

std::vector<ar_param> ar_params() {
  std::vector<ar_param> out;
  uint32_t seed = 1;
  for (reduced how : {reduced::rows, reduced::cols})
    for (strategy st : strategies)
      for (backend_kind be : {backend_kind::onednn, backend_kind::eigen})
        for (int chunks : {0, 3})
          for (int groups : {0, 3})
            for (const sweep_shape& sh : sweep_shapes)
              for (split ks : every_split) out.push_back({how, st, be, chunks, groups, sh, ks, seed++});
  return out;
}

std::string ar_param_name(const ::testing::TestParamInfo<ar_param>& info) {
  const ar_param& c = info.param;
  return case_name(std::string(overlap::to_string(c.how)) + "_" + overlap::to_string(c.st) + "_" +
                   overlap::to_string(c.backend) + "_chunks" + std::to_string(c.chunks) + "_groups" +
                   std::to_string(c.groups) + "_m" + std::to_string(c.sh.m) + "n" + std::to_string(c.sh.n) + "k" +
                   std::to_string(c.sh.k) + "_" + to_string(c.k_split));
}

class ar_test : public suite_with_contexts<ar_param> {};

TEST_P(ar_test, matches_reference) {
  const ar_param& c = GetParam();
  overlap::config cfg;
  cfg.backend = c.backend;
  cfg.rs_chunks = c.chunks;
  cfg.ar_groups = c.groups;
  overlap::context& ctx = suite_context(cfg);
  for (const int64_t pad : {0, 3}) {
    ar_case cs{c.how, c.st, c.sh.m, c.sh.n, c.sh.k, c.k_split, pad, c.seed};
    SCOPED_TRACE(cs.name() + " chunks=" + std::to_string(c.chunks));
    run_ar_case<float>(ctx, cs);
  }
}

INSTANTIATE_TEST_SUITE_P(all, ar_test, ::testing::ValuesIn(ar_params()), ar_param_name);

/// Every option the sweep above leaves at its default, for element type T,
/// each with both ways of splitting the sum and the ring strategies.
template <class T>
void every_option(overlap::context& ctx, const std::vector<strategy>& sts, uint32_t seed) {
  for (reduced how : {reduced::rows, reduced::cols})
    for (strategy st : sts)
      for (int variant = 0; variant < 6; ++variant) {
        ar_case cs{how,   st, 23, 19, 29, variant % 2 ? split::skewed : split::first_empty, variant % 3 == 0 ? 2 : 0,
                   seed++};
        cs.transpose_a = variant == 1 || variant == 4;
        cs.transpose_b = variant == 2 || variant == 4;
        cs.bias = variant != 0;
        cs.act = variant == 3   ? overlap::activation::gelu
                 : variant == 5 ? overlap::activation::relu
                                : overlap::activation::none;
        cs.accumulate = variant == 3 || variant == 5;
        cs.batch = variant >= 4 ? 3 : 1;
        cs.started = variant == 2 || variant == 5;
        cs.bf16_transfers = std::is_same_v<T, overlap::bfloat16> && variant == 1;
        SCOPED_TRACE(cs.name());
        run_ar_case<T>(ctx, cs);
      }
}

/// A context whose rings split C into `groups` groups (ar_groups).
overlap::config grouped(int groups, backend_kind backend = backend_kind::automatic) {
  overlap::config cfg;
  cfg.ar_groups = groups;
  cfg.backend = backend;
  return cfg;
}

TEST(ar_options, every_option_f32) {
  for (int groups : {0, 3}) {
    overlap::context ctx(MPI_COMM_WORLD, grouped(groups));
    every_option<float>(ctx, strategies, 100);
  }
}
TEST(ar_options, every_option_bf16) {
  for (int groups : {0, 4}) {
    overlap::context ctx(MPI_COMM_WORLD, grouped(groups));
    every_option<overlap::bfloat16>(ctx, strategies, 200);
  }
}
TEST(ar_options, every_option_f64) {
  overlap::context ctx(MPI_COMM_WORLD, grouped(2, backend_kind::eigen));
  every_option<double>(ctx, strategies, 300);
}

// The hierarchical schedule on every two-level layout at this rank count.
TEST(ar_options, hierarchical_on_faked_nodes) {
  overlap::context ctx(MPI_COMM_WORLD, grouped(2));
  const int R = ctx.size();
  for (int slots = 2; slots <= R / 2; ++slots) {
    if (R % slots != 0) continue;
    SCOPED_TRACE(std::to_string(R / slots) + " nodes x " + std::to_string(slots) + " ranks");
    overlap::detail::set_nodes_for_testing(ctx, slots);
    overlap::ar_options two_levels;
    two_levels.strategy = strategy::hierarchical;
    matrix<float> a(8, 2), b(2, 8), c(8, 8);
    EXPECT_EQ(overlap::matmul_all_reduce_schedule<float>(ctx, a.cview(), b.cview(), c.view(), two_levels).strategy,
              strategy::hierarchical);
    every_option<float>(ctx, {strategy::hierarchical}, 400);
  }
}

// A repeated call reuses its plan; the ring strategies report their groups' chunks.
TEST(ar_options, plan_is_built_once) {
  overlap::context ctx(MPI_COMM_WORLD);
  for (uint32_t seed = 1; seed <= 3; ++seed)
    run_ar_case<float>(ctx, {reduced::rows, strategy::ring, 33, 10, 9, split::skewed, 1, seed});
  EXPECT_EQ(ctx.plans_built(), 1u) << "the plan was rebuilt although nothing changed";
}

// A larger C in 0 (the plan's choice), 1 and 5 groups: the schedule is the
// ring with its configured chunks, and every rank gets the whole sum.
TEST(ar_options, configured_groups) {
  matrix<float> a(512, 8), b(8, 256), c(512, 256);
  for (int groups : {0, 1, 5}) {
    overlap::config cfg = grouped(groups);
    cfg.rs_chunks = 2;
    overlap::context ctx(MPI_COMM_WORLD, cfg);
    overlap::ar_options ring;
    ring.strategy = strategy::ring;
    const overlap::schedule s = overlap::matmul_all_reduce_schedule<float>(ctx, a.cview(), b.cview(), c.view(), ring);
    EXPECT_EQ(s.strategy, strategy::ring);
    EXPECT_EQ(s.chunks, 2);
    for (reduced how : {reduced::rows, reduced::cols})
      run_ar_case<float>(ctx, {how, strategy::ring, 512, 256, 8, split::skewed, groups == 5 ? 2 : 0, 11});
  }
}

/// expect_all_ranks_reject, then a matmul_all_reduce on the same context.
void expect_all_ranks_reject(overlap::context& ctx, const std::string& needle, const std::function<void()>& bad) {
  testing_support::expect_all_ranks_reject(needle, bad, [&] {
    run_ar_case<float>(ctx, {reduced::rows, strategy::ring, 6, 5, 4, split::skewed, 0, 3});
  });
}

TEST(ar_errors, bad_input_on_one_rank_is_refused_everywhere) {
  overlap::context ctx(MPI_COMM_WORLD);
  const bool last = ctx.rank() == ctx.size() - 1;
  matrix<float> a(6, 4), b(4, 5), c(6, 5), small(5, 5);
  auto call = [&](overlap::matrix_view<float> cv, overlap::matrix_view<const float> bv, overlap::ar_options o) {
    overlap::matmul_all_reduce<float>(ctx, a.cview(), bv, cv, o);
  };
  expect_all_ranks_reject(ctx, "c.rows (5) must equal a.rows (6)",
                          [&] { call(last ? small.view() : c.view(), b.cview(), {}); });
  matrix<float> b6(4, 6), c6(6, 6);
  // Rules across ranks: nothing to disagree with on one rank.
  if (ctx.size() > 1)
    expect_all_ranks_reject(ctx, "b.cols (N)",
                            [&] { call(last ? c6.view() : c.view(), last ? b6.cview() : b.cview(), {}); });
  overlap::ar_options others;
  others.algorithm = overlap::algorithm::others;
  expect_all_ranks_reject(ctx, "no other-operands algorithm", [&] { call(c.view(), b.cview(), others); });
  if (ctx.size() > 1) {
    overlap::config differs;
    differs.ar_groups = last ? 2 : 3;
    overlap::context other(MPI_COMM_WORLD, differs);
    bool threw = false;
    try {
      overlap::matmul_all_reduce<float>(other, a.cview(), b.cview(), c.view());
    } catch (const std::invalid_argument& e) {
      threw = std::string(e.what()).find("config.ar_groups") != std::string::npos;
    }
    EXPECT_TRUE(threw) << "ranks with different ar_groups were not refused";
  }
  overlap::ar_options cols;
  cols.reduced = last ? overlap::reduced::cols : overlap::reduced::rows;
  if (ctx.size() > 1) expect_all_ranks_reject(ctx, "ar_options.reduced", [&] { call(c.view(), b.cview(), cols); });
  std::vector<double> wrong(5);
  overlap::ar_options typed;
  typed.epilogue.bias = wrong.data();
  expect_all_ranks_reject(ctx, "bias", [&] { call(c.view(), b.cview(), last ? typed : overlap::ar_options{}); });
}

}  // namespace
