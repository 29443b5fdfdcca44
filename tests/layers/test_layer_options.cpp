// What tensor-parallel layers need from both ops: transposed operands (read
// transposed by the backend), the fused epilogue (bias, relu, gelu) applied
// once per output element, and the gathered by-product; float and double.
#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "ag_cases.hpp"
#include "named_cases.hpp"
#include "rs_cases.hpp"

using namespace testing_support;
using overlap::activation;
using overlap::backend_kind;
using overlap::gathered;
using overlap::scattered;
using overlap::strategy;

namespace {

const activation acts[] = {activation::none, activation::relu, activation::gelu};

// One registered case per backend, op layout (gathered or scattered), schedule,
// transposes, activation and bias; the seed (which also picks padding and
// the gathered by-product) counts the cases of a backend.
template <class Layout>
struct option_param {
  backend_kind backend;
  Layout layout;
  plan_choice choice;
  bool ta, tb;
  activation act;
  bool bias;
  uint32_t seed;
};

template <class Layout>
std::vector<option_param<Layout>> option_params(std::initializer_list<Layout> layouts) {
  std::vector<option_param<Layout>> out;
  for (backend_kind be : {backend_kind::onednn, backend_kind::eigen}) {
    uint32_t seed = 1;
    for (Layout l : layouts)
      for (const plan_choice& choice : plan_choices)
        for (bool ta : {false, true})
          for (bool tb : {false, true})
            for (activation act : acts)
              for (bool bias : {false, true}) out.push_back({be, l, choice, ta, tb, act, bias, seed++});
  }
  return out;
}

template <class Layout>
std::string option_name(const ::testing::TestParamInfo<option_param<Layout>>& info) {
  const auto& c = info.param;
  return case_name(std::string(overlap::to_string(c.backend)) + "_" + overlap::to_string(c.layout) + "_" +
                   to_string(c.choice) + (c.ta ? "_aT" : "") + (c.tb ? "_bT" : "") + "_" + overlap::to_string(c.act) +
                   (c.bias ? "_bias" : ""));
}

class layer_options_ag : public suite_with_contexts<option_param<gathered>> {};
class layer_options_rs : public suite_with_contexts<option_param<scattered>> {};

TEST_P(layer_options_ag, all_gather_matmul) {
  const auto& c = GetParam();
  overlap::config cfg;
  cfg.backend = c.backend;
  cfg.ag_chunks = 2;
  const uint32_t seed = c.seed;
  ag_case cs{c.layout, c.choice.strategy, 11, 9, 13, split::skewed, (seed % 2) * 2, seed % 3 == 0, seed};
  cs.transpose_a = c.ta, cs.transpose_b = c.tb, cs.act = c.act, cs.bias = c.bias;
  cs.algorithm = c.choice.algorithm;
  run_ag_case<float>(suite_context(cfg), cs);
}

TEST_P(layer_options_rs, matmul_reduce_scatter) {
  const auto& c = GetParam();
  overlap::config cfg;
  cfg.backend = c.backend;
  const uint32_t seed = c.seed;
  // Every other pair of seeds (bias and not alike): 2 ring steps per shard,
  // and the other operands in 2 pieces (each piece's bias and place in c);
  // the rest as the plan chooses.
  cfg.rs_chunks = (seed / 2) % 2 == 1 ? 2 : 0;
  rs_case cs{c.layout, c.choice.strategy, 11, 9, 13, split::skewed, split::first_empty, (seed % 2) * 2, seed};
  cs.transpose_a = c.ta, cs.transpose_b = c.tb, cs.act = c.act, cs.bias = c.bias;
  cs.algorithm = c.choice.algorithm;
  run_rs_case<float>(suite_context(cfg), cs);
}

INSTANTIATE_TEST_SUITE_P(all, layer_options_ag,
                         ::testing::ValuesIn(option_params({gathered::lhs_rows, gathered::lhs_cols, gathered::rhs_rows,
                                                            gathered::rhs_cols})),
                         option_name<gathered>);
INSTANTIATE_TEST_SUITE_P(all, layer_options_rs, ::testing::ValuesIn(option_params({scattered::rows, scattered::cols})),
                         option_name<scattered>);

TEST(layer_options_double, both_ops) {
  overlap::context ctx(MPI_COMM_WORLD);
  ag_case ag{gathered::lhs_cols, strategy::ring, 10, 7, 12, split::skewed, 1, true, 5};
  ag.transpose_a = true, ag.act = activation::gelu, ag.bias = true;
  run_ag_case<double>(ctx, ag);
  rs_case rs{scattered::cols, strategy::ring, 10, 7, 12, split::skewed, split::balanced, 1, 6};
  rs.transpose_b = true, rs.act = activation::relu, rs.bias = true;
  run_rs_case<double>(ctx, rs);
}

// bfloat16 (oneDNN): fp32 accumulation inside each product; across ring steps
// the partial sums stay fp32 (AG contracting variants keep an fp32
// accumulator, RS sends fp32 accumulators) and c is rounded once. With
// bf16_transfers each hop rounds too; the tolerance grows by 2^-8 per hop.
TEST(bf16, all_gather_matmul) {
  overlap::context ctx(MPI_COMM_WORLD);
  uint32_t seed = 1;
  for (auto variant : {gathered::lhs_rows, gathered::lhs_cols, gathered::rhs_rows, gathered::rhs_cols})
    for (const plan_choice& choice : plan_choices)
      for (bool epi : {false, true}) {
        ag_case cs{variant, choice.strategy, 17, 12, 40, split::skewed, 1, seed % 2 == 0, seed};
        cs.algorithm = choice.algorithm;
        cs.transpose_a = seed % 3 == 0;
        if (epi) cs.act = activation::gelu, cs.bias = true;
        ++seed;
        run_ag_case<overlap::bfloat16>(ctx, cs);
      }
}

TEST(bf16, matmul_reduce_scatter) {
  overlap::context ctx(MPI_COMM_WORLD);
  uint32_t seed = 1;
  for (auto sc : {scattered::rows, scattered::cols})
    for (const plan_choice& choice : plan_choices)
      for (bool bf16_transfers : {false, true})
        for (bool epi : {false, true}) {
          rs_case cs{sc, choice.strategy, 14, 11, 45, split::skewed, split::first_empty, 1, seed++};
          cs.algorithm = choice.algorithm;
          cs.bf16_transfers = bf16_transfers;
          if (epi) cs.act = activation::relu, cs.bias = true;
          run_rs_case<overlap::bfloat16>(ctx, cs);
        }
}

TEST(bf16, eigen_backend_is_rejected_on_every_rank) {
  overlap::config cfg;
  cfg.backend = backend_kind::eigen;
  overlap::context ctx(MPI_COMM_WORLD, cfg);
  matrix<overlap::bfloat16> a(2, 2), b(2, 2), c(2 * static_cast<int64_t>(ctx.size()), 2);
  EXPECT_THROW(overlap::all_gather_matmul<overlap::bfloat16>(ctx, a.cview(), b.cview(), c.view()),
               std::invalid_argument);
}

// Property: for random shardings of K, the rows this rank gets from
// all_gather_matmul(lhs_cols), the transpose of what matmul_reduce_scatter(cols)
// gives for the transposed problem (B^T A^T), and the single-rank product agree.
TEST(ag_rs_property, transposed_problem_agrees) {
  overlap::context ctx(MPI_COMM_WORLD);
  const int R = ctx.size(), p = ctx.rank();
  std::mt19937 gen(2024);  // same sequence on every rank
  for (int trial = 0; trial < 8; ++trial) {
    const int64_t m = 1 + gen() % 20, n = 1 + gen() % 20;
    std::vector<int64_t> ks(static_cast<size_t>(R)), ms(static_cast<size_t>(R));
    int64_t k = 0, msum = 0;
    for (int r = 0; r < R; ++r) k += ks[r] = gen() % 7;
    // Output rows of each rank: a random split of m.
    for (int r = 0; r < R - 1; ++r) msum += ms[r] = static_cast<int64_t>(gen() % static_cast<uint32_t>(m - msum + 1));
    ms[R - 1] = m - msum;
    const auto A = random_matrix<float>(m, k, 10 + trial), B = random_matrix<float>(k, n, 20 + trial);
    const int64_t koff = offset_of(ks, p), moff = offset_of(ms, p);
    const auto a_r = slice(A, 0, koff, m, ks[p]), b_r = slice(B, koff, 0, ks[p], n);

    matrix<float> c_ag(m, n);
    overlap::ag_options ag;
    ag.gathered = gathered::lhs_cols;
    overlap::all_gather_matmul<float>(ctx, a_r.cview(), B.cview(), c_ag.view(), ag);

    // Transposed problem: op(a') = B_r^T (n x K_r) stored as b_r with transpose_a,
    // op(b') = A_r^T (K_r x m) stored as a_r with transpose_b; scatter columns (m).
    matrix<float> ct(n, ms[p]);
    overlap::rs_options rs;
    rs.scattered = scattered::cols;
    rs.transpose_a = rs.transpose_b = true;
    overlap::matmul_reduce_scatter<float>(ctx, b_r.cview(), a_r.cview(), ct.view(), rs);

    const auto ref = naive_matmul(A, B);
    expect_near_block(c_ag, ref, 0, 0, k, "AG trial " + std::to_string(trial));
    expect_near_block(transposed(ct), ref, moff, 0, k, "RS^T trial " + std::to_string(trial));
  }
}

}  // namespace
