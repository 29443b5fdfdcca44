// layers::moe_mlp, the mixture-of-experts MLP with expert parallelism:
// forward and every gradient against a single-rank reference in plain
// loops (double), which every rank computes for the whole problem from the
// seeds of every rank's tokens and experts. Uneven token counts, a rank
// with no tokens, one and several experts per rank, top-1 and top-2, both
// strategies of the all-to-alls; bad input on one rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "overlap/layers/moe.hpp"
#include "overlap/overlap.hpp"
#include "reference.hpp"
#include "rejects.hpp"

using namespace testing_support;

namespace {

int64_t tokens_of(int R, int p) { return R > 2 && p == 1 ? 0 : 5 + 3 * p; }

/// Everything the reference needs, regenerated from the seeds.
struct problem {
  int R, E, G, topk;
  int64_t K, F;
  uint32_t seed;
  [[nodiscard]] matrix<double> x(int p) const { return random_matrix<double>(tokens_of(R, p), K, seed + p); }
  [[nodiscard]] matrix<double> dy(int p) const { return random_matrix<double>(tokens_of(R, p), K, seed + 50 + p); }
  [[nodiscard]] matrix<double> router() const {
    // Spread widely so that no two logits of a token are near a tie.
    matrix<double> r = random_matrix<double>(K, G, seed + 99);
    for (int64_t i = 0; i < K; ++i)
      for (int64_t g = 0; g < G; ++g) r(i, g) += 0.37 * double(g) / double(K);
    return r;
  }
  [[nodiscard]] matrix<double> w1(int q) const { return random_matrix<double>(E * K, F, seed + 200 + q); }
  [[nodiscard]] matrix<double> w2(int q) const { return random_matrix<double>(E * F, K, seed + 300 + q); }
};

struct reference_grads {
  matrix<double> y, dx, router;        ///< this rank's
  std::vector<matrix<double>> w1, w2;  ///< every rank's experts
};

/// The whole layer on one rank, in plain loops; this rank's y, dx and
/// router share, and every rank's expert gradients.
reference_grads reference(const problem& pb, int me) {
  const int64_t K = pb.K, F = pb.F;
  reference_grads out;
  out.router = matrix<double>(K, pb.G);
  for (int q = 0; q < pb.R; ++q) out.w1.emplace_back(pb.E * K, F), out.w2.emplace_back(pb.E * F, K);
  const matrix<double> wr = pb.router();
  std::vector<matrix<double>> w1, w2;
  for (int q = 0; q < pb.R; ++q) w1.push_back(pb.w1(q)), w2.push_back(pb.w2(q));
  for (int p = 0; p < pb.R; ++p) {
    const matrix<double> x = pb.x(p), dy = pb.dy(p);
    matrix<double> y(x.rows, K), dx(x.rows, K);
    for (int64_t t = 0; t < x.rows; ++t) {
      std::vector<double> l(size_t(pb.G), 0);
      for (int g = 0; g < pb.G; ++g)
        for (int64_t i = 0; i < K; ++i) l[size_t(g)] += x(t, i) * wr(i, g);
      std::vector<int> order(static_cast<size_t>(pb.G));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[size_t(a)] > l[size_t(b)]; });
      std::vector<double> gate(size_t(pb.topk)), dgate(size_t(pb.topk));
      double sum = 0;
      for (int j = 0; j < pb.topk; ++j) sum += std::exp(l[size_t(order[size_t(j)])] - l[size_t(order[0])]);
      for (int j = 0; j < pb.topk; ++j)
        gate[size_t(j)] = std::exp(l[size_t(order[size_t(j)])] - l[size_t(order[0])]) / sum;
      for (int j = 0; j < pb.topk; ++j) {
        const int g = order[size_t(j)], q = g / pb.E, e = g % pb.E;
        std::vector<double> u(static_cast<size_t>(F), 0), h(static_cast<size_t>(F)), o(static_cast<size_t>(K), 0);
        for (int64_t f = 0; f < F; ++f) {
          for (int64_t i = 0; i < K; ++i) u[size_t(f)] += x(t, i) * w1[size_t(q)](e * K + i, f);
          h[size_t(f)] = 0.5 * u[size_t(f)] * (1 + std::erf(u[size_t(f)] / std::sqrt(2.0)));
        }
        for (int64_t c = 0; c < K; ++c)
          for (int64_t f = 0; f < F; ++f) o[size_t(c)] += h[size_t(f)] * w2[size_t(q)](e * F + f, c);
        double dg = 0;
        for (int64_t c = 0; c < K; ++c) y(t, c) += gate[size_t(j)] * o[size_t(c)], dg += dy(t, c) * o[size_t(c)];
        dgate[size_t(j)] = dg;
        // Backward through the expert: dO = gate dy.
        std::vector<double> dh(static_cast<size_t>(F), 0);
        for (int64_t f = 0; f < F; ++f)
          for (int64_t c = 0; c < K; ++c) {
            const double d_o = gate[size_t(j)] * dy(t, c);
            out.w2[size_t(q)](e * F + f, c) += h[size_t(f)] * d_o;
            dh[size_t(f)] += d_o * w2[size_t(q)](e * F + f, c);
          }
        for (int64_t f = 0; f < F; ++f) {
          const double uf = u[size_t(f)];
          const double grad =
              0.5 * (1 + std::erf(uf / std::sqrt(2.0))) + uf * std::exp(-0.5 * uf * uf) / std::sqrt(2 * M_PI);
          const double du = dh[size_t(f)] * grad;
          for (int64_t i = 0; i < K; ++i) {
            out.w1[size_t(q)](e * K + i, f) += x(t, i) * du;
            dx(t, i) += du * w1[size_t(q)](e * K + i, f);
          }
        }
      }
      double mean = 0;
      for (int j = 0; j < pb.topk; ++j) mean += gate[size_t(j)] * dgate[size_t(j)];
      for (int j = 0; j < pb.topk; ++j) {
        const int g = order[size_t(j)];
        const double dl = gate[size_t(j)] * (dgate[size_t(j)] - mean);
        for (int64_t i = 0; i < K; ++i) {
          dx(t, i) += dl * wr(i, g);
          if (p == me) out.router(i, g) += x(t, i) * dl;
        }
      }
    }
    if (p == me) out.y = y, out.dx = dx;
  }
  return out;
}

void expect_close(const matrix<double>& got, const matrix<double>& want, const std::string& what) {
  ASSERT_EQ(got.rows, want.rows) << what;
  ASSERT_EQ(got.cols, want.cols) << what;
  double scale = 1e-300;
  for (int64_t i = 0; i < want.rows; ++i)
    for (int64_t j = 0; j < want.cols; ++j) scale = std::max(scale, std::abs(want(i, j)));
  int reported = 0;
  for (int64_t i = 0; i < want.rows; ++i)
    for (int64_t j = 0; j < want.cols; ++j)
      if (std::abs(got(i, j) - want(i, j)) > 1e-10 * scale && reported++ < 5)
        ADD_FAILURE() << what << "(" << i << "," << j << ") = " << got(i, j) << ", expected " << want(i, j);
}

struct moe_case {
  int experts, topk;
  overlap::strategy strategy;
  bool in_waits = false;  ///< the weight gradients in the last exchange's waits, not beside it started
  int64_t width = 8, ffn = 6;
};

class moe_layer : public ::testing::TestWithParam<moe_case> {};

TEST_P(moe_layer, forward_and_every_gradient_match_the_reference) {
  const moe_case cs = GetParam();
  overlap::context ctx(MPI_COMM_WORLD);
  const int R = ctx.size(), p = ctx.rank();
  const problem pb{R, cs.experts, cs.experts * R, std::min(cs.topk, cs.experts * R), cs.width, cs.ffn, 11};
  overlap::layers::moe_options opt;
  opt.width = pb.K, opt.ffn = pb.F;
  opt.experts_per_rank = cs.experts, opt.topk = pb.topk, opt.strategy = cs.strategy;
  opt.weight_gradients_in_waits = cs.in_waits;
  overlap::layers::moe_mlp<double> layer(ctx, opt);
  const matrix<double> x = pb.x(p), dy = pb.dy(p), wr = pb.router(), w1 = pb.w1(p), w2 = pb.w2(p);
  const overlap::layers::moe_weights<double> w{wr.cview(), w1.cview(), w2.cview()};
  matrix<double> y(x.rows, pb.K), dx(x.rows, pb.K), gr(pb.K, pb.G), g1(pb.E * pb.K, pb.F), g2(pb.E * pb.F, pb.K);
  for (int step = 0; step < 2; ++step) {  // twice: the second call runs the cached plans
    const overlap::layers::moe_load& load = layer.forward(x.cview(), w, y.view());
    layer.backward(dy.cview(), w, dx.view(), {gr.view(), g1.view(), g2.view()});
    const reference_grads ref = reference(pb, p);
    expect_close(y, ref.y, "y");
    expect_close(dx, ref.dx, "dx");
    expect_close(gr, ref.router, "router's gradient");
    expect_close(g1, ref.w1[size_t(p)], "w1's gradient");
    expect_close(g2, ref.w2[size_t(p)], "w2's gradient");
    // The load: every token's topk choices, and the rows each local expert took.
    EXPECT_EQ(std::accumulate(load.routed.begin(), load.routed.end(), int64_t{0}), x.rows * pb.topk);
    int64_t received = std::accumulate(load.received.begin(), load.received.end(), int64_t{0}), all = 0;
    MPI_Allreduce(&received, &all, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    int64_t tokens = 0;
    for (int q = 0; q < R; ++q) tokens += tokens_of(R, q);
    EXPECT_EQ(all, tokens * pb.topk);
  }
}

INSTANTIATE_TEST_SUITE_P(cases, moe_layer,
                         ::testing::Values(moe_case{1, 1, overlap::strategy::pairwise},
                                           moe_case{1, 2, overlap::strategy::bulk},
                                           moe_case{2, 2, overlap::strategy::pairwise},
                                           moe_case{3, 2, overlap::strategy::automatic},
                                           // Widths of several runs of rows (engine::row_split) per gradient.
                                           moe_case{2, 2, overlap::strategy::pairwise, true, 70, 66},
                                           moe_case{1, 2, overlap::strategy::automatic, true, 8, 6}),
                         [](const auto& param_info) {
                           const moe_case& c = param_info.param;
                           return std::to_string(c.experts) + "experts_top" + std::to_string(c.topk) + "_" +
                                  overlap::to_string(c.strategy) + (c.in_waits ? "_in_waits" : "") + "_width" +
                                  std::to_string(c.width);
                         });

TEST(moe_layer_float, matches_the_double_reference) {
  overlap::context ctx(MPI_COMM_WORLD);
  const int R = ctx.size(), p = ctx.rank();
  const problem pb{R, 2, 2 * R, std::min(2, 2 * R), 8, 6, 21};
  overlap::layers::moe_options opt;
  opt.width = pb.K, opt.ffn = pb.F;
  opt.experts_per_rank = 2, opt.topk = pb.topk, opt.strategy = overlap::strategy::pairwise;
  overlap::layers::moe_mlp<float> layer(ctx, opt);
  auto to_float = [](const matrix<double>& m) {
    matrix<float> f(m.rows, m.cols);
    for (int64_t i = 0; i < m.rows; ++i)
      for (int64_t j = 0; j < m.cols; ++j) f(i, j) = float(m(i, j));
    return f;
  };
  const matrix<float> x = to_float(pb.x(p)), dy = to_float(pb.dy(p)), wr = to_float(pb.router()),
                      w1 = to_float(pb.w1(p)), w2 = to_float(pb.w2(p));
  matrix<float> y(x.rows, pb.K), dx(x.rows, pb.K), gr(pb.K, pb.G), g1(pb.E * pb.K, pb.F), g2(pb.E * pb.F, pb.K);
  const overlap::layers::moe_weights<float> w{wr.cview(), w1.cview(), w2.cview()};
  layer.forward(x.cview(), w, y.view());
  layer.backward(dy.cview(), w, dx.view(), {gr.view(), g1.view(), g2.view()});
  const reference_grads ref = reference(pb, p);
  auto check = [](const matrix<float>& got, const matrix<double>& want, const char* what) {
    double scale = 1e-30, err = 0;
    for (int64_t i = 0; i < want.rows; ++i)
      for (int64_t j = 0; j < want.cols; ++j)
        scale = std::max(scale, std::abs(want(i, j))), err = std::max(err, std::abs(double(got(i, j)) - want(i, j)));
    EXPECT_LT(err / scale, 1e-4) << what;
  };
  check(y, ref.y, "y");
  check(dx, ref.dx, "dx");
  check(gr, ref.router, "router's gradient");
  check(g1, ref.w1[size_t(p)], "w1's gradient");
  check(g2, ref.w2[size_t(p)], "w2's gradient");
}

TEST(moe_layer_errors, bad_input_on_one_rank_fails_on_every_rank) {
  overlap::context ctx(MPI_COMM_WORLD);
  const int R = ctx.size(), p = ctx.rank();
  const problem pb{R, 1, R, 1, 8, 6, 31};
  overlap::layers::moe_options opt;
  opt.width = pb.K, opt.ffn = pb.F;
  opt.topk = 1;
  overlap::layers::moe_mlp<double> layer(ctx, opt);
  const matrix<double> x = pb.x(p), wr = pb.router(), w1 = pb.w1(p), w2 = pb.w2(p);
  const matrix<double> narrow = random_matrix<double>(x.rows, p == R - 1 ? pb.K - 1 : pb.K, 3);
  matrix<double> y(x.rows, pb.K);
  const overlap::layers::moe_weights<double> w{wr.cview(), w1.cview(), w2.cview()};
  expect_all_ranks_reject(
      "x must be", [&] { layer.forward(narrow.cview(), w, y.view()); }, [&] { layer.forward(x.cview(), w, y.view()); });
}

}  // namespace
