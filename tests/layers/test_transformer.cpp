// The tensor-parallel transformer block (overlap/layers/transformer.hpp):
// forward output, dx and every parameter gradient against a single-rank
// double-precision reference written with plain loops
// (transformer_reference.hpp), in f32, bf16 and f64, every strategy, with
// uneven sequence, head and MLP shards (and ranks holding none); gradients
// against central finite differences of the distributed f64 block; bad
// input rejected on every rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <overlap/layers/example_values.hpp>
#include <overlap/layers/transformer.hpp>
#include <overlap/runtime/mesh.hpp>

#include "transformer_reference.hpp"

using overlap::layers::block_layout;
using overlap::layers::block_params;
using overlap::layers::block_shape;
using overlap::layers::transformer_block;

namespace {

template <class T>
double rounded(double v) {
  return overlap::layers::detail::cast<double>(overlap::layers::detail::cast<T>(v));
}

template <class T>
struct fixture {
  block_shape s;
  reference::block ref;
  reference::mat x, dout, dx_ref;
  reference::params g_ref;

  explicit fixture(const block_shape& shape) : s(shape), ref(shape, reference::make_params(shape)) {
    for (auto& [name, m] : ref.w)
      for (int64_t i = 0; i < m.r; ++i)
        for (int64_t j = 0; j < m.c; ++j) m(i, j) = rounded<T>(overlap::layers::example_parameter(s, name, i, j));
    x = reference::mat(s.seq, s.hidden), dout = reference::mat(s.seq, s.hidden);
    for (int64_t i = 0; i < s.seq; ++i)
      for (int64_t j = 0; j < s.hidden; ++j)
        x(i, j) = rounded<T>(overlap::layers::example_value("x", i, j)),
             dout(i, j) = rounded<T>(overlap::layers::example_value("dout", i, j));
    ref.forward(x);
    g_ref = ref.backward(dout, dx_ref);
  }

  void set_params(transformer_block<T>& blk) const {
    overlap::layers::visit(blk.params(), blk.layout(), [&](const char* name, T& v, int64_t i, int64_t j) {
      v = overlap::layers::detail::cast<T>(ref.w.at(name)(i, j));
    });
  }
  /// This rank's rows of a global matrix, as T.
  std::vector<T> rows(const reference::mat& m, const block_layout& l) const {
    std::vector<T> out(size_t(l.rows() * s.hidden));
    for (int64_t i = 0; i < l.rows(); ++i)
      for (int64_t j = 0; j < s.hidden; ++j)
        out[size_t(i * s.hidden + j)] = overlap::layers::detail::cast<T>(m(l.token(i), j));
    return out;
  }
};

double max_abs(const reference::mat& m) {
  double a = 1e-300;
  for (double v : m.v) a = std::max(a, std::fabs(v));
  return a;
}

/// Largest error of any tensor relative to the tensor's largest entry; the
/// worst tensor's name in `worst`. Max over ranks. With a cp context the
/// block is the two-axis one, and its gradients are summed over cp first.
template <class T>
double run_and_compare(overlap::context& ctx, overlap::context* cp, const block_shape& s,
                       const overlap::layers::block_options& opt, std::string& worst) {
  const fixture<T> f(s);
  auto made = cp != nullptr ? std::make_unique<transformer_block<T>>(ctx, *cp, s, opt)
                            : std::make_unique<transformer_block<T>>(ctx, s, opt);
  transformer_block<T>& blk = *made;
  f.set_params(blk);
  const block_layout& l = blk.layout();
  const int64_t n = l.rows(), d = s.hidden;
  const std::vector<T> x = f.rows(f.x, l), dout = f.rows(f.dout, l);
  std::vector<T> out(x.size()), dx(x.size());
  blk.forward({x.data(), n, d}, {out.data(), n, d});
  blk.backward({dout.data(), n, d}, {dx.data(), n, d});

  double err = 0;
  auto note = [&](const std::string& name, double got, double want, double scale) {
    const double e = std::fabs(got - want) / scale;
    if (!(e <= err)) err = e, worst = name;  // also catches NaN
  };
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < d; ++j) {
      note("out", double(overlap::layers::detail::cast<double>(out[size_t(i * d + j)])), f.ref.out(l.token(i), j),
           max_abs(f.ref.out));
      note("dx", overlap::layers::detail::cast<double>(dx[size_t(i * d + j)]), f.dx_ref(l.token(i), j),
           max_abs(f.dx_ref));
    }
  auto grads = blk.grads();
  if (cp != nullptr)  // each share's part: the whole sequence's gradient is their sum
    grads.each([&](const char*, auto& v, bool) {
      using acc = typename std::decay_t<decltype(v)>::value_type;
      MPI_Allreduce(MPI_IN_PLACE, v.data(), int(v.size()), std::is_same_v<acc, double> ? MPI_DOUBLE : MPI_FLOAT,
                    MPI_SUM, cp->comm());
    });
  overlap::layers::visit(grads, l, [&](const char* name, auto& v, int64_t i, int64_t j) {
    const reference::mat& want = f.g_ref.at(name);
    note(std::string("d") + name, double(v), want(i, j), max_abs(want));
  });
  double all = 0;
  MPI_Allreduce(&err, &all, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (all != err) worst = "(another rank's)";
  return all;
}

const block_shape uneven{13, 16, 4, 24};  // 13 tokens and 4 heads over 2-5 ranks: uneven, some with no head
const block_shape tiny{3, 8, 2, 6};       // fewer tokens than ranks at 4 and 5

const overlap::strategy strategies[] = {overlap::strategy::bulk, overlap::strategy::ring,
                                        overlap::strategy::bidirectional, overlap::strategy::automatic};

std::string describe(const block_shape& s, const overlap::layers::block_options& o, int cp) {
  return "seq " + std::to_string(s.seq) + " hidden " + std::to_string(s.hidden) + " heads " + std::to_string(s.heads) +
         " ffn " + std::to_string(s.ffn) + " strategy " + overlap::to_string(o.strategy) + " overlapped wgrad " +
         std::to_string(o.overlap_weight_gradients) + " in waits " + std::to_string(o.weight_gradients_in_waits) +
         " attention block " + std::to_string(o.attention_block) + " sequence parallel " +
         std::to_string(o.sequence_parallel) + " cp " + std::to_string(cp);
}

template <class T>
void check_all(double tolerance) {
  overlap::context ctx(MPI_COMM_WORLD);
  for (const block_shape& s : {uneven, tiny})
    for (overlap::strategy st : strategies)
      for (int wgrad : {0, 1, 2})  // weight gradients after, beside a started op, in the op's waits
        for (bool sequence_parallel : {true, false}) {
          // Causal attention in blocks of 4 query rows (several blocks, the last one short) and in one block.
          const overlap::layers::block_options o{st, wgrad > 0, wgrad > 0 ? 4 : 256, sequence_parallel, wgrad == 2};
          std::string worst;
          const double err = run_and_compare<T>(ctx, nullptr, s, o, worst);
          EXPECT_LT(err, tolerance) << describe(s, o, 1) << ": worst tensor " << worst;
        }
}

/// The block on a cp x tp mesh, for every cp that divides the ranks
/// (cp = 1: the two-axis constructor with one share): ring attention between
/// the shares, the tensor-parallel ops within each.
template <class T>
void check_context_parallel(double tolerance) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  for (int cp = 1; cp <= world; ++cp) {
    if (world % cp != 0) continue;
    overlap::mesh m(MPI_COMM_WORLD, {{"cp", cp, true}, {"tp", 0, true}});
    for (const block_shape& s : {uneven, tiny})
      for (overlap::strategy st : {overlap::strategy::bulk, overlap::strategy::ring, overlap::strategy::automatic})
        for (bool sequence_parallel : {true, false}) {
          const overlap::layers::block_options o{st, true, 4, sequence_parallel};
          std::string worst;
          const double err = run_and_compare<T>(m.context("tp"), &m.context("cp"), s, o, worst);
          EXPECT_LT(err, tolerance) << describe(s, o, cp) << ": worst tensor " << worst;
        }
  }
}

TEST(transformer, f32_forward_and_every_gradient_match_the_double_reference) { check_all<float>(5e-6); }
TEST(transformer, f64_forward_and_every_gradient_match_the_double_reference) { check_all<double>(1e-12); }
// bf16 operands (8 significant bits) rounded at every op boundary.
TEST(transformer, bf16_forward_and_every_gradient_match_the_double_reference) { check_all<overlap::bfloat16>(3e-2); }
TEST(transformer, context_parallel_f32_matches_the_double_reference) { check_context_parallel<float>(5e-6); }
TEST(transformer, context_parallel_f64_matches_the_double_reference) { check_context_parallel<double>(1e-12); }
TEST(transformer, context_parallel_bf16_matches_the_double_reference) {
  check_context_parallel<overlap::bfloat16>(3e-2);
}

/// sum over all ranks of out * dout for the block's current parameters.
double loss(transformer_block<double>& blk, const std::vector<double>& x, const std::vector<double>& dout) {
  const int64_t n = blk.layout().rows(), d = blk.layout().shape.hidden;
  std::vector<double> out(x.size());
  blk.forward({x.data(), n, d}, {out.data(), n, d});
  double mine = 0, all = 0;
  for (size_t i = 0; i < out.size(); ++i) mine += out[i] * dout[i];
  MPI_Allreduce(&mine, &all, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return all;
}

struct entry {
  const char* name;
  int64_t i, j;
};

TEST(transformer, gradients_match_finite_differences) {
  overlap::context ctx(MPI_COMM_WORLD);
  const block_shape s = uneven;
  const fixture<double> f(s);
  transformer_block<double> blk(ctx, s, {overlap::strategy::ring, true, 5});
  f.set_params(blk);
  const block_layout& l = blk.layout();
  const std::vector<double> x = f.rows(f.x, l), dout = f.rows(f.dout, l);
  std::vector<double> dx(x.size());
  (void)loss(blk, x, dout);
  blk.backward({dout.data(), l.rows(), s.hidden}, {dx.data(), l.rows(), s.hidden});
  auto grads = blk.grads();
  const int64_t d = s.hidden;
  const entry entries[] = {{"wqkv", 1, 5}, {"wqkv", 2, d + 3}, {"wqkv", 0, 2 * d + 9}, {"bqkv", 0, d + 2},
                           {"wo", 3, 4},   {"bo", 0, 6},       {"w1", 2, 7},           {"b1", 0, 19},
                           {"w2", 5, 1},   {"b2", 0, 11},      {"ln1_g", 0, 2},        {"ln2_b", 0, 3}};
  for (const entry& e : entries) {
    // Every rank holding the entry (all of them for a replicated one) nudges it.
    auto nudge = [&](double by) {
      overlap::layers::visit(blk.params(), l, [&](const char* name, double& v, int64_t i, int64_t j) {
        if (e.name == std::string(name) && e.i == i && e.j == j) v += by;
      });
    };
    double grad = 0, holders = 0;
    overlap::layers::visit(grads, l, [&](const char* name, double& v, int64_t i, int64_t j) {
      if (e.name == std::string(name) && e.i == i && e.j == j) grad += v, holders += 1;
    });
    double sums[2] = {grad, holders}, all[2] = {0, 0};
    MPI_Allreduce(sums, all, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    ASSERT_GT(all[1], 0) << e.name << " (" << e.i << ", " << e.j << ") is held by no rank";
    const double h = 1e-5;
    nudge(h);
    const double up = loss(blk, x, dout);
    nudge(-2 * h);
    const double down = loss(blk, x, dout);
    nudge(h);
    const double fd = (up - down) / (2 * h), analytic = all[0] / all[1];
    EXPECT_NEAR(analytic, fd, 1e-6 * std::max(1.0, std::fabs(fd))) << e.name << " (" << e.i << ", " << e.j << ")";
  }
}

// on_gradients: called in order as each group is final; what it reads then
// is what backward() ends with.
TEST(transformer, on_gradients_reports_each_group_when_it_is_final) {
  overlap::context ctx(MPI_COMM_WORLD);
  for (overlap::strategy st : {overlap::strategy::bulk, overlap::strategy::ring})
    for (int wgrad : {0, 1, 2}) {
      const fixture<double> f(uneven);
      transformer_block<double> blk(ctx, uneven, {st, wgrad > 0, 4, true, wgrad == 2});
      f.set_params(blk);
      const block_layout& l = blk.layout();
      const std::vector<double> x = f.rows(f.x, l), dout = f.rows(f.dout, l);
      std::vector<double> out(x.size()), dx(x.size());
      std::vector<overlap::layers::gradients_ready> calls;
      overlap::layers::block_params<double>::tensor w2, b1, w1;
      blk.on_gradients([&](overlap::layers::gradients_ready g) {
        calls.push_back(g);
        if (g == overlap::layers::gradients_ready::mlp_down) w2 = blk.grads().w2, b1 = blk.grads().b1;
        if (g == overlap::layers::gradients_ready::mlp_up) w1 = blk.grads().w1;
      });
      const int64_t n = l.rows(), d = uneven.hidden;
      for (int step = 0; step < 2; ++step) {
        calls.clear();
        blk.forward({x.data(), n, d}, {out.data(), n, d});
        blk.backward({dout.data(), n, d}, {dx.data(), n, d});
        ASSERT_EQ(calls.size(), 3u);
        EXPECT_EQ(calls[0], overlap::layers::gradients_ready::mlp_down);
        EXPECT_EQ(calls[1], overlap::layers::gradients_ready::mlp_up);
        EXPECT_EQ(calls[2], overlap::layers::gradients_ready::all);
        EXPECT_EQ(w2, blk.grads().w2) << "strategy " << overlap::to_string(st) << " wgrad " << wgrad;
        EXPECT_EQ(b1, blk.grads().b1) << "strategy " << overlap::to_string(st) << " wgrad " << wgrad;
        EXPECT_EQ(w1, blk.grads().w1) << "strategy " << overlap::to_string(st) << " wgrad " << wgrad;
      }
    }
}

/// `bad` must throw std::invalid_argument mentioning `needle` on every rank.
void expect_every_rank_rejects(const std::string& needle, const std::function<void()>& bad) {
  int threw = 0;
  try {
    bad();
  } catch (const std::invalid_argument& e) {
    threw = 1;
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  int all = 0;
  MPI_Allreduce(&threw, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  EXPECT_EQ(all, 1) << "some rank did not reject (expected '" << needle << "')";
}

TEST(transformer, bad_input_is_rejected_on_every_rank) {
  overlap::context ctx(MPI_COMM_WORLD);
  const int last = ctx.size() - 1;
  expect_every_rank_rejects("divisible by heads", [&] { transformer_block<float>(ctx, {8, 10, 3, 8}); });
  expect_every_rank_rejects("attention_block must be positive", [&] {
    transformer_block<float>(ctx, tiny, {overlap::strategy::ring, true, ctx.rank() == last ? 0 : 4});
  });
  if (ctx.size() > 1)  // one rank's shape differs from the others'
    expect_every_rank_rejects("different shapes", [&] {
      transformer_block<float>(ctx, {ctx.rank() == last ? int64_t(9) : int64_t(8), 8, 2, 8});
    });
  if (ctx.size() > 1)  // a "cp" axis that is not orthogonal to tp: its ranks have different tp ranks
    expect_every_rank_rejects("same tp rank", [&] { transformer_block<float>(ctx, ctx, tiny); });
  if (ctx.size() > 1)  // one rank without sequence parallelism
    expect_every_rank_rejects("different shapes or modes", [&] {
      transformer_block<float>(ctx, tiny, {overlap::strategy::ring, true, 4, ctx.rank() != last});
    });
  if (ctx.size() > 1)  // one rank's weight gradients in the ops' waits, the others' beside started ops
    expect_every_rank_rejects("weight_gradients_in_waits must agree", [&] {
      transformer_block<float>(ctx, tiny, {overlap::strategy::ring, true, 4, true, ctx.rank() == last});
    });
  transformer_block<float> blk(ctx, tiny);
  const int64_t n = blk.layout().rows(), d = tiny.hidden;
  std::vector<float> x(size_t((n + 1) * d)), out(x.size());
  expect_every_rank_rejects("backward before forward", [&] { blk.backward({x.data(), n, d}, {out.data(), n, d}); });
  expect_every_rank_rejects("rank " + std::to_string(last), [&] {
    const int64_t rows = ctx.rank() == last ? n + 1 : n;  // one rank passes a wrong shape
    blk.forward({x.data(), rows, d}, {out.data(), n, d});
  });
  // Still usable after the rejections.
  blk.forward({x.data(), n, d}, {out.data(), n, d});
  blk.backward({x.data(), n, d}, {out.data(), n, d});
}

}  // namespace
