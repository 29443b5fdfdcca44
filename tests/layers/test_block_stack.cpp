// The N-block model (overlap/layers/block_stack.hpp) on dp x tp meshes: the
// loss of two training steps and every weight's change after them, against
// a single-rank double-precision model written with plain loops
// (transformer_reference.hpp, chained, with the loss, the average over the
// replicas and SGD with momentum here), for every dp_sync and optimizer
// state, with uneven token, head and MLP shards, several buckets per block
// and uneven blocks within them; bad options rejected on every rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <overlap/layers/block_stack.hpp>
#include <overlap/layers/example_values.hpp>
#include <overlap/mpi/simulator.hpp>
#include <overlap/runtime/mesh.hpp>

#include "rejects.hpp"
#include "transformer_reference.hpp"

using overlap::layers::block_shape;
using overlap::layers::block_stack;
using overlap::layers::dp_sync;
using overlap::layers::optimizer_state;
using overlap::layers::stack_options;

namespace {

const block_shape uneven{13, 16, 4, 24};  // at tp 2: 7 and 6 tokens; at tp 3 (not run) a rank without a head
constexpr int blocks = 3;

/// Block b's parameter (i, j): the example values, different in every block.
double parameter(const block_shape& s, int b, const std::string& name, int64_t i, int64_t j) {
  return overlap::layers::example_parameter(s, b, name, i, j);
}
/// Replica q's input and target at (token, feature), as overlap-layer makes them.
double input(int q, int64_t t, int64_t j) { return overlap::layers::example_value("x", t + uneven.seq * q, j); }
double target(int q, int64_t t, int64_t j) {
  return 0.5 * overlap::layers::example_value("target", t + uneven.seq * q, j);
}

/// The model on one rank, in double: blocks, loss, replica average, SGD with momentum.
struct reference_model {
  block_shape s;
  double lr, mu;
  std::vector<reference::params> w, v;

  reference_model(const block_shape& shape, double learning_rate, double momentum)
      : s(shape), lr(learning_rate), mu(momentum) {
    for (int b = 0; b < blocks; ++b) {
      w.push_back(reference::make_params(s));
      for (auto& [name, m] : w.back())
        for (int64_t i = 0; i < m.r; ++i)
          for (int64_t j = 0; j < m.c; ++j) m(i, j) = parameter(s, b, name, i, j);
      v.push_back(reference::make_params(s));
    }
  }

  /// One step on the sequences of `replicas`, the gradients' sum scaled by
  /// 1 / total replicas (the stack's average); returns the sum of their
  /// losses / total.
  double step(const std::vector<int>& replicas, int total) {
    std::vector<reference::params> g(size_t(blocks), reference::make_params(s));
    double loss = 0;
    for (int q : replicas) {
      reference::mat x(s.seq, s.hidden), t(s.seq, s.hidden);
      for (int64_t i = 0; i < s.seq; ++i)
        for (int64_t j = 0; j < s.hidden; ++j) x(i, j) = input(q, i, j), t(i, j) = target(q, i, j);
      std::vector<reference::block> model;
      for (int b = 0; b < blocks; ++b) model.emplace_back(s, w[size_t(b)]);
      reference::mat a = x;
      for (auto& blk : model) a = blk.forward(a);
      reference::mat d(s.seq, s.hidden);
      const double per = 1.0 / double(s.seq * s.hidden);
      for (size_t k = 0; k < a.v.size(); ++k) {
        const double e = a.v[k] - t.v[k];
        loss += 0.5 * e * e * per / total;
        d.v[k] = e * per;
      }
      for (int b = blocks - 1; b >= 0; --b) {
        reference::mat dx;
        const reference::params gb = model[size_t(b)].backward(d, dx);
        for (auto& [name, m] : g[size_t(b)]) m = reference::add(m, gb.at(name));
        d = dx;
      }
    }
    for (int b = 0; b < blocks; ++b)
      for (auto& [name, m] : w[size_t(b)]) {
        reference::mat& vel = v[size_t(b)].at(name);
        const reference::mat& grad = g[size_t(b)].at(name);
        for (size_t k = 0; k < m.v.size(); ++k) {
          vel.v[k] = mu * vel.v[k] + grad.v[k] / total;
          m.v[k] -= lr * vel.v[k];
        }
      }
    return loss;
  }
};

struct outcome {
  double loss_err = 0, weight_err = 0;
  std::string worst;
};

/// Two steps of the stack on a dp x tp mesh against the reference; errors
/// relative (the loss's, and each tensor's change over the two steps
/// against the largest change of that tensor), max over ranks.
template <class T>
outcome run_and_compare(int tp, const stack_options& opt) {
  overlap::mesh m(MPI_COMM_WORLD, {{"dp", 0}, {"tp", tp, true}});
  const block_shape& s = uneven;
  block_stack<T> stack(m, blocks, s, opt);
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  EXPECT_EQ(stack.threaded(), opt.dp_thread && provided >= MPI_THREAD_MULTIPLE && !overlap::mpi::simulated);
  const auto& l = stack.layout();
  for (int b = 0; b < blocks; ++b)
    overlap::layers::visit(stack.block(b).params(), l, [&](const char* name, T& v, int64_t i, int64_t j) {
      v = overlap::layers::detail::cast<T>(parameter(s, b, name, i, j));
    });
  const int R = stack.replicas(), q = stack.replica();
  const int64_t n = l.rows(), d = s.hidden;
  std::vector<T> x(size_t(n * d)), t(size_t(n * d));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < d; ++j)
      x[size_t(i * d + j)] = overlap::layers::detail::cast<T>(input(q, l.token(i), j)),
                       t[size_t(i * d + j)] = overlap::layers::detail::cast<T>(target(q, l.token(i), j));

  // The reference: one model of every replica, or (no dp sync) each replica's own.
  std::vector<int> all;
  for (int r = 0; r < R; ++r) all.push_back(r);
  const bool synced = opt.dp_sync != dp_sync::none;
  std::vector<reference_model> refs;
  for (int r = 0; r < (synced ? 1 : R); ++r) refs.emplace_back(s, opt.learning_rate, opt.momentum);
  outcome out;
  for (int k = 0; k < 2; ++k) {
    const double got = stack.step({x.data(), n, d}, {t.data(), n, d});
    double want = 0;
    if (synced) want = refs[0].step(all, R);
    for (int r = 0; !synced && r < R; ++r) want += refs[size_t(r)].step({r}, R);
    const double e = std::fabs(got - want) / std::fabs(want);
    if (!(e <= out.loss_err)) out.loss_err = e, out.worst = "loss of step " + std::to_string(k + 1);
  }
  stack.synchronize();
  const reference_model& ref = refs[synced ? 0 : size_t(q)];
  for (int b = 0; b < blocks; ++b) {
    std::map<std::string, double> largest;  // of the reference's change
    for (const auto& [name, mat] : ref.w[size_t(b)]) {
      double a = 1e-300;
      for (int64_t i = 0; i < mat.r; ++i)
        for (int64_t j = 0; j < mat.c; ++j) a = std::max(a, std::fabs(mat(i, j) - parameter(s, b, name, i, j)));
      largest[name] = a;
    }
    overlap::layers::visit(stack.block(b).params(), l, [&](const char* name, T& v, int64_t i, int64_t j) {
      const double w0 =
          overlap::layers::detail::cast<double>(overlap::layers::detail::cast<T>(parameter(s, b, name, i, j)));
      const double moved = overlap::layers::detail::cast<double>(v) - w0;
      const double want = ref.w[size_t(b)].at(name)(i, j) - parameter(s, b, name, i, j);
      const double e = std::fabs(moved - want) / largest[name];
      if (!(e <= out.weight_err)) out.weight_err = e, out.worst = "block " + std::to_string(b) + " " + name;
    });
  }
  double mine[2] = {out.loss_err, out.weight_err}, worst[2] = {0, 0};
  MPI_Allreduce(mine, worst, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (worst[0] != out.loss_err || worst[1] != out.weight_err) out.worst += " (or another rank's)";
  out.loss_err = worst[0], out.weight_err = worst[1];
  return out;
}

std::string describe(int tp, const stack_options& o) {
  return "tp " + std::to_string(tp) + " dp_sync " + overlap::to_string(o.dp_sync) + " optimizer " +
         overlap::to_string(o.optimizer) + " bucket_bytes " + std::to_string(o.bucket_bytes) + " strategy " +
         overlap::to_string(o.block.strategy) + " dp_thread " + std::to_string(o.dp_thread);
}

template <class T>
void check_every_form(double tolerance, const std::vector<overlap::strategy>& strategies) {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  for (int tp : {1, 2}) {
    if (world % tp != 0) continue;
    for (dp_sync sync : {dp_sync::bulk, dp_sync::overlapped, dp_sync::none})
      for (optimizer_state state : {optimizer_state::replicated, optimizer_state::sharded})
        for (overlap::strategy st : strategies)
          for (bool thread : {true, false}) {                 // the stack's thread advances the rings, or its caller
            if (thread && overlap::mpi::simulated) continue;  // SMPI: never a thread (the same run twice)
            stack_options o;
            o.block.strategy = st;
            o.block.attention_block = 4;
            o.dp_sync = sync, o.optimizer = state;
            o.bucket_bytes = 1000;  // several buckets per block, each split unevenly over the replicas
            o.learning_rate = 0.5, o.momentum = 0.9;  // weights that move well past rounding
            o.dp_thread = thread;
            const outcome r = run_and_compare<T>(tp, o);
            EXPECT_LT(r.loss_err, tolerance) << describe(tp, o) << ": worst " << r.worst;
            EXPECT_LT(r.weight_err, tolerance) << describe(tp, o) << ": worst " << r.worst;
          }
  }
}

TEST(block_stack, f64_two_steps_match_the_double_reference_for_every_dp_form) {
  check_every_form<double>(1e-10, {overlap::strategy::bulk, overlap::strategy::ring});
}
TEST(block_stack, f32_two_steps_match_the_double_reference_for_every_dp_form) {
  check_every_form<float>(1e-4, {overlap::strategy::automatic});
}

TEST(block_stack, bad_options_are_rejected_on_every_rank) {
  overlap::mesh m(MPI_COMM_WORLD, {{"dp", 0}, {"tp", 1, true}});
  int me = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const bool last = me == world - 1;
  auto reject = [](const std::string& needle, const std::function<void()>& bad) {
    testing_support::expect_all_ranks_reject(needle, bad, [] {});  // the stack's usability: checked at the end
  };
  reject("blocks >= 1", [&] { block_stack<float>(m, last ? 0 : 2, uneven); });
  stack_options o;
  o.momentum = last ? 1.0 : 0.9;
  reject("momentum", [&] { block_stack<float>(m, 2, uneven, o); });
  o = stack_options{};
  o.bucket_bytes = last ? 0 : 1000;
  reject("bucket_bytes", [&] { block_stack<float>(m, 2, uneven, o); });
  if (world > 1) {
    o = stack_options{};
    o.learning_rate = last ? 0.2 : 0.1;
    reject("different", [&] { block_stack<float>(m, 2, uneven, o); });
    o = stack_options{};
    o.dp_sync = last ? dp_sync::bulk : dp_sync::overlapped;
    reject("different", [&] { block_stack<float>(m, 2, uneven, o); });
  }
  reject("divisible by heads", [&] { block_stack<float>(m, 2, {8, 10, 3, 8}); });
  block_stack<float> stack(m, 2, uneven);
  const int64_t n = stack.layout().rows(), d = uneven.hidden;
  std::vector<float> x(size_t((n + 1) * d)), t(x.size());
  reject("rank " + std::to_string(world - 1), [&] {
    (void)stack.step({x.data(), last ? n + 1 : n, d}, {t.data(), n, d});  // one rank passes a wrong shape
  });
  // Still usable after the rejections.
  EXPECT_TRUE(std::isfinite(stack.step({x.data(), n, d}, {t.data(), n, d})));
}

}  // namespace
