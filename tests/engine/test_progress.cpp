// Every progress policy (thread sleeping or yielding, polling between GEMM
// bands, none) with the ring and bidirectional strategies, both ops, every
// dtype, on uneven and empty shards, against the naive reference. Also: the
// bidirectional plan really runs two lanes from three ranks on.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "ag_cases.hpp"
#include "overlap/ops/all_gather_matmul-inl.hpp"
#include "overlap/ops/matmul_reduce_scatter-inl.hpp"
#include "rs_cases.hpp"

using namespace testing_support;
using overlap::gathered;
using overlap::progress_policy;
using overlap::scattered;
using overlap::strategy;

namespace {

struct policy {
  const char* name;
  progress_policy progress;
  int interval_us;
  int poll_chunks;
};
const policy policies[] = {{"thread_sleep", progress_policy::thread, 100, 4},
                           {"thread_yield", progress_policy::thread, 0, 4},
                           {"poll_1_band", progress_policy::poll, 100, 1},
                           {"poll_3_bands", progress_policy::poll, 100, 3},
                           {"none", progress_policy::none, 100, 4}};

using param = std::tuple<int, strategy>;  // index into policies, strategy
class progress_test : public ::testing::TestWithParam<param> {
 protected:
  overlap::config config(int chunks) const {
    const policy& pol = policies[std::get<0>(GetParam())];
    overlap::config cfg;
    cfg.progress = pol.progress;
    cfg.progress_interval = std::chrono::microseconds(pol.interval_us);
    cfg.poll_chunks = pol.poll_chunks;
    cfg.ag_chunks = chunks;
    cfg.rs_chunks = chunks == 1 ? 2 : chunks;
    return cfg;
  }
};

const split splits[] = {split::skewed, split::first_empty, split::last_takes_all};

// Under SimGrid SMPI a rank's second thread must not call MPI: a context
// with the thread policy is refused on every rank, naming the simulator.
bool refused_under_smpi(const overlap::config& cfg) {
  if (!overlap::mpi::simulated || cfg.progress != progress_policy::thread) return false;
  try {
    overlap::context ctx(MPI_COMM_WORLD, cfg);
    ADD_FAILURE() << "a context with the thread policy was created under SMPI";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("SimGrid SMPI"), std::string::npos) << e.what();
  }
  return true;
}

TEST_P(progress_test, all_gather_matmul) {
  const strategy strat = std::get<1>(GetParam());
  for (int chunks : {0, 1, 2}) {
    if (refused_under_smpi(config(chunks))) continue;
    overlap::context ctx(MPI_COMM_WORLD, config(chunks));
    uint32_t seed = 1;
    for (auto variant : {gathered::lhs_rows, gathered::lhs_cols, gathered::rhs_rows, gathered::rhs_cols})
      for (auto how : splits) {
        const ag_case cs{variant, strat, 23, 9, 19, how, 1, seed % 2 == 0, seed};
        ++seed;
        SCOPED_TRACE(cs.name() + " chunks=" + std::to_string(chunks));
        run_ag_case<float>(ctx, cs);
        run_ag_case<double>(ctx, cs);
        run_ag_case<overlap::bfloat16>(ctx, cs);
      }
  }
}

TEST_P(progress_test, matmul_reduce_scatter) {
  const strategy strat = std::get<1>(GetParam());
  for (int chunks : {0, 2, 3}) {
    if (refused_under_smpi(config(chunks))) continue;
    overlap::context ctx(MPI_COMM_WORLD, config(chunks));
    uint32_t seed = 1;
    for (auto variant : {scattered::rows, scattered::cols})
      for (auto how : splits) {
        rs_case cs{variant, strat, 21, 17, 13, how, split::skewed, 1, seed++};
        cs.act = overlap::activation::relu;
        SCOPED_TRACE(cs.name() + " chunks=" + std::to_string(chunks));
        run_rs_case<float>(ctx, cs);
        run_rs_case<double>(ctx, cs);
        run_rs_case<overlap::bfloat16>(ctx, cs);
        cs.out_split = how;  // output shards uneven and empty too
        run_rs_case<float>(ctx, cs);
      }
  }
}

std::string param_name(const ::testing::TestParamInfo<param>& info) {
  return std::string(policies[std::get<0>(info.param)].name) + "_" + overlap::to_string(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(all, progress_test,
                         ::testing::Combine(::testing::Range(0, 5),
                                            ::testing::Values(strategy::ring, strategy::bidirectional)),
                         param_name);

// The plans behind the strategies: two lanes from three ranks on (half of
// every shard each way), the one-way ring below; the same step count.
TEST(bidirectional_plan, two_lanes_from_three_ranks) {
  overlap::config cfg;
  cfg.ag_chunks = 2;
  cfg.rs_chunks = 2;
  overlap::context ctx(MPI_COMM_WORLD, cfg);
  const int R = ctx.size();
  const int64_t k = 6, n = 5;
  matrix<float> a(4, k), b(k, n), c(4 * static_cast<int64_t>(R), n), rc(4, n);
  for (auto s : {strategy::ring, strategy::bidirectional}) {
    overlap::ag_options ag;
    ag.strategy = s;
    auto& plan =
        overlap::detail::prepare<overlap::detail::ag_op<float>>(ctx, {a.cview(), b.cview(), c.view(), {}, false}, ag);
    const int lanes = s == strategy::bidirectional && R >= 3 ? 2 : 1;
    EXPECT_EQ(plan.lanes, lanes) << overlap::to_string(s);
    EXPECT_EQ(plan.n_steps, 2 * R);
    EXPECT_EQ(plan.steps.size(), static_cast<size_t>(2 * R * lanes));
    overlap::rs_options rs;
    rs.strategy = s;
    matrix<float> ra(4 * static_cast<int64_t>(R), k);
    auto& rplan = overlap::detail::prepare<overlap::detail::rs_op<float>>(ctx, {ra.cview(), b.cview(), rc.view()}, rs);
    EXPECT_EQ(rplan.lanes, lanes) << overlap::to_string(s);
    EXPECT_EQ(rplan.n_steps, 2 * R);
  }
}

// The automatic policy, from facts given by hand: a thread only where MPI
// provides MULTIPLE and a hardware thread is left over; none under SMPI.
TEST(automatic_progress, decides_from_the_node) {
  using overlap::engine::choose_progress;
  overlap::mpi::node_share s;
  s.multiple = true;
  s.cpus = 8, s.ranks = 1, s.threads = 7;
  EXPECT_EQ(choose_progress(s, false).policy, progress_policy::thread) << choose_progress(s, false).why;
  s.threads = 8;
  EXPECT_EQ(choose_progress(s, false).policy, progress_policy::poll);
  EXPECT_NE(choose_progress(s, false).why.find("none free"), std::string::npos) << choose_progress(s, false).why;
  s.ranks = 2, s.threads = 3;  // 6 of 8
  EXPECT_EQ(choose_progress(s, false).policy, progress_policy::thread);
  s.ranks = 2, s.threads = 4;  // 8 of 8
  EXPECT_EQ(choose_progress(s, false).policy, progress_policy::poll);
  s.threads = 1, s.multiple = false;
  EXPECT_EQ(choose_progress(s, false).policy, progress_policy::poll);
  EXPECT_NE(choose_progress(s, false).why.find("MPI_THREAD_MULTIPLE"), std::string::npos);
  s.multiple = true;
  EXPECT_EQ(choose_progress(s, true).policy, progress_policy::none);
}

// A context resolves automatic on every rank to what this node's facts say,
// and the threads per rank come from OMP_NUM_THREADS: more threads than the
// process has hardware threads leaves none free (poll).
TEST(automatic_progress, context_resolves_it_from_this_node) {
  const overlap::mpi::node_share here = overlap::mpi::share_of_node(MPI_COMM_WORLD);
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_GE(here.ranks, 1);
  EXPECT_GE(here.cpus, 1);
  {
    overlap::context ctx(MPI_COMM_WORLD);
    if (std::getenv("OVERLAP_PROGRESS") == nullptr) {
      EXPECT_EQ(ctx.config().progress, overlap::engine::choose_progress(here, overlap::mpi::simulated).policy);
    }
    EXPECT_NE(ctx.config().progress, progress_policy::automatic);
  }
  const char* before = std::getenv("OMP_NUM_THREADS");
  const std::string saved = before == nullptr ? "" : before;
  setenv("OMP_NUM_THREADS", std::to_string(here.cpus).c_str(), 1);
  overlap::config cfg;  // automatic, whatever the environment says
  {
    overlap::context ctx(MPI_COMM_WORLD, cfg);
    EXPECT_EQ(ctx.config().progress, overlap::mpi::simulated ? progress_policy::none : progress_policy::poll);
  }
  if (before == nullptr)
    unsetenv("OMP_NUM_THREADS");
  else
    setenv("OMP_NUM_THREADS", saved.c_str(), 1);
  // Ranks whose configs name different policies still build one context.
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  cfg.progress = rank % 2 == 1 ? progress_policy::poll : progress_policy::automatic;
  overlap::context ctx(MPI_COMM_WORLD, cfg);
  std::vector<float> a(2 * 2, 1.0f), b(2 * 3, 0.5f), c(static_cast<size_t>(size) * 2 * 3, 0.0f);
  overlap::ag_options ag;
  ag.strategy = strategy::ring;
  overlap::all_gather_matmul<float>(ctx, {a.data(), 2, 2}, {b.data(), 2, 3}, {c.data(), 2 * size, 3}, ag);
  for (float v : c) EXPECT_EQ(v, 1.0f);
}

}  // namespace
