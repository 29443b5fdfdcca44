// Batched products (ag_options::batch, rs_options::batch): `count` members
// per call, stored one after the other with a gap (stacked), side by side in
// one wide matrix (interleaved, the layout of heads), or with the operand
// that does not travel shared by every member (stride 0); every member is
// compared with its own naive reference. Every variant, every strategy and
// algorithm, the hierarchical schedules on faked node layouts, uneven and
// empty shards, transposes, bias and GELU, gathered_out, accumulate and
// started calls, f32, bf16 and f64. A ring step sends one message whatever
// the batch (MPI_Isend counted through the profiling interface); bad batches
// are rejected on every rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <atomic>
#include <stdexcept>
#include <string>
#include <vector>

#include "ag_cases.hpp"
#include "calibrations.hpp"
#include "rs_cases.hpp"

namespace {
std::atomic<long> isends{0};  ///< MPI_Isend calls of this process
}  // namespace

// Counts the library's point-to-point sends (the MPI profiling interface).
extern "C" int MPI_Isend(const void* buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm,
                         MPI_Request* request) {
  ++isends;
  return PMPI_Isend(buf, count, type, dest, tag, comm, request);
}

using namespace testing_support;

namespace {

enum class layout { stacked, interleaved, shared };
constexpr int members = 3;

/// `count` matrices of one shape in one allocation: member i's (r, j) at
/// data[i * stride + r * ld + j]. Stacked: one after the other with a gap;
/// interleaved: side by side (ld = count * cols + 2, stride = cols);
/// shared: one matrix for all (stride 0).
template <class T>
struct batch_store {
  int64_t rows = 0, cols = 0, ld = 0, stride = 0;
  std::vector<T> data;

  batch_store(const std::vector<const matrix<T>*>& m, layout how) : rows(m[0]->rows), cols(m[0]->cols) {
    const auto count = static_cast<int64_t>(m.size());
    ld = how == layout::interleaved ? count * cols + 2 : cols + 1;
    stride = how == layout::stacked ? rows * ld + 3 : how == layout::interleaved ? cols : 0;
    data.assign(static_cast<size_t>((count - 1) * stride + rows * ld + 1), T(-777));
    for (int64_t i = 0; i < (how == layout::shared ? 1 : count); ++i)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < cols; ++j) data[static_cast<size_t>(i * stride + r * ld + j)] = (*m[i])(r, j);
  }
  overlap::matrix_view<T> view() { return {data.data(), rows, cols, ld}; }
  overlap::matrix_view<const T> cview() const { return {data.data(), rows, cols, ld}; }
  void unpack(matrix<T>& m, int64_t i) const {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < cols; ++j) m(r, j) = data[static_cast<size_t>(i * stride + r * ld + j)];
  }
};

/// The field `f` of every member's problem.
template <class P, class M>
std::vector<const M*> pointers(const std::vector<P>& problems, M P::*f) {
  std::vector<const M*> v;
  for (const auto& p : problems) v.push_back(&(p.*f));
  return v;
}

/// The members' cases (seeds cs.seed + 101 i) and their problems, built by make(case).
template <class Case, class Make>
auto member_problems(const Case& cs, Make&& make) {
  std::vector<Case> cases;
  std::vector<decltype(make(cs))> problems;
  for (int i = 0; i < members; ++i) {
    cases.push_back(cs);
    cases.back().seed = cs.seed + 101 * static_cast<uint32_t>(i);
    problems.push_back(make(cases.back()));
  }
  return std::pair{std::move(cases), std::move(problems)};
}

const char* to_string(layout how) {
  return how == layout::stacked ? "stacked" : how == layout::interleaved ? "interleaved" : "shared";
}

/// Runs case cs as one call over `members` members (seeds cs.seed + 101 i)
/// and checks each member against its own reference.
template <class T>
void run_batched_ag(overlap::context& ctx, const ag_case& cs, layout how) {
  const int64_t shared = how == layout::shared ? cs.seed * 7 + ctx.rank() : -1;
  auto [cases, pr] = member_problems(cs, [&](const ag_case& c) { return make_ag_problem<T>(ctx, c, shared); });
  const layout own = how == layout::shared ? layout::stacked : how;
  batch_store<T> x(pointers(pr, &ag_problem<T>::x_local), own), o(pointers(pr, &ag_problem<T>::other_stored), how);
  batch_store<T> c(pointers(pr, &ag_problem<T>::c), own), out(pointers(pr, &ag_problem<T>::out), own);
  const batch_store<T>& a = pr[0].lhs ? x : o;
  const batch_store<T>& b = pr[0].lhs ? o : x;
  overlap::ag_options opt = ag_options_of(cs, pr[0]);
  opt.batch = {members, a.stride, b.stride, c.stride, out.stride};
  call_ag<T>(ctx, cs, a.cview(), b.cview(), c.view(), out.view(), opt);
  for (int i = 0; i < members; ++i) {
    c.unpack(pr[i].c, i);
    out.unpack(pr[i].out, i);
    check_ag_problem(ctx, cases[i], pr[i], std::string(" ") + to_string(how) + " member " + std::to_string(i));
  }
}

/// As run_batched_ag, for matmul_reduce_scatter (B is the shared input).
template <class T>
void run_batched_rs(overlap::context& ctx, const rs_case& cs, layout how) {
  const int64_t shared = how == layout::shared ? cs.seed + 1000 : -1;
  auto [cases, pr] = member_problems(cs, [&](const rs_case& c) { return make_rs_problem<T>(ctx, c, shared); });
  const layout own = how == layout::shared ? layout::stacked : how;
  batch_store<T> a(pointers(pr, &rs_problem<T>::a), own), b(pointers(pr, &rs_problem<T>::b), how);
  batch_store<T> c(pointers(pr, &rs_problem<T>::c), own);
  overlap::rs_options opt = rs_options_of(cs, pr[0]);
  opt.batch = {members, a.stride, b.stride, c.stride, 0};
  call_rs<T>(ctx, cs, a.cview(), b.cview(), c.view(), opt);
  for (int i = 0; i < members; ++i) {
    c.unpack(pr[i].c, i);
    check_rs_problem(ctx, cases[i], pr[i], std::string(" ") + to_string(how) + " member " + std::to_string(i));
  }
}

constexpr overlap::gathered variants[] = {overlap::gathered::lhs_rows, overlap::gathered::lhs_cols,
                                          overlap::gathered::rhs_rows, overlap::gathered::rhs_cols};
constexpr split splits[] = {split::balanced, split::skewed, split::first_empty};

/// The options every batched case varies alike: the algorithm, transposes
/// by seed, bias and GELU.
template <class Case>
Case dressed(Case cs, overlap::algorithm alg) {
  cs.algorithm = alg;
  cs.transpose_a = cs.seed % 2 == 1, cs.transpose_b = cs.seed % 3 == 2;
  cs.bias = true, cs.act = overlap::activation::gelu;
  return cs;
}

void every_ag_case(overlap::context& ctx, overlap::strategy s, overlap::algorithm alg, uint32_t seed) {
  for (auto variant : variants)
    for (split how : splits) {
      ag_case cs = dressed(ag_case{variant, s, 13, 6, 9, how, 1, false, seed++}, alg);
      run_batched_ag<float>(ctx, cs, layout::stacked);
      run_batched_ag<float>(ctx, cs, layout::interleaved);
      run_batched_ag<double>(ctx, cs, layout::shared);
      run_batched_ag<overlap::bfloat16>(ctx, cs, layout::interleaved);
      cs.with_out = alg != overlap::algorithm::others;
      cs.accumulate = true, cs.started = true;
      run_batched_ag<float>(ctx, cs, layout::stacked);
    }
}

void every_rs_case(overlap::context& ctx, overlap::strategy s, overlap::algorithm alg, uint32_t seed) {
  for (auto sc : {overlap::scattered::rows, overlap::scattered::cols})
    for (split k_split : {split::balanced, split::skewed})
      for (split out_split : splits) {
        rs_case cs = dressed(rs_case{sc, s, 11, 7, 10, k_split, out_split, 1, seed++}, alg);
        run_batched_rs<float>(ctx, cs, layout::stacked);
        run_batched_rs<float>(ctx, cs, layout::interleaved);
        run_batched_rs<double>(ctx, cs, layout::shared);
        run_batched_rs<overlap::bfloat16>(ctx, cs, layout::interleaved);
        cs.bf16_transfers = s != overlap::strategy::bulk && alg != overlap::algorithm::others;
        run_batched_rs<overlap::bfloat16>(ctx, cs, layout::stacked);
        cs.bf16_transfers = false, cs.accumulate = true, cs.started = true;
        run_batched_rs<float>(ctx, cs, layout::stacked);
      }
}

class batch_choices : public ::testing::TestWithParam<plan_choice> {};

TEST_P(batch_choices, all_gather_matmul_every_member_is_exact) {
  overlap::context ctx(MPI_COMM_WORLD);
  every_ag_case(ctx, GetParam().strategy, GetParam().algorithm, 3000);
}

TEST_P(batch_choices, matmul_reduce_scatter_every_member_is_exact) {
  overlap::context ctx(MPI_COMM_WORLD);
  every_rs_case(ctx, GetParam().strategy, GetParam().algorithm, 4000);
}

std::string choice_name(const ::testing::TestParamInfo<plan_choice>& param) { return to_string(param.param); }
INSTANTIATE_TEST_SUITE_P(plans, batch_choices, ::testing::ValuesIn(plan_choices), choice_name);

// The hierarchical schedules on every two-level layout at this rank count.
TEST(batch, hierarchical_every_member_is_exact) {
  overlap::context ctx(MPI_COMM_WORLD);
  const int R = ctx.size();
  for (int slots = 2; slots <= R / 2; ++slots) {
    if (R % slots != 0) continue;
    SCOPED_TRACE(std::to_string(R / slots) + " nodes x " + std::to_string(slots) + " ranks");
    overlap::detail::set_nodes_for_testing(ctx, slots);
    every_ag_case(ctx, overlap::strategy::hierarchical, overlap::algorithm::named, 5000);
    every_rs_case(ctx, overlap::strategy::hierarchical, overlap::algorithm::named, 6000);
  }
}

// Batched calls under strategy::automatic where it measures (a calibration
// makes it ask the model on one machine): each call runs the candidate
// whose turn it is, every member exact on every call, until the choice
// settles.
TEST(batch, measured_automatic_calls_are_exact_and_settle) {
  overlap::context ctx(MPI_COMM_WORLD, with_calibration(write_file(slow_network().to_json(), "batch-calibration")));
  const ag_case ag{overlap::gathered::lhs_rows, overlap::strategy::automatic, 40, 24, 32, split::skewed, 1, false, 77};
  const rs_case rs{
      overlap::scattered::rows, overlap::strategy::automatic, 40, 24, 32, split::skewed, split::balanced, 1, 78};
  for (int call = 0; call < 8; ++call) {
    SCOPED_TRACE("call " + std::to_string(call));
    run_batched_ag<float>(ctx, ag, layout::stacked);
    run_batched_rs<float>(ctx, rs, layout::stacked);
  }
  EXPECT_EQ(ctx.measuring(), 0u);
  size_t measured = 0;
  for (const auto& p : ctx.plan_reports()) measured += p.schedule.find("measured choice") != std::string::npos;
  EXPECT_EQ(measured, ctx.size() > 1 ? 2u : 0u);
}

/// The first rows x cols member of a dense matrix holding a batch.
template <class T>
overlap::matrix_view<T> first(matrix<T>& m, int64_t rows, int64_t cols) {
  return {m.data.data(), rows, cols, cols};
}

/// MPI_Isend calls of one ring call (lhs_rows, or scattered rows) with
/// `count` members of dense 8 x 5 and 5 x 6 operands.
long ring_sends(overlap::context& ctx, int64_t count, bool rs) {
  const int R = ctx.size();
  const long before = isends.load();
  matrix<float> b(5 * count, 6);
  if (rs) {
    matrix<float> a(8 * R * count, 5), c(8 * count, 6);
    overlap::rs_options opt;
    opt.strategy = overlap::strategy::ring;
    opt.batch = {count, 8 * R * 5, 5 * 6, 8 * 6, 0};
    overlap::matmul_reduce_scatter<float>(ctx, first(a, 8 * R, 5), first(b, 5, 6), first(c, 8, 6), opt);
  } else {
    matrix<float> a(8 * count, 5), c(8 * R * count, 6);
    overlap::ag_options opt;
    opt.strategy = overlap::strategy::ring;
    opt.batch = {count, 8 * 5, 5 * 6, 8 * R * 6, 0};
    overlap::all_gather_matmul<float>(ctx, first(a, 8, 5), first(b, 5, 6), first(c, 8 * R, 6), opt);
  }
  return isends.load() - before;
}

// One message per ring step carries every member's piece: a batch of 4
// sends exactly as many messages as one product.
TEST(batch, a_ring_step_sends_one_message_for_every_member) {
  overlap::context ctx(MPI_COMM_WORLD);
  for (bool rs : {false, true}) {
    const long one = ring_sends(ctx, 1, rs), four = ring_sends(ctx, 4, rs);
    EXPECT_EQ(four, one) << (rs ? "matmul_reduce_scatter" : "all_gather_matmul");
    if (ctx.size() > 1) {
      EXPECT_GT(one, 0);
    }
  }
}

/// A batched lhs_rows call whose options or strides a test spoils.
void expect_rejected(overlap::context& ctx, const std::string& words, const overlap::batch& mine) {
  const int R = ctx.size();
  matrix<float> a(4 * 3, 5), b(5 * 3, 6), c(4 * R * 3, 6);
  overlap::ag_options opt;
  opt.strategy = overlap::strategy::ring;
  opt.batch = mine;
  try {
    overlap::all_gather_matmul<float>(ctx, first(a, 4, 5), first(b, 5, 6), first(c, 4 * R, 6), opt);
    ADD_FAILURE() << "no error for " << words;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

TEST(batch, bad_batches_are_rejected_on_every_rank) {
  overlap::context ctx(MPI_COMM_WORLD);
  const int R = ctx.size(), p = ctx.rank();
  const overlap::batch good{3, 4 * 5, 5 * 6, 4 * R * 6, 0};
  overlap::batch bad = good;
  bad.count = p == R - 1 ? 0 : 3;
  expect_rejected(ctx, "batch.count (0) must be >= 1", bad);
  bad = good;
  bad.b = p == 0 ? -1 : good.b;
  expect_rejected(ctx, "batch.b (-1) must be >= 0", bad);
  bad = good;
  bad.c = p == R - 1 ? 6 : good.c;  // member 1 starts on member 0's second row
  expect_rejected(ctx, "c's batch member 0 overlaps c's member 1", bad);
  if (R > 1) {
    bad = good;
    bad.count = p == 0 ? 2 : 3;
    expect_rejected(ctx, "ag_options.batch.count", bad);
  }
  // The context stays usable: a good batched call runs.
  matrix<float> a(4 * 3, 5), b(5 * 3, 6), c(4 * R * 3, 6);
  overlap::ag_options opt;
  opt.batch = good;
  EXPECT_NO_THROW(overlap::all_gather_matmul<float>(ctx, first(a, 4, 5), first(b, 5, 6), first(c, 4 * R, 6), opt));
}

}  // namespace
