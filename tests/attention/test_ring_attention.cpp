// Ring attention (overlap/attention/ring_attention.hpp), forward and backward,
// against single-rank attention of the whole sequence in double with plain
// loops (attention_reference.hpp): f32, bf16 and f64; causal and not; the
// ring and the gather-first baseline; one or several heads; uneven
// sequences (chunks differing by one token, empty chunks and ranks holding
// no token); blocks of scores smaller than a chunk; strided views; a
// permuted ring. The ring's forward output equals the baseline's bit for
// bit (both fold the blocks in the same order). Bad input is refused on
// every rank, outputs that overlap each other or an input included. What
// the cost model prices is what the passes run, and automatic is its choice.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include <overlap/attention/ring_attention.hpp>
#include <overlap/attention/ring_attention_backward.hpp>  // the passes as the cost model prices them
#include <overlap/attention/ring_attention_forward.hpp>
#include <overlap/layers/example_values.hpp>
#include <overlap/runtime/context.hpp>

#include "attention_reference.hpp"
#include "reference.hpp"
#include "rejects.hpp"

using overlap::attention_options;
using overlap::bfloat16;
using overlap::causal_split;
using overlap::strategy;
using testing_support::attention_reference;
using testing_support::matrix;

namespace {

struct attn_case {
  int64_t seq, heads, dh;
  bool causal;
  strategy st;
  int64_t block;
};

std::string describe(const attn_case& c) {
  return "seq " + std::to_string(c.seq) + ", " + std::to_string(c.heads) + " heads x " + std::to_string(c.dh) +
         (c.causal ? ", causal" : ", full") + (c.st == strategy::bulk ? ", bulk" : ", ring") + ", block " +
         std::to_string(c.block);
}

template <class T>
double to_double(T v) {
  if constexpr (std::is_same_v<T, bfloat16>)
    return double(static_cast<float>(v));
  else
    return double(v);
}
template <class T>
T from_double(double v) {
  if constexpr (std::is_same_v<T, bfloat16>)
    return bfloat16(float(v));
  else
    return T(v);
}

// Entry (i, j) of tensor `name` at sequence position i, as T.
template <class T>
T value(const char* name, int64_t i, int64_t j) {
  return from_double<T>(1.5 * overlap::layers::example_value(name, i, j));
}

template <class T>
struct tolerance {
  static constexpr double value = std::is_same_v<T, double> ? 1e-10 : std::is_same_v<T, float> ? 2e-5 : 1.5e-2;
};

// One rank's tensors for a case, filled from the global positions.
template <class T>
struct rank_data {
  using A = overlap::attention_acc_t<T>;
  matrix<T> q, k, v, o, d_o, dq, dk, dv;
  matrix<A> lse;

  rank_data(const causal_split& split, int rank, int64_t heads, int64_t w) {
    const int64_t n = split.rows(rank);
    q = matrix<T>(n, w, 3), k = matrix<T>(n, w, 1), v = matrix<T>(n, w, 2), d_o = matrix<T>(n, w, 1);
    o = matrix<T>(n, w, 2), dq = matrix<T>(n, w, 1), dk = matrix<T>(n, w), dv = matrix<T>(n, w, 3);
    lse = matrix<A>(heads, n, 2);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t pos = split.position(rank, i);
      for (int64_t j = 0; j < w; ++j)
        q(i, j) = value<T>("q", pos, j), k(i, j) = value<T>("k", pos, j), v(i, j) = value<T>("v", pos, j),
             d_o(i, j) = value<T>("do", pos, j);
    }
  }
  overlap::attention_inputs<T> inputs() const { return {q.cview(), k.cview(), v.cview()}; }
};

// The reference of a case, from the same values the ranks hold.
template <class T>
attention_reference reference_of(const attn_case& c) {
  const int64_t w = c.heads * c.dh;
  attention_reference r;
  r.heads = c.heads, r.causal = c.causal;
  for (auto* m : {&r.q, &r.k, &r.v, &r.d_o}) *m = testing_support::dense(c.seq, w);
  for (int64_t i = 0; i < c.seq; ++i)
    for (int64_t j = 0; j < w; ++j) {
      r.q(i, j) = to_double(value<T>("q", i, j)), r.k(i, j) = to_double(value<T>("k", i, j));
      r.v(i, j) = to_double(value<T>("v", i, j)), r.d_o(i, j) = to_double(value<T>("do", i, j));
    }
  r.forward();
  r.backward();
  return r;
}

template <class M>
int expect_near_rows(const char* what, const M& got, const testing_support::dense& want, const causal_split& split,
                     int rank, double tol, const std::string& where) {
  int bad = 0;
  for (int64_t i = 0; i < got.rows; ++i)
    for (int64_t j = 0; j < got.cols; ++j) {
      const double g = to_double(got(i, j)), e = want(split.position(rank, i), j);
      if (!(std::abs(g - e) <= tol * (1 + std::abs(e))) && bad++ < 3)
        ADD_FAILURE() << where << ": " << what << "(" << i << ", " << j << ") = " << g << ", expected " << e;
    }
  return bad;
}

template <class T>
void run_case(overlap::context& ctx, const attn_case& c) {
  const int P = ctx.size(), rank = ctx.rank();
  const causal_split split(c.seq, P);
  const int64_t w = c.heads * c.dh;
  const attention_reference ref = reference_of<T>(c);
  rank_data<T> d(split, rank, c.heads, w);
  const attention_options opt{c.heads, c.causal, c.st, c.block};
  overlap::ring_attention<T>(ctx, d.inputs(), {d.o.view(), d.lse.view()}, opt);
  const double tol = tolerance<T>::value;
  const std::string where = describe(c) + ", rank " + std::to_string(rank) + " of " + std::to_string(P);
  expect_near_rows("o", d.o, ref.o, split, rank, tol, where);
  for (int64_t h = 0; h < c.heads; ++h)
    for (int64_t i = 0; i < split.rows(rank); ++i)
      ASSERT_NEAR(double(d.lse(h, i)), ref.lse(h, split.position(rank, i)), 1e-4 * (1 + std::abs(ref.lse(h, 0))))
          << where << ": lse(" << h << ", " << i << ")";
  overlap::ring_attention_backward<T>(ctx, d.inputs(), {d.o.cview(), d.lse.cview()}, d.d_o.cview(),
                                      {d.dq.view(), d.dk.view(), d.dv.view()}, opt);
  const double gtol = std::is_same_v<T, bfloat16> ? 3e-2 : tol * 10;
  expect_near_rows("dq", d.dq, ref.dq, split, rank, gtol, where);
  expect_near_rows("dk", d.dk, ref.dk, split, rank, gtol, where);
  expect_near_rows("dv", d.dv, ref.dv, split, rank, gtol, where);
}

std::vector<attn_case> sweep(int P) {
  std::vector<attn_case> out;
  // Every chunk one token, fewer tokens than chunks (empty chunks, ranks
  // holding nothing), uneven chunks, and longer ones cut into blocks.
  for (int64_t seq : {int64_t(1), int64_t(2 * P), int64_t(2 * P + 3), int64_t(37), int64_t(64)})
    for (auto [heads, dh] : {std::pair<int64_t, int64_t>{1, 3}, {3, 8}})
      for (bool causal : {true, false})
        for (strategy st : {strategy::ring, strategy::bulk})
          for (int64_t block : {int64_t(256), int64_t(4)}) out.push_back({seq, heads, dh, causal, st, block});
  return out;
}

template <class T>
void run_sweep() {
  overlap::context ctx(MPI_COMM_WORLD);
  for (const attn_case& c : sweep(ctx.size())) run_case<T>(ctx, c);
}

TEST(RingAttention, SweepF32) { run_sweep<float>(); }
TEST(RingAttention, SweepBf16) { run_sweep<bfloat16>(); }
TEST(RingAttention, SweepF64) { run_sweep<double>(); }

// The ring folds the blocks in the order the baseline does: the same bits.
template <class T>
void ring_equals_bulk(bool causal) {
  overlap::context ctx(MPI_COMM_WORLD);
  const int P = ctx.size(), rank = ctx.rank();
  const causal_split split(45, P);
  rank_data<T> ring(split, rank, 2, 12), bulk(split, rank, 2, 12);
  overlap::ring_attention<T>(ctx, ring.inputs(), {ring.o.view(), ring.lse.view()}, {2, causal, strategy::ring, 5});
  overlap::ring_attention<T>(ctx, bulk.inputs(), {bulk.o.view(), bulk.lse.view()}, {2, causal, strategy::bulk, 5});
  for (int64_t i = 0; i < ring.o.rows; ++i)
    ASSERT_EQ(0, std::memcmp(&ring.o(i, 0), &bulk.o(i, 0), sizeof(T) * size_t(ring.o.cols))) << "row " << i;
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < ring.o.rows; ++i) ASSERT_EQ(ring.lse(h, i), bulk.lse(h, i));
}
TEST(RingAttention, RingEqualsBulkBitForBit) {
  ring_equals_bulk<float>(true);
  ring_equals_bulk<float>(false);
  ring_equals_bulk<bfloat16>(true);
}

// A second call of the same shape is a hit of the context's plan cache: its
// plan (the agreed problem and the buffers) is reused, and with other
// inputs it gives what a fresh context gives, bit for bit. Each pass has its
// own plan; another shape gets another.
TEST(RingAttention, SecondCallOfAShapeReusesItsPlan) {
  overlap::context ctx(MPI_COMM_WORLD);
  const int P = ctx.size(), rank = ctx.rank();
  const causal_split split(30, P);
  const attention_options opt{2, true, strategy::ring, 4};
  rank_data<float> first(split, rank, 2, 8), second(split, rank, 2, 8), fresh(split, rank, 2, 8);
  for (rank_data<float>* d : {&second, &fresh})  // other inputs than the first call's
    for (int64_t i = 0; i < d->q.rows; ++i)
      for (int64_t j = 0; j < d->q.cols; ++j) d->q(i, j) *= -0.5F, d->v(i, j) += 1.0F, d->d_o(i, j) *= 2.0F;
  auto both = [&](overlap::context& c, rank_data<float>& d) {
    overlap::ring_attention<float>(c, d.inputs(), {d.o.view(), d.lse.view()}, opt);
    overlap::ring_attention_backward<float>(c, d.inputs(), {d.o.cview(), d.lse.cview()}, d.d_o.cview(),
                                            {d.dq.view(), d.dk.view(), d.dv.view()}, opt);
  };
  both(ctx, first);
  EXPECT_EQ(ctx.cached_plans(), 2U);  // the forward's and the backward's
  both(ctx, second);
  EXPECT_EQ(ctx.cached_plans(), 2U);
  EXPECT_EQ(ctx.plans_rebuilt(), 0U);
  overlap::context other(MPI_COMM_WORLD);
  both(other, fresh);
  for (auto [got, want] : {std::pair{&second.o, &fresh.o}, std::pair{&second.dq, &fresh.dq},
                           std::pair{&second.dk, &fresh.dk}, std::pair{&second.dv, &fresh.dv}})
    for (int64_t i = 0; i < got->rows; ++i)
      ASSERT_EQ(0, std::memcmp(&(*got)(i, 0), &(*want)(i, 0), sizeof(float) * size_t(got->cols))) << "row " << i;
  // Another shape (a longer sequence): its own plans.
  const causal_split longer(30 + 2 * P, P);
  rank_data<float> third(longer, rank, 2, 8);
  both(ctx, third);
  EXPECT_EQ(ctx.cached_plans(), 4U);
}

// On a ring whose order is not the ranks' (as placement by node makes one).
TEST(RingAttention, PermutedRing) {
  overlap::context ctx(MPI_COMM_WORLD);
  std::vector<int> order(size_t(ctx.size()));
  std::iota(order.begin(), order.end(), 0);
  std::reverse(order.begin(), order.end());
  if (order.size() > 2) std::swap(order[0], order[1]);
  overlap::detail::set_ring_for_testing(ctx, order);
  run_case<float>(ctx, {29, 2, 4, true, strategy::ring, 3});
  run_case<double>(ctx, {29, 2, 4, false, strategy::ring, 256});
}

// Bad input on one rank: every rank throws before any transfer, and the
// context stays usable.
TEST(RingAttention, BadInputRefusedOnEveryRank) {
  overlap::context ctx(MPI_COMM_WORLD);
  const int P = ctx.size(), rank = ctx.rank(), last = P - 1;
  const causal_split split(20, P);
  rank_data<float> d(split, rank, 2, 8);
  const auto valid = [&] {
    overlap::ring_attention<float>(ctx, d.inputs(), {d.o.view(), d.lse.view()}, {2, true, strategy::ring, 256});
  };
  auto call = [&](const attention_options& opt, overlap::attention_inputs<float> in) {
    overlap::ring_attention<float>(ctx, in, {d.o.view(), d.lse.view()}, opt);
  };
  using testing_support::expect_all_ranks_reject;
  // Rows that are not the causal split's: the last rank passes 7 more, which
  // no split of a longer sequence gives it while the others keep theirs (on
  // one rank any count is the split of a sequence that long).
  if (P > 1) {
    const causal_split longer(20 + 7 * P, P);
    rank_data<float> big(longer, rank, 2, 8);
    expect_all_ranks_reject(
        "causal split",
        [&] {
          if (rank != last) return valid();
          const int64_t n = d.q.rows + 7;
          const auto cut = [&](const matrix<float>& m) { return m.cview().block(0, 0, n, 8); };
          const overlap::attention_outputs<float> out{big.o.view().block(0, 0, n, 8),
                                                      {big.lse.data.data(), 2, n, big.lse.ld}};
          overlap::ring_attention<float>(ctx, {cut(big.q), cut(big.k), cut(big.v)}, out,
                                         {2, true, strategy::ring, 256});
        },
        valid);
  }
  expect_all_ranks_reject(
      "multiple of heads",
      [&] {
        call({3, true, strategy::ring, 256}, d.inputs());
      },
      valid);
  if (P > 1)
    expect_all_ranks_reject(
        "attention_options.heads differs across ranks",
        [&] {
          // The last rank's call is right on its own (its lse has one head's row).
          const int64_t heads = rank == last ? 1 : 2;
          const overlap::matrix_view<float> lse{d.lse.data.data(), heads, d.q.rows, d.lse.ld};
          overlap::ring_attention<float>(ctx, d.inputs(), {d.o.view(), lse}, {heads, true, strategy::ring, 256});
        },
        valid);
  expect_all_ranks_reject(
      "strategy",
      [&] {
        call({2, true, strategy::bidirectional, 256}, d.inputs());
      },
      valid);
  expect_all_ranks_reject(
      "block",
      [&] {
        call({2, true, strategy::ring, rank == last ? 0 : 256}, d.inputs());
      },
      valid);
  if (P > 1)
    expect_all_ranks_reject(
        "attention_options.causal differs across ranks",
        [&] {
          call({2, rank != last, strategy::ring, 256}, d.inputs());
        },
        valid);
  expect_all_ranks_reject(
      "k must be",
      [&] {
        overlap::attention_inputs<float> in = d.inputs();
        if (rank == last) in.k.cols = 7;
        call({2, true, strategy::ring, 256}, in);
      },
      valid);
  expect_all_ranks_reject(
      "d_o",
      [&] {
        matrix<float> small(d.q.rows, 4);
        overlap::ring_attention_backward<float>(
            ctx, d.inputs(), {d.o.cview(), d.lse.cview()}, rank == last ? small.cview() : d.d_o.cview(),
            {d.dq.view(), d.dk.view(), d.dv.view()}, {2, true, strategy::ring, 256});
      },
      valid);
  // Outputs that overlap each other or an input, on the last rank only.
  const auto backward = [&](const overlap::attention_grads<float>& g) {
    overlap::ring_attention_backward<float>(ctx, d.inputs(), {d.o.cview(), d.lse.cview()}, d.d_o.cview(), g,
                                            {2, true, strategy::ring, 256});
  };
  expect_all_ranks_reject(
      "dq overlaps dk",
      [&] {
        backward({d.dq.view(), rank == last ? d.dq.view() : d.dk.view(), d.dv.view()});
      },
      valid);
  expect_all_ranks_reject(
      "dv overlaps q",
      [&] {
        backward({d.dq.view(), d.dk.view(), rank == last ? d.q.view() : d.dv.view()});
      },
      valid);
  expect_all_ranks_reject(
      "o overlaps q",
      [&] {
        overlap::ring_attention<float>(ctx, d.inputs(), {rank == last ? d.q.view() : d.o.view(), d.lse.view()},
                                       {2, true, strategy::ring, 256});
      },
      valid);
  expect_all_ranks_reject(
      "o overlaps lse",
      [&] {
        // The last rank's lse starts inside o (both are float here).
        const overlap::matrix_view<float> lse =
            rank == last ? overlap::matrix_view<float>{d.o.view().data, 2, d.q.rows, d.q.rows} : d.lse.view();
        overlap::ring_attention<float>(ctx, d.inputs(), {d.o.view(), lse}, {2, true, strategy::ring, 256});
      },
      valid);
}

}  // namespace

namespace {

namespace attn = overlap::layers::attention;

// The agreed problem of every rank of a `ranks`-rank call, as prepare() makes it.
attn::detail::problem problem_of(int64_t seq, int ranks, int rank, int64_t heads, int64_t dh, bool causal) {
  attn::detail::problem pb;
  pb.split = causal_split(seq, ranks);
  pb.d = attn::dims{heads, dh, 4};
  pb.causal = causal, pb.ranks = ranks, pb.rank = rank, pb.pos = rank;
  pb.order.resize(size_t(ranks));
  std::iota(pb.order.begin(), pb.order.end(), 0);
  return pb;
}

double flops(const std::vector<overlap::detail::gemm_work>& gs) {
  double f = 0;
  for (const auto& g : gs) f += 2.0 * double(g.m * g.n * g.k * g.times);
  return f;
}

// What the cost model prices for a pass is what the pass runs: without the
// mask, every rank's products over every step add up to the whole
// attention's GEMMs (forward: S = Q K^T and O = P V; backward five of that
// size), counted here from the sequence alone; the ring's steps and the
// baseline list the same products; every K/V block is received by every
// other rank once (forward), and with its gradients on the way back
// (backward). With the mask, the priced products lie between the visible
// half and the whole.
TEST(RingAttention, PricedPassesAreThePassesThatRun) {
  for (int ranks = 1; ranks <= 5; ++ranks)
    for (bool causal : {false, true}) {
      const int64_t seq = 37, heads = 2, dh = 3, w = heads * dh;
      double fwd = 0, bwd = 0, recv_fwd = 0, recv_bwd = 0;
      for (int r = 0; r < ranks; ++r) {
        const attn::detail::problem pb = problem_of(seq, ranks, r, heads, dh, causal);
        const overlap::detail::work ring = attn::detail::forward_work<float>(pb, true);
        const overlap::detail::work bulk = attn::detail::forward_work<float>(pb, false);
        ASSERT_EQ(ring.ring_steps.size(), size_t(ranks));
        std::vector<overlap::detail::gemm_work> listed;
        for (const auto& st : ring.ring_steps) {
          listed.insert(listed.end(), st.products.begin(), st.products.end());
          recv_fwd += st.recv;
        }
        EXPECT_EQ(listed, bulk.gemms);
        EXPECT_EQ(bulk.allgather_block, double(attn::detail::kv_bytes<float>(pb.max_rows(), w)));
        fwd += flops(bulk.gemms);
        const overlap::detail::work back = attn::detail::backward_work<float>(pb, true);
        for (const auto& st : back.ring_steps) bwd += flops(st.products), recv_bwd += st.recv;
        EXPECT_EQ(flops(attn::detail::backward_work<float>(pb, false).gemms), flops([&] {
                    std::vector<overlap::detail::gemm_work> all;
                    for (const auto& st : back.ring_steps)
                      all.insert(all.end(), st.products.begin(), st.products.end());
                    return all;
                  }()));
      }
      const double whole = 2.0 * 2.0 * double(seq * seq * w);  // two GEMMs of seq x seq x dh per head
      if (causal) {
        EXPECT_GT(fwd, whole / 2) << ranks << " ranks";
        EXPECT_LT(fwd, whole) << ranks << " ranks";
      } else {
        EXPECT_EQ(fwd, whole) << ranks << " ranks";
        EXPECT_EQ(bwd, whole * 5 / 2) << ranks << " ranks";
      }
      double blocks = 0, grads = 0;
      for (int r = 0; r < ranks; ++r) {
        blocks += double(attn::detail::kv_bytes<float>(causal_split(seq, ranks).rows(r), w));
        grads += double(attn::detail::dkv_bytes<float>(causal_split(seq, ranks).rows(r), w));
      }
      EXPECT_EQ(recv_fwd, (ranks - 1) * blocks) << ranks << " ranks";
      EXPECT_EQ(recv_bwd, ranks == 1 ? 0 : (ranks - 1) * blocks + ranks * grads) << ranks << " ranks";
    }
}

// strategy::automatic is the ops' chooser's: bulk where nothing can be
// hidden (one rank, or one node without a calibration), else the cost
// model's choice between bulk and ring, both priced, recorded with their
// predictions; either way the pass computes what a forced one does.
TEST(RingAttention, AutomaticIsTheCostModelsChoice) {
  const int P = testing_support::world_size(), rank = testing_support::world_rank();
  const causal_split split(40, P);
  attention_options opt{2, true, strategy::automatic, 4};
  auto forward = [&](overlap::context& ctx, rank_data<float>& d) {
    overlap::ring_attention<float>(ctx, d.inputs(), {d.o.view(), d.lse.view()}, opt);
    return ctx.plan_reports().front().schedule;
  };
  rank_data<float> forced(split, rank, 2, 8), uncalibrated(split, rank, 2, 8), modelled(split, rank, 2, 8);
  {
    overlap::context ctx(MPI_COMM_WORLD);
    opt.strategy = strategy::ring;
    (void)forward(ctx, forced);
    opt.strategy = strategy::automatic;
    if (ctx.one_node() || P == 1) {
      EXPECT_EQ(forward(ctx, uncalibrated), "bulk");
    }
  }
  if (P < 2) return;
  // A calibration of a slow network (1 Gbit/s) and a flat 50 GFLOP/s.
  overlap::calibration c;
  const overlap::link_rates l{50e-6, 125e6, 125e6, 1.2, {}};
  c.links[overlap::link_class::network] = c.links[overlap::link_class::shared] = l;
  c.gemm[overlap::dtype::f32] = overlap::gemm_rates{{128, 2048}, std::vector<double>(8, 50e9)};
  const std::string path = "overlap-attention-calibration-" + std::to_string(P) + ".json";
  if (rank == 0) std::ofstream(path) << c.to_json();
  MPI_Barrier(MPI_COMM_WORLD);
  overlap::config cfg;
  cfg.calibration = path;
  overlap::context ctx(MPI_COMM_WORLD, cfg);
  const std::string words = forward(ctx, modelled);
  EXPECT_NE(words.find("cost model's choice"), std::string::npos) << words;
  EXPECT_NE(words.find("| bulk: "), std::string::npos) << words;
  EXPECT_NE(words.find("| ring"), std::string::npos) << words;
  for (int64_t i = 0; i < forced.o.rows; ++i)
    ASSERT_EQ(0, std::memcmp(&forced.o(i, 0), &modelled.o(i, 0), sizeof(float) * size_t(forced.o.cols)));
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) std::remove(path.c_str());
}

}  // namespace
