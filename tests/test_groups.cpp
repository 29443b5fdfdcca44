// Contexts on groups smaller than the world, as a mesh makes them: the world
// split into two disjoint halves (a tensor-parallel group each, of different
// sizes at odd rank counts), each half running both ops with every schedule
// on uneven shards at the same time as the other half; and two contexts on
// one communicator used alternately, each keeping its own plans. Results
// against the naive reference, on every rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>

#include "ag_cases.hpp"
#include "rs_cases.hpp"

using namespace testing_support;

namespace {

/// The half of the world this rank is in (ranks [0, R/2) and [R/2, R); at one
/// rank, the world itself), as its own communicator.
class half_of_world {
 public:
  half_of_world() {
    int r = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    color_ = size > 1 && r >= size / 2 ? 1 : 0;
    MPI_Comm_split(MPI_COMM_WORLD, color_, r, &comm_);
  }
  half_of_world(const half_of_world&) = delete;
  half_of_world& operator=(const half_of_world&) = delete;
  ~half_of_world() { MPI_Comm_free(&comm_); }
  [[nodiscard]] MPI_Comm comm() const { return comm_; }
  [[nodiscard]] int color() const { return color_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int color_ = 0;
};

TEST(groups, disjoint_halves_run_both_ops_concurrently) {
  half_of_world half;
  overlap::context ctx(half.comm());
  uint32_t seed = 1;
  for (const plan_choice& choice : plan_choices)
    for (auto variant : {overlap::gathered::lhs_rows, overlap::gathered::lhs_cols, overlap::gathered::rhs_rows,
                         overlap::gathered::rhs_cols}) {
      // The halves multiply different problems (their own shapes and data).
      ag_case cs{variant, choice.strategy, 23 + 4 * half.color(), 9, 17, split::skewed, 1, false, seed++};
      cs.algorithm = choice.algorithm;
      SCOPED_TRACE("half " + std::to_string(half.color()) + " of " + std::to_string(ctx.size()) + " ranks");
      run_ag_case<float>(ctx, cs);
    }
  for (const plan_choice& choice : plan_choices)
    for (auto sc : {overlap::scattered::rows, overlap::scattered::cols}) {
      rs_case cs{sc, choice.strategy, 19, 14 + 3 * half.color(), 21, split::first_empty, split::skewed, 1, seed++};
      cs.algorithm = choice.algorithm;
      SCOPED_TRACE("half " + std::to_string(half.color()) + " of " + std::to_string(ctx.size()) + " ranks");
      run_rs_case<float>(ctx, cs);
    }
}

TEST(groups, two_contexts_on_one_communicator_alternate) {
  overlap::config chunked;
  chunked.ag_chunks = 3;
  chunked.rs_chunks = 2;
  overlap::context first(MPI_COMM_WORLD), second(MPI_COMM_WORLD, chunked);
  for (uint32_t round = 0; round < 3; ++round)
    for (const plan_choice& choice : plan_choices) {
      for (overlap::context* ctx : {&first, &second}) {
        ag_case ag{overlap::gathered::lhs_rows, choice.strategy, 13, 7, 11, split::skewed, 0, false, 40 + round};
        ag.algorithm = choice.algorithm;
        run_ag_case<float>(*ctx, ag);
        rs_case rs{
            overlap::scattered::cols, choice.strategy, 9, 12, 10, split::skewed, split::last_takes_all, 0, 50 + round};
        rs.algorithm = choice.algorithm;
        run_rs_case<float>(*ctx, rs);
      }
    }
  // Each context built its own plans once and reused them in later rounds.
  EXPECT_EQ(first.plans_built(), 2 * std::size(plan_choices));
  EXPECT_EQ(second.plans_built(), 2 * std::size(plan_choices));
}

}  // namespace
