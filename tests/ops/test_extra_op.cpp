// A new op in one file (docs/design.md, "Adding an op"): gather_rows, the
// all-gather of a matrix's row shards into the whole matrix on every rank,
// defined here and nowhere in the library. It is all_gather_matmul's
// problem with an empty product (N = 0) and the gathered operand as its
// output, so its traits type takes that op's builders, plans, model and
// runners, and declares only what is its own: its id (from the extension
// ids), its names and its message tags. The pipeline gives it the rest:
// the checks, the agreement, the plan cache, every strategy, the cost
// model's choice, the started form.
//
// Checked against the formula each rank's rows were made from, at every
// strategy, with uneven shards and an empty rank, for f32, f64 and bf16;
// its plans are its own (not all_gather_matmul's, although their keys
// differ only in the op), and a bad call fails on every rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "overlap/ops/all_gather_matmul-inl.hpp"
#include "overlap/overlap.hpp"
#include "reference.hpp"

// ---- the op: everything gather_rows declares ----

namespace extra {
constexpr overlap::detail::op_id gather_rows_id = overlap::detail::op_id::extension_first;
}  // namespace extra

template <>
struct overlap::detail::op_info<extra::gather_rows_id> : overlap::detail::owns_tags<extra::gather_rows_id> {
  static constexpr entry_names names = OVERLAP_ENTRY_NAMES("gather_rows", "ag_options", "gathered", "ag_chunks");
};

namespace extra {

/// gather_rows as an op of the pipeline: all_gather_matmul's traits under
/// its own id, names and tags (the pipeline reads these three from Op).
template <class T>
struct gather_rows_op : overlap::detail::ag_op<T> {
  static constexpr overlap::detail::op_id id = gather_rows_id;
  static constexpr overlap::detail::entry_names names = overlap::detail::op_info<gather_rows_id>::names;
  static constexpr overlap::detail::op_tags tags = overlap::detail::op_info<gather_rows_id>::tags;
};

/// full = the row shards of every rank, in rank order (collective over ctx:
/// shard is this rank's rows x C, full is the sum of rows x C on every
/// rank, C the same everywhere). strategy: as all_gather_matmul's.
template <class T>
void gather_rows(overlap::context& ctx, overlap::matrix_view<const T> shard, overlap::matrix_view<T> full,
                 overlap::strategy strategy = overlap::strategy::automatic) {
  overlap::ag_options opt;
  opt.gathered = overlap::gathered::lhs_rows, opt.strategy = strategy;
  // The product's operands: b is C x 0 and the product M x 0 (no storage).
  const overlap::matrix_view<const T> b(nullptr, shard.cols, 0);
  const overlap::matrix_view<T> none(nullptr, full.rows, 0);
  overlap::detail::op_call<gather_rows_op<T>>(ctx, overlap::detail::ag_args<T>{shard, b, none, full, true}, opt);
}

}  // namespace extra

// ---- the tests ----

namespace {

using testing_support::world_rank;
using testing_support::world_size;

/// Rank q's rows: uneven (q + 1 parts of 3, rank 0 empty when `empty_first`).
int64_t rows_of(int q, bool empty_first) { return empty_first && q == 0 ? 0 : 3 * (q + 1) - 1; }

/// Element (i, j) of rank q's shard: exact in bf16 (small integers).
float value(int q, int64_t i, int64_t j) { return float(16 * q + (i * 7 + j) % 16); }

template <class T>
void gathers_every_rank_rows(overlap::strategy s, bool empty_first) {
  const int p = world_rank(), R = world_size();
  const int64_t cols = 5;
  int64_t total = 0;
  for (int q = 0; q < R; ++q) total += rows_of(q, empty_first);
  std::vector<T> shard(static_cast<size_t>(rows_of(p, empty_first) * cols));
  for (int64_t i = 0; i < rows_of(p, empty_first); ++i)
    for (int64_t j = 0; j < cols; ++j) shard[static_cast<size_t>(i * cols + j)] = T(value(p, i, j));
  std::vector<T> full(static_cast<size_t>(total * cols), T(-1.0F));
  overlap::context ctx(MPI_COMM_WORLD);
  extra::gather_rows<T>(ctx, {shard.data(), rows_of(p, empty_first), cols}, {full.data(), total, cols}, s);
  int64_t row = 0;
  for (int q = 0; q < R; ++q)
    for (int64_t i = 0; i < rows_of(q, empty_first); ++i, ++row)
      for (int64_t j = 0; j < cols; ++j)
        ASSERT_EQ(float(full[static_cast<size_t>(row * cols + j)]), value(q, i, j))
            << "row " << i << " of rank " << q << ", column " << j << ", " << overlap::to_string(s);
}

const overlap::strategy every_strategy[] = {overlap::strategy::bulk, overlap::strategy::ring,
                                            overlap::strategy::bidirectional, overlap::strategy::automatic};

TEST(extra_op, gather_rows_gathers_every_ranks_rows_in_rank_order_at_every_strategy) {
  for (const overlap::strategy s : every_strategy)
    for (const bool empty_first : {false, true}) {
      gathers_every_rank_rows<float>(s, empty_first);
      gathers_every_rank_rows<double>(s, empty_first);
      gathers_every_rank_rows<overlap::bfloat16>(s, empty_first);
    }
}

TEST(extra_op, its_plans_are_its_own_and_a_second_call_reuses_them) {
  const int R = world_size();
  const int64_t cols = 4, total = 2 * R;
  std::vector<float> shard(static_cast<size_t>(2 * cols), 1.0F), full(static_cast<size_t>(total * cols));
  std::vector<float> b(static_cast<size_t>(cols * 3), 1.0F), c(static_cast<size_t>(total * 3));
  overlap::context ctx(MPI_COMM_WORLD);
  const overlap::matrix_view<const float> sv(shard.data(), 2, cols);
  extra::gather_rows<float>(ctx, sv, {full.data(), total, cols}, overlap::strategy::ring);
  EXPECT_EQ(ctx.cached_plans(), 1U);
  extra::gather_rows<float>(ctx, sv, {full.data(), total, cols}, overlap::strategy::ring);
  EXPECT_EQ(ctx.cached_plans(), 1U);  // the second call of the shape: a hit
  // all_gather_matmul of the same gathered operand is another op: another plan.
  overlap::ag_options o;
  o.strategy = overlap::strategy::ring;
  overlap::all_gather_matmul<float>(ctx, sv, {b.data(), cols, 3}, {c.data(), total, 3}, o);
  EXPECT_EQ(ctx.cached_plans(), 2U);
}

TEST(extra_op, a_call_that_is_wrong_on_one_rank_fails_on_every_rank_under_its_own_name) {
  const int p = world_rank(), R = world_size();
  const int64_t cols = 4;
  std::vector<float> shard(static_cast<size_t>(2 * cols), 1.0F), full(static_cast<size_t>(2 * R * cols));
  overlap::context ctx(MPI_COMM_WORLD);
  // The last rank says its full matrix has one row too few.
  const int64_t rows = 2 * R - (p == R - 1 ? 1 : 0);
  try {
    extra::gather_rows<float>(ctx, {shard.data(), 2, cols}, {full.data(), rows, cols}, overlap::strategy::ring);
    ADD_FAILURE() << "a wrong gathered size was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("gather_rows"), std::string::npos) << e.what();
  }
}

}  // namespace
