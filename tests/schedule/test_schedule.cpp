// The schedule as a value and the cost model: calibration files (round trip,
// errors on every rank), the rate grid's interpolation, what automatic
// chooses from a given calibration (and that the chosen schedule computes
// the right result), forced schedules taken as asked, and the collective
// measurements a context makes on first need.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "ag_cases.hpp"
#include "calibrations.hpp"
#include "overlap/calibrate/measure.hpp"
#include "overlap/ops/choose.hpp"
#include "rs_cases.hpp"

using namespace testing_support;
using overlap::algorithm;
using overlap::gathered;
using overlap::scattered;
using overlap::strategy;

namespace {

TEST(calibration, json_round_trip) {
  const overlap::calibration c = slow_network();
  const overlap::calibration back = overlap::calibration::from_json(c.to_json(), "test");
  ASSERT_TRUE(back.has(overlap::link_class::network));
  EXPECT_NEAR(back.links.at(overlap::link_class::network).latency_s, 50e-6, 1e-12);
  EXPECT_NEAR(back.links.at(overlap::link_class::network).bytes_per_s, 125e6, 1e-3);
  EXPECT_DOUBLE_EQ(back.links.at(overlap::link_class::network).gemm_slowdown, 1.2);
  ASSERT_TRUE(back.has(overlap::dtype::bf16));
  EXPECT_NEAR(back.gemm.at(overlap::dtype::f32).at(1000, 1000, 1000), 50e9, 1);
  EXPECT_EQ(back.links.at(overlap::link_class::network).collectives.ranks, 0);  // none measured, none written
}

/// Collectives measured on 4 ranks: all-gathers at half a link's rate for
/// small blocks and twice it for large ones, the rest at 3x.
overlap::collective_rates four_rank_collectives() {
  overlap::collective_rates c;
  c.ranks = 4;
  c.allgather = {{1e5, 1e7}, {62.5e6, 250e6}};
  c.iallgather = c.allgather;
  c.reduce_scatter = c.alltoall = {{1e5}, {375e6}};
  return c;
}

TEST(calibration, collectives_round_trip) {
  overlap::calibration c = slow_network();
  c.links[overlap::link_class::network].collectives = four_rank_collectives();
  const overlap::calibration back = overlap::calibration::from_json(c.to_json(), "test");
  const overlap::collective_rates& r = back.links.at(overlap::link_class::network).collectives;
  EXPECT_EQ(r.ranks, 4);
  ASSERT_EQ(r.allgather.block_bytes.size(), 2u);
  EXPECT_NEAR(r.allgather.at(1e5), 62.5e6, 1e-3);
  EXPECT_NEAR(r.allgather.at(1e6), 125e6, 1e-3);  // halfway in log2 of the block: the geometric mean
  EXPECT_NEAR(r.allgather.at(1e9), 250e6, 1e-3);  // clamped
  EXPECT_NEAR(r.alltoall.at(1), 375e6, 1e-3);
}

// The model prices a collective at the rate measured for it on as many ranks,
// and as R - 1 hops over one link otherwise.
TEST(model, collectives_at_their_measured_rates) {
  overlap::link_rates l{0, 125e6, 125e6, 1, {}};
  const overlap::gemm_rates g{{128, 2048}, std::vector<double>(8, 1e12)};
  overlap::detail::work bulk;
  bulk.allgather_block = 1e7;  // 80 ms per hop at 125 MB/s
  EXPECT_NEAR(overlap::detail::predict(l, g, 4, bulk), 0.24, 1e-9);
  l.collectives = four_rank_collectives();
  EXPECT_NEAR(overlap::detail::predict(l, g, 4, bulk), 0.12, 1e-9);  // 3 hops at 250 MB/s
  EXPECT_NEAR(overlap::detail::predict(l, g, 3, bulk), 0.16, 1e-9);  // measured on 4 ranks, not 3
  overlap::detail::work rs;
  rs.reduce_scatter_block = 3.75e6;
  EXPECT_NEAR(overlap::detail::predict(l, g, 4, rs), 0.03, 1e-9);
  overlap::detail::work a2a;
  a2a.alltoall_bytes = 3.75e6;
  EXPECT_NEAR(overlap::detail::predict(l, g, 4, a2a), 0.01, 1e-9);
}

// The slowdown a calibration stores and the per-byte cost the model reads
// from it are one quantity: measured at half the links' capacity over the
// GEMM's time, 4 streams at b2 each.
TEST(model, slowdown_and_cost_per_byte_agree) {
  overlap::link_rates l;
  l.bytes_per_s_both = 0.5e9;
  l.gemm_slowdown = overlap::detail::slowdown_from_seconds_per_byte(0.8e-9, l.bytes_per_s_both);
  EXPECT_NEAR(l.gemm_slowdown, 1.8, 1e-12);  // 0.8 ns/B x (4 x 0.5 x 0.5 GB/s) of the GEMM's time
  EXPECT_NEAR(overlap::detail::seconds_per_byte(l), 0.8e-9, 1e-21);
  l.gemm_slowdown = 1;
  EXPECT_EQ(overlap::detail::seconds_per_byte(l), 0);
}

// Moving the other operands: an output block leaves only once its product is
// computed. With 2 ranks nothing hides the one block's transfer; with 4, the
// later products hide the earlier blocks' transfers.
TEST(model, output_blocks_leave_once_computed) {
  const overlap::link_rates l{0, 1e9, 1e9, 1, {}};
  const overlap::gemm_rates g{{128, 2048}, std::vector<double>(8, 1e12)};
  overlap::detail::work w;
  w.pipelined = w.alltoall_out = true;
  w.alltoall_bytes = 3e6;                                           // 3 ms at 1 GB/s
  w.gemms.assign(2, overlap::detail::gemm_work{1000, 1000, 1000});  // 2 ms each
  // own product 2 ms, the other block's product 2 ms, then its transfer 3 ms
  EXPECT_NEAR(overlap::detail::predict(l, g, 2, w), 7e-3, 1e-9);
  w.gemms.assign(4, overlap::detail::gemm_work{1000, 1000, 1000});
  // own 2 ms, 3 products 6 ms, then the last block's transfer 1 ms (the
  // transfers of the others, 2 ms, hide behind the products after theirs)
  EXPECT_NEAR(overlap::detail::predict(l, g, 4, w), 9e-3, 1e-9);
  // In 4 pieces (products of 0.5 ms, blocks of 0.75 ms) the link binds: own
  // 2 ms, then the first block's product 0.5 ms, then the 3 ms of transfers.
  w.pieces = w.own_gemms = 4;
  w.gemms.assign(8, overlap::detail::gemm_work{1000, 250, 1000});
  EXPECT_NEAR(overlap::detail::predict(l, g, 2, w), 5.5e-3, 1e-9);
}

// The reduce-scatter's other operands: this rank's own K is computed while
// the peers' blocks travel, then one product over the peers' K.
TEST(model, reduce_scatter_own_term_hides_the_inputs) {
  const overlap::link_rates l{0, 1e9, 1e9, 1, {}};
  const overlap::gemm_rates g{{128, 2048}, std::vector<double>(8, 1e12)};
  overlap::detail::work w;
  w.pipelined = true;
  w.alltoall_bytes = 1e6;                                           // 1 ms at 1 GB/s
  w.allgather_block = 2e6;                                          // 2 ms with 2 ranks
  w.gemms.assign(2, overlap::detail::gemm_work{1000, 1000, 1000});  // own and peers' terms, 2 ms each
  EXPECT_NEAR(overlap::detail::predict(l, g, 2, w), 5e-3, 1e-9);    // the inputs outlast the own term
  w.allgather_block = 0.5e6;
  EXPECT_NEAR(overlap::detail::predict(l, g, 2, w), 4e-3, 1e-9);  // the own term outlasts the inputs
}

// Inputs in pieces: the exchange travels with the first piece, and each
// later piece while the products of the one before it are computed.
TEST(model, reduce_scatter_inputs_in_pieces_overlap_the_products) {
  const overlap::link_rates l{0, 1e9, 1e9, 1, {}};
  const overlap::gemm_rates g{{128, 2048}, std::vector<double>(8, 1e12)};
  overlap::detail::work w;
  w.pipelined = true;
  w.alltoall_bytes = 1e6;         // 1 ms at 1 GB/s
  w.allgather_block = 4e6;        // 4 ms with 2 ranks
  w.gemms = {{1000, 500, 1000}};  // own term 1 ms
  w.pieces = 4;
  for (int j = 0; j < 4; ++j) w.gemms.push_back({1000, 500, 1000});  // 1 ms per piece
  // exchange and piece 0: 2 ms; 3 more pieces of 1 ms each beside the
  // products of 1 ms; the last piece's product 1 ms
  EXPECT_NEAR(overlap::detail::predict(l, g, 2, w), 6e-3, 1e-9);
  // Pieces of 2 ms (8 ms gathered): the link binds, 1 + 2 + 3 x 2 + 1
  w.allgather_block = 8e6;
  EXPECT_NEAR(overlap::detail::predict(l, g, 2, w), 10e-3, 1e-9);
  // In one piece: every input first (9 ms), then the 4 ms of products
  w.pieces = 1;
  w.gemms = {{1000, 500, 1000}, {1000, 2000, 1000}};
  EXPECT_NEAR(overlap::detail::predict(l, g, 2, w), 13e-3, 1e-9);
}

// The GEMMs lose at most the transfers' own time to them, however large the
// calibrated per-byte cost: a ring whose GEMMs take 1 ms and transfers 3 ms
// takes no more than both one after the other.
TEST(model, transfers_cost_the_gemms_at_most_their_own_time) {
  overlap::link_rates l{0, 1e9, 1e9, 1, {}};
  const overlap::gemm_rates g{{128, 2048}, std::vector<double>(8, 1e12)};
  overlap::detail::work w;
  // An input's ring on 4 ranks: 4 steps of 0.25 ms products; the last 3
  // receive 1 MB each (3 ms of transfers), and every step but the last
  // sends its piece on.
  w.ring = true;
  for (int t = 0; t < 4; ++t) {
    overlap::detail::ring_step_work st;
    st.products = {{500, 500, 500}};
    st.recv = t > 0 ? 1e6 : 0;
    st.moved = st.recv + (t < 3 ? 1e6 : 0);
    w.ring_steps.push_back(st);
  }
  EXPECT_NEAR(overlap::detail::predict(l, g, 4, w), 3.25e-3, 1e-9);  // transfers + the last piece
  l.gemm_slowdown = overlap::detail::slowdown_from_seconds_per_byte(0.1e-9, l.bytes_per_s_both);
  EXPECT_NEAR(overlap::detail::predict(l, g, 4, w), 3.25e-3, 1e-9);  // 0.6 ms lost: still bound by the link
  l.gemm_slowdown = overlap::detail::slowdown_from_seconds_per_byte(10e-9, l.bytes_per_s_both);
  EXPECT_NEAR(overlap::detail::predict(l, g, 4, w), 4e-3, 1e-9);  // 60 ms "lost": at most the 3 ms of transfers
}

TEST(calibration, malformed_files_are_rejected_with_the_reason) {
  auto reason = [](const std::string& text) {
    try {
      (void)overlap::calibration::from_json(text, "x.json");
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(reason("{").find("calibration x.json"), std::string::npos);
  EXPECT_NE(reason(R"({"format":"other","version":1})").find("not an overlap calibration"), std::string::npos);
  EXPECT_NE(reason(R"({"format":"overlap-calibration","version":2})").find("version 2"), std::string::npos);
  EXPECT_NE(reason(R"({"format":"overlap-calibration","version":1,"gemm":{"f32":{"sizes":[1,2],"gflops":[1]}}})")
                .find("sizes^3"),
            std::string::npos);
  EXPECT_NE(reason(R"({"format":"overlap-calibration","version":1,"links":{"network":{"latency_us":1,)"
                   R"("gbit_per_s":0,"gbit_per_s_both_directions":1,"gemm_slowdown":1}}})")
                .find("rates > 0"),
            std::string::npos);
  const std::string link = R"({"format":"overlap-calibration","version":1,"links":{"network":{"latency_us":1,)"
                           R"("gbit_per_s":1,"gbit_per_s_both_directions":1,"gemm_slowdown":1,"collectives":)";
  const std::string rest = R"("iallgather":{"block_bytes":[1],"gbit_per_s":[1]},)"
                           R"("reduce_scatter":{"block_bytes":[1],"gbit_per_s":[1]},)"
                           R"("alltoall":{"block_bytes":[1],"gbit_per_s":[1]}}}}})";
  EXPECT_NE(reason(link + R"({"ranks":1,"allgather":{"block_bytes":[1],"gbit_per_s":[1]},)" + rest).find("ranks >= 2"),
            std::string::npos);
  EXPECT_NE(reason(link + R"({"ranks":2,"allgather":{"block_bytes":[2,1],"gbit_per_s":[1,1]},)" + rest)
                .find("collective allgather block_bytes must be positive and ascending"),
            std::string::npos);
  EXPECT_NE(reason(link + R"({"ranks":2,"allgather":{"block_bytes":[1],"gbit_per_s":[1,2]},)" + rest)
                .find("as many block_bytes"),
            std::string::npos);
  EXPECT_NE(reason(link + R"({"ranks":2,"allgather":{"block_bytes":[1],"gbit_per_s":[0]},)" + rest)
                .find("collective allgather rates must be positive"),
            std::string::npos);
  EXPECT_EQ(reason(link + R"({"ranks":2,"allgather":{"block_bytes":[1],"gbit_per_s":[1]},)" + rest), "accepted");
}

TEST(calibration, unreadable_file_fails_context_creation_on_every_rank) {
  bool threw = false;
  try {
    overlap::context ctx(MPI_COMM_WORLD, with_calibration("/nonexistent/overlap.json"));
  } catch (const std::invalid_argument& e) {
    threw = std::string(e.what()).find("/nonexistent/overlap.json cannot be read") != std::string::npos;
  }
  int all = 0, mine = threw ? 1 : 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  EXPECT_EQ(all, 1);
}

TEST(calibration, interpolates_in_log_space_and_clamps) {
  // Rates 1e9 at 100 and 4e9 at 400 along every extent.
  overlap::gemm_rates g{{100, 400}, {}};
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
      for (int l = 0; l < 2; ++l) g.flops_per_s.push_back(i == 1 ? 4e9 : 1e9);
  EXPECT_NEAR(g.at(100, 100, 100), 1e9, 1);
  EXPECT_NEAR(g.at(400, 7, 7), 4e9, 1);
  EXPECT_NEAR(g.at(200, 100, 100), 2e9, 1e3);  // halfway in log2: geometric mean
  EXPECT_NEAR(g.at(10, 100, 100), 1e9, 1);     // clamped below the grid
  EXPECT_NEAR(g.at(9000, 100, 100), 4e9, 1);   // and above it
}

/// AG lhs_rows with every rank holding n_local columns of B.
overlap::schedule ag_schedule(overlap::context& ctx, int64_t m_per_rank, int64_t k, int64_t n_local,
                              overlap::ag_options opt = {}) {
  matrix<float> a(m_per_rank, k), b(k, n_local), c(m_per_rank * ctx.size(), n_local);
  return overlap::all_gather_matmul_schedule<float>(ctx, a.cview(), b.cview(), c.view(), opt);
}

TEST(cost_model, automatic_chooses_by_predicted_time) {
  overlap::context ctx(MPI_COMM_WORLD, with_calibration(write_file(slow_network().to_json())));
  const int R = ctx.size();
  const overlap::schedule square = ag_schedule(ctx, 1024 / R, 1024, 1024);
  const overlap::schedule thin = ag_schedule(ctx, 2048 / R, 2048, 16);
  const overlap::schedule tiny = ag_schedule(ctx, 2, 8, 8);
  if (R == 1) {  // nothing travels: one GEMM, no model
    for (const auto& s : {square, thin, tiny}) {
      EXPECT_EQ(s.strategy, strategy::bulk);
      EXPECT_FALSE(s.by_model);
    }
    return;
  }
  // bulk, ring, bidirectional (3 ranks or more), and moving the other
  // operands in each piece count with pieces of >= 32 columns.
  for (const auto& [s, others] : {std::pair{square, 3u}, {thin, 1u}, {tiny, 1u}}) {
    EXPECT_TRUE(s.by_model) << overlap::to_string(s);
    EXPECT_EQ(s.candidates.size(), (R >= 3 ? 3u : 2u) + others) << overlap::to_string(s);
    for (const auto& c : s.candidates) EXPECT_GT(c.predicted_s, 0) << overlap::to_string(s);
  }
  // Compute about as long as the transfers: a ring hides them.
  EXPECT_NE(square.strategy, strategy::bulk) << overlap::to_string(square);
  EXPECT_EQ(square.algorithm, algorithm::named) << overlap::to_string(square);
  // N = 16: moving B (K x 16) and the output blocks beats moving A (M x K).
  EXPECT_EQ(thin.algorithm, algorithm::others) << overlap::to_string(thin);
  // Latency only: nothing to gain over one collective.
  EXPECT_EQ(tiny.strategy, strategy::bulk) << overlap::to_string(tiny);
  EXPECT_EQ(tiny.algorithm, algorithm::named) << overlap::to_string(tiny);
}

// Within the model's 3% band the simpler schedule wins.
TEST(cost_model, the_simplest_schedule_within_the_margin_wins) {
  auto pick = [](std::vector<double> ms) {
    std::vector<overlap::schedule> options(ms.size());
    for (size_t i = 0; i < ms.size(); ++i) options[i].predicted_s = ms[i] * 1e-3;
    return overlap::detail::simplest_within_margin(options);
  };
  EXPECT_EQ(pick({100, 80, 78.5}), 1u);              // ring before bidirectional 1.9% faster
  EXPECT_EQ(pick({100, 80, 77}), 2u);                // bidirectional 3.9% faster
  EXPECT_EQ(pick({100, 98, 97.5}), 0u);              // bulk within 3% of the fastest
  EXPECT_EQ(pick({100, 90, 91, 60, 59, 58.5}), 3u);  // others in one piece
  EXPECT_EQ(pick({50}), 0u);
}

TEST(cost_model, thin_reduce_scatter_moves_the_inputs) {
  overlap::context ctx(MPI_COMM_WORLD, with_calibration(write_file(slow_network().to_json())));
  const int R = ctx.size();
  if (R == 1) GTEST_SKIP() << "nothing travels on one rank";
  // K = 4 per rank: the partial sums (M x N) are far larger than A and B.
  matrix<float> a(1024, 4), b(4, 1024), c(1024 / R + (ctx.rank() < 1024 % R ? 1 : 0), 1024);
  const overlap::schedule s = overlap::matmul_reduce_scatter_schedule<float>(ctx, a.cview(), b.cview(), c.view());
  EXPECT_TRUE(s.by_model);
  EXPECT_EQ(s.algorithm, algorithm::others) << overlap::to_string(s);
}

TEST(cost_model, forced_schedules_are_taken_as_asked) {
  overlap::context ctx(MPI_COMM_WORLD, with_calibration(write_file(slow_network().to_json())));
  const int R = ctx.size();
  overlap::ag_options opt;
  opt.strategy = strategy::bulk;  // forced: named, no model
  overlap::schedule s = ag_schedule(ctx, 2048 / R, 2048, 16, opt);
  EXPECT_EQ(s.strategy, strategy::bulk);
  EXPECT_EQ(s.algorithm, algorithm::named);
  EXPECT_FALSE(s.by_model);
  opt.strategy = strategy::ring;
  s = ag_schedule(ctx, 2, 8, 8, opt);
  EXPECT_EQ(s.strategy, strategy::ring);
  EXPECT_GE(s.chunks, 1);
  opt.strategy = strategy::automatic, opt.algorithm = algorithm::others;
  s = ag_schedule(ctx, 1024 / R, 1024, 1024, opt);
  EXPECT_EQ(s.algorithm, algorithm::others);
  EXPECT_EQ(s.strategy, strategy::bulk);
  EXPECT_FALSE(s.by_model);
  // A schedule is a value: the same request gives the same schedule.
  EXPECT_TRUE(s.same_as(ag_schedule(ctx, 1024 / R, 1024, 1024, opt)));
}

// Moving the other operands gathers B in 1, 2 or 4 pieces of at least 32
// columns of the widest rank's: the count the model predicts fastest where
// the context holds a calibration, else the most that keep 128 columns, or
// as configured; an operand that is not gathered (contracting layouts) has
// none.
TEST(cost_model, other_operands_travel_in_pieces) {
  overlap::ag_options opt;
  opt.algorithm = algorithm::others;
  overlap::context plain(MPI_COMM_WORLD);  // no calibration: the rule
  EXPECT_EQ(ag_schedule(plain, 8, 64, 1024, opt).chunks, 4);
  EXPECT_EQ(ag_schedule(plain, 8, 64, 256, opt).chunks, 2);
  EXPECT_EQ(ag_schedule(plain, 8, 64, 200, opt).chunks, 1);
  // Only rank 0 holds columns: its width decides for every rank.
  EXPECT_EQ(ag_schedule(plain, 8, 64, plain.rank() == 0 ? 384 : 0, opt).chunks, 2);
  overlap::config cfg = with_calibration(write_file(slow_network().to_json()));
  cfg.ag_chunks = 5;
  overlap::context configured(MPI_COMM_WORLD, cfg);
  EXPECT_EQ(ag_schedule(configured, 8, 64, 64, opt).chunks, 5);
  cfg.ag_chunks = 0;
  overlap::context modelled(MPI_COMM_WORLD, cfg);
  for (int64_t n : {48, 256, 1024}) {
    const overlap::schedule forced = ag_schedule(modelled, 256, 1024, n, opt);
    overlap::ag_options automatic;
    const overlap::schedule chosen = ag_schedule(modelled, 256, 1024, n, automatic);
    if (modelled.size() == 1) {  // nothing travels, no model: the rule
      EXPECT_EQ(forced.chunks, n == 48 ? 1 : n == 256 ? 2 : 4);
      continue;
    }
    // The forced schedule's count is automatic's fastest others candidate's.
    const overlap::candidate* best = nullptr;
    size_t counts = 0;
    for (const overlap::candidate& c : chosen.candidates)
      if (c.algorithm == algorithm::others) {
        ++counts;
        if (best == nullptr || c.predicted_s < best->predicted_s) best = &c;
      }
    EXPECT_EQ(counts, n == 48 ? 1u : 3u) << overlap::to_string(chosen);
    ASSERT_NE(best, nullptr);
    EXPECT_EQ(forced.chunks, best->chunks) << overlap::to_string(chosen);
  }
  opt.gathered = gathered::lhs_cols;
  matrix<float> a(16, 8), b(8 * plain.size(), 32), c(16, 32);
  EXPECT_EQ(overlap::all_gather_matmul_schedule<float>(plain, a.cview(), b.cview(), c.view(), opt).chunks, 0);
}

// The reduce-scatter's other operands gather B (rows) or A (columns) in
// pieces of N or M: as configured (rs_chunks), else the model's count, or
// without a calibration one.
TEST(cost_model, reduce_scatter_inputs_travel_in_pieces) {
  overlap::rs_options opt;
  opt.algorithm = algorithm::others;
  auto rs_schedule = [&](overlap::context& ctx, int64_t m, int64_t n, const overlap::rs_options& o) {
    const int R = ctx.size(), p = ctx.rank();
    const int64_t rows = opt.scattered == scattered::rows ? m / R + (p < m % R ? 1 : 0) : m;
    matrix<float> a(m, 4), b(4, n), c(rows, n);
    return overlap::matmul_reduce_scatter_schedule<float>(ctx, a.cview(), b.cview(), c.view(), o);
  };
  overlap::context plain(MPI_COMM_WORLD);
  EXPECT_EQ(rs_schedule(plain, 64, 1024, opt).chunks, 1);
  EXPECT_EQ(rs_schedule(plain, 64, 48, opt).chunks, 1);
  overlap::config cfg = with_calibration(write_file(slow_network().to_json()));
  cfg.rs_chunks = 3;
  overlap::context configured(MPI_COMM_WORLD, cfg);
  EXPECT_EQ(rs_schedule(configured, 64, 64, opt).chunks, 3);
  cfg.rs_chunks = 0;
  overlap::context modelled(MPI_COMM_WORLD, cfg);
  if (modelled.size() == 1) return;  // nothing travels, no model
  overlap::rs_options automatic;
  const overlap::schedule chosen = rs_schedule(modelled, 64, 1024, automatic);
  size_t counts = 0;
  for (const overlap::candidate& c : chosen.candidates) counts += c.algorithm == algorithm::others;
  EXPECT_EQ(counts, 3u) << overlap::to_string(chosen);
}

// Whatever the model picks, the result is right (automatic on uneven shards).
TEST(cost_model, chosen_schedules_compute_the_reference) {
  overlap::context ctx(MPI_COMM_WORLD, with_calibration(write_file(slow_network().to_json())));
  uint32_t seed = 1;
  for (auto variant : {gathered::lhs_rows, gathered::lhs_cols, gathered::rhs_rows, gathered::rhs_cols})
    for (int64_t n : {3, 96}) {
      ag_case cs{variant, strategy::automatic, 96, n, 80, split::skewed, 1, false, seed++};
      run_ag_case<float>(ctx, cs);
    }
  for (auto sc : {scattered::rows, scattered::cols})
    for (int64_t k : {4, 96}) {
      rs_case cs{sc, strategy::automatic, 90, 70, k, split::skewed, split::balanced, 1, seed++};
      run_rs_case<float>(ctx, cs);
    }
}

// What a context measures on first need, on a small grid: every value usable.
TEST(measurement, links_gemm_and_slowdown) {
  overlap::context ctx(MPI_COMM_WORLD);
  const overlap::gemm_rates g = overlap::detail::measure_gemm(ctx, overlap::dtype::f32, {16, 64});
  ASSERT_EQ(g.flops_per_s.size(), 8u);
  for (double f : g.flops_per_s) EXPECT_TRUE(f > 0 && std::isfinite(f)) << f;
  if (ctx.size() < 2) return;
  const overlap::link_rates l = overlap::detail::measure_links(ctx);
  EXPECT_TRUE(l.latency_s > 0 && l.latency_s < 1) << l.latency_s;
  EXPECT_GT(l.bytes_per_s, 1e6);
  EXPECT_GT(l.bytes_per_s_both, 1e6);
  const double slow = overlap::detail::measure_slowdown(ctx, overlap::dtype::f32, l);
  EXPECT_TRUE(slow >= 1 && std::isfinite(slow)) << slow;
  const overlap::collective_rates c = overlap::detail::measure_collectives(ctx, l);
  EXPECT_EQ(c.ranks, ctx.size());
  overlap::detail::for_each_collective(c, [](const char* name, const overlap::collective_rate& r) {
    ASSERT_EQ(r.block_bytes, overlap::detail::collective_blocks()) << name;
    for (double b : r.bytes_per_s) EXPECT_TRUE(b > 1e6 && std::isfinite(b)) << name << " " << b;
  });
}

}  // namespace
