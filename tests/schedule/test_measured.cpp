// strategy::automatic measuring its candidates (OVERLAP_AUTOMATIC=measured):
// the bookkeeping on given times (which candidates, which wins, when it
// measures again), and on a context: the first calls of a shape run the
// candidates in turn with right results, every rank settles on the same
// one, started calls (and batched ones: test_batch.cpp) measure too, a saved choice is taken by a
// later context without measuring, and OVERLAP_AUTOMATIC=model times nothing.
#include <gtest/gtest.h>

#include <cstdio>
#include <limits>
#include <vector>

#include "ag_cases.hpp"
#include "calibrations.hpp"
#include "overlap/ops/measured_plans.hpp"
#include "overlap/schedule/measured.hpp"
#include "rs_cases.hpp"

using namespace testing_support;
using overlap::algorithm;
using overlap::candidate;
using overlap::strategy;
using overlap::detail::measured_choice;

namespace {

candidate make(strategy s, double predicted_ms, algorithm a = algorithm::named, int chunks = 0) {
  return {s, a, s == strategy::bulk && a == algorithm::named ? 0 : (chunks == 0 ? 4 : chunks), predicted_ms * 1e-3};
}

/// A schedule the model chose (`chosen`) from `table`.
overlap::schedule by_model(const candidate& chosen, std::vector<candidate> table) {
  overlap::schedule s = overlap::schedule_of(chosen);
  s.by_model = true;
  s.predicted_s = chosen.predicted_s;
  s.candidates = std::move(table);
  return s;
}

TEST(measured_choice, candidates_are_the_models_choice_bulk_and_the_best_of_another_kind) {
  const candidate bulk = make(strategy::bulk, 100), ring = make(strategy::ring, 60),
                  bidi = make(strategy::bidirectional, 59), o1 = make(strategy::bulk, 70, algorithm::others, 1),
                  o2 = make(strategy::bulk, 57, algorithm::others, 2),
                  o4 = make(strategy::bulk, 56, algorithm::others, 4);
  // The model took the ring (bidirectional within its 3% band): the ring,
  // bulk, and the fastest predicted of another kind (the other operands in
  // 4 pieces), not a second piece count of it.
  auto got = overlap::detail::measured_candidates(by_model(ring, {bulk, ring, bidi, o1, o2, o4}));
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].strategy, strategy::ring);
  EXPECT_EQ(got[1].strategy, strategy::bulk);
  EXPECT_EQ(got[1].algorithm, algorithm::named);
  EXPECT_EQ(got[2].algorithm, algorithm::others);
  EXPECT_EQ(got[2].chunks, 4);
  // The model took the other operands in 2 pieces: bulk and the ring kind
  // (bidirectional, faster predicted), not the other piece counts.
  got = overlap::detail::measured_candidates(by_model(o2, {bulk, ring, bidi, o1, o2, o4}));
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].chunks, 2);
  EXPECT_EQ(got[1].strategy, strategy::bulk);
  EXPECT_EQ(got[2].strategy, strategy::bidirectional);
  // Bulk chosen; unpriced ones left out.
  candidate broken = make(strategy::bidirectional, 1);
  broken.predicted_s = std::numeric_limits<double>::infinity();
  got = overlap::detail::measured_candidates(by_model(bulk, {bulk, ring, broken}));
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].strategy, strategy::bulk);
  EXPECT_EQ(got[1].strategy, strategy::ring);
}

/// The times of the calls a choice asks to time, from `seconds(candidate, round)`,
/// until it settles; returns the calls made.
template <class Seconds>
int measure(measured_choice& m, Seconds&& seconds) {
  int calls = 0, round = 0;
  size_t last = 99;
  while (!m.settled()) {
    const measured_choice::turn t = m.next_call();
    EXPECT_TRUE(t.timed);
    round = t.candidate == last ? round + 1 : 0;
    last = t.candidate;
    m.record(seconds(t.candidate, round));
    ++calls;
  }
  return calls;
}

TEST(measured_choice, settles_on_the_fastest_and_times_one_call_in_fifty) {
  measured_choice m({make(strategy::ring, 50), make(strategy::bulk, 55), make(strategy::bidirectional, 60)}, 0, "k",
                    "call");
  // The first call of each candidate is slow (its page faults): the fastest of its calls counts.
  const double times[3][2] = {{0.080, 0.052}, {0.070, 0.049}, {0.090, 0.051}};
  EXPECT_EQ(measure(m, [&](size_t c, int r) { return times[c][r]; }), 3 * measured_choice::default_rounds);
  EXPECT_EQ(m.running(), 1u);
  EXPECT_EQ(m.chosen().strategy, strategy::bulk);
  EXPECT_DOUBLE_EQ(m.chosen().measured_s, 0.049);
  EXPECT_DOUBLE_EQ(m.candidates()[0].measured_s, 0.052);
  EXPECT_TRUE(m.take_news());
  EXPECT_FALSE(m.take_news());
  for (int64_t call = 1; call <= 2 * measured_choice::drift_every; ++call) {
    const measured_choice::turn t = m.next_call();
    EXPECT_EQ(t.candidate, 1u);
    EXPECT_EQ(t.timed, call % measured_choice::drift_every == 0) << call;
    if (t.timed) m.record(0.050);  // within the bound: stays settled
  }
  EXPECT_TRUE(m.settled());
  EXPECT_EQ(m.measurements(), 1);
}

TEST(measured_choice, one_round_times_each_candidate_once) {
  // SMPI's timing-only runs: a candidate's time is the same on every call.
  measured_choice m({make(strategy::ring, 50), make(strategy::bulk, 55), make(strategy::bidirectional, 60)}, 0, "k",
                    "call", 1);
  EXPECT_EQ(m.rounds(), 1);
  const double times[3] = {0.052, 0.049, 0.051};
  EXPECT_EQ(measure(m, [&](size_t c, int r) { return times[c] + r; }), 3);
  EXPECT_EQ(m.chosen().strategy, strategy::bulk);
  EXPECT_DOUBLE_EQ(m.chosen().measured_s, 0.049);
  EXPECT_NE(m.evidence().find("timed on 1 call each"), std::string::npos) << m.evidence();
  // Fewer than one round is one.
  EXPECT_EQ(measured_choice({make(strategy::ring, 50)}, 0, "k", "call", 0).rounds(), 1);
}

TEST(measured_choice, a_tie_keeps_the_models_order) {
  measured_choice m({make(strategy::ring, 50), make(strategy::bulk, 55)}, 0, "k", "call");
  measure(m, [](size_t, int) { return 0.040; });
  EXPECT_EQ(m.chosen().strategy, strategy::ring);
}

TEST(measured_choice, drift_and_the_recheck_measure_again) {
  measured_choice m({make(strategy::ring, 50), make(strategy::bulk, 55)}, 0, "k", "call");
  measure(m, [](size_t c, int) { return c == 0 ? 0.040 : 0.050; });
  ASSERT_EQ(m.chosen().strategy, strategy::ring);
  // A sampled call 30% slower: every candidate is timed again, and the
  // network that slowed the ring now makes bulk the faster.
  for (int64_t i = 1; i < measured_choice::drift_every; ++i) EXPECT_FALSE(m.next_call().timed);
  ASSERT_TRUE(m.next_call().timed);
  m.record(0.052);
  EXPECT_FALSE(m.settled());
  EXPECT_NE(m.reason().find("re-measured"), std::string::npos) << m.reason();
  measure(m, [](size_t c, int) { return c == 0 ? 0.060 : 0.050; });
  EXPECT_EQ(m.chosen().strategy, strategy::bulk);
  EXPECT_EQ(m.measurements(), 2);
  // Every `recheck` calls, whatever the samples say.
  measured_choice r({make(strategy::ring, 50), make(strategy::bulk, 55)}, 7, "k", "call");
  measure(r, [](size_t c, int) { return c == 0 ? 0.040 : 0.050; });
  for (int i = 1; i < 7; ++i) EXPECT_FALSE(r.next_call().timed);
  EXPECT_TRUE(r.next_call().timed);
  EXPECT_FALSE(r.settled());
  EXPECT_NE(r.reason().find("after 7 calls"), std::string::npos) << r.reason();
}

TEST(measured_choice, a_candidate_that_cannot_be_built_is_skipped_and_a_saved_one_taken) {
  measured_choice m({make(strategy::ring, 50), make(strategy::bidirectional, 52), make(strategy::bulk, 55)}, 0, "k",
                    "call");
  EXPECT_EQ(m.next_call().candidate, 0u);
  m.skip(0);  // its plan failed to build, on every rank alike
  EXPECT_EQ(m.running(), 1u);
  measure(m, [](size_t c, int) { return c == 1 ? 0.045 : 0.050; });
  EXPECT_EQ(m.chosen().strategy, strategy::bidirectional);
  measured_choice s({make(strategy::ring, 50), make(strategy::bulk, 55)}, 0, "k", "call");
  s.settle_on(1, 0.030, "file.json");
  EXPECT_TRUE(s.settled());
  EXPECT_EQ(s.running(), 1u);
  EXPECT_NE(s.evidence().find("file.json"), std::string::npos);
}

TEST(measured_choice, choices_round_trip_through_the_calibration_file) {
  overlap::calibration c = slow_network();
  c.choices["all_gather_matmul/2r2n/00ff"] = {make(strategy::ring, 50, algorithm::named, 3), "ag f32 on 2 ranks"};
  c.choices["all_gather_matmul/2r2n/00ff"].chosen.measured_s = 0.0425;
  const overlap::calibration back = overlap::calibration::from_json(c.to_json(), "test");
  ASSERT_EQ(back.choices.size(), 1u);
  const overlap::saved_choice& s = back.choices.at("all_gather_matmul/2r2n/00ff");
  EXPECT_EQ(s.chosen.strategy, strategy::ring);
  EXPECT_EQ(s.chosen.chunks, 3);
  EXPECT_NEAR(s.chosen.measured_s, 0.0425, 1e-12);
  EXPECT_EQ(s.call, "ag f32 on 2 ranks");
  std::string bad = c.to_json();
  bad.replace(bad.find("\"ring\""), 6, "\"automatic\"");
  EXPECT_THROW((void)overlap::calibration::from_json(bad, "test"), std::invalid_argument);
}

/// Every rank's (strategy, algorithm, chunks) of s equals rank 0's.
void expect_same_everywhere(const overlap::schedule& s) {
  const int mine[3] = {static_cast<int>(s.strategy), static_cast<int>(s.algorithm), s.chunks};
  std::vector<int> all(3 * static_cast<size_t>(world_size()));
  MPI_Allgather(mine, 3, MPI_INT, all.data(), 3, MPI_INT, MPI_COMM_WORLD);
  for (size_t r = 0; r < all.size(); r += 3)
    EXPECT_TRUE(all[r] == all[0] && all[r + 1] == all[1] && all[r + 2] == all[2]) << "rank " << r / 3;
}

/// An all_gather_matmul shape worth decomposing (uneven shards), called
/// `calls` times with its result checked each time; returns its schedule.
overlap::schedule call_ag_shape(overlap::context& ctx, int calls, bool started = false,
                                size_t* measuring_after = nullptr) {
  ag_case cs{overlap::gathered::lhs_rows, strategy::automatic, 96, 64, 80, split::skewed, 1, false, 7};
  cs.started = started;
  ag_problem<float> pr = make_ag_problem<float>(ctx, cs);
  const overlap::ag_options opt = ag_options_of(cs, pr);
  for (int i = 0; i < calls; ++i) {
    for (auto& v : pr.c.data) v = -999.0f;
    call_ag<float>(ctx, cs, pr.a().cview(), pr.b().cview(), pr.c.view(), pr.out.view(), opt);
    check_ag_problem(ctx, cs, pr, " call " + std::to_string(i));
    if (measuring_after != nullptr) measuring_after[i] = ctx.measuring();
  }
  return overlap::all_gather_matmul_schedule<float>(ctx, pr.a().cview(), pr.b().cview(), pr.c.view(), opt);
}

TEST(measured_automatic, the_first_calls_time_the_candidates_then_the_fastest_runs) {
  for (bool started : {false, true}) {
    overlap::context ctx(MPI_COMM_WORLD, with_calibration(write_file(slow_network().to_json())));
    size_t measuring[8];
    const overlap::schedule s = call_ag_shape(ctx, 8, started, measuring);
    if (ctx.size() == 1) {  // nothing travels: bulk, nothing timed
      EXPECT_FALSE(s.by_model);
      EXPECT_EQ(measuring[0], 0u);
      continue;
    }
    ASSERT_TRUE(s.by_measurement) << overlap::to_string(s);
    size_t timed = 0;
    double fastest = 1e30;
    bool bulk = false;
    for (const candidate& c : s.candidates)
      if (c.measured_s >= 0) {
        ++timed;
        fastest = std::min(fastest, c.measured_s);
        bulk = bulk || (c.strategy == strategy::bulk && c.algorithm == algorithm::named);
      }
    EXPECT_GE(timed, 2u) << overlap::to_string(s);
    EXPECT_LE(timed, 3u) << overlap::to_string(s);
    EXPECT_TRUE(bulk) << overlap::to_string(s);
    // Two timed calls of each (one in SMPI's timing-only runs), then settled
    // (a started call's time is agreed when the next call is prepared: one
    // call later).
    const auto rounds = static_cast<size_t>(overlap::detail::measured_rounds(ctx));
    EXPECT_EQ(rounds, overlap::mpi::simulated && ctx.config().sim != overlap::sim_compute::measured &&
                              ctx.config().sim != overlap::sim_compute::steady
                          ? 1u
                          : 2u);
    const size_t settles_after = rounds * timed + (started ? 1 : 0);
    EXPECT_EQ(measuring[settles_after - 2], 1u);
    EXPECT_EQ(measuring[settles_after - 1], 0u);
    for (const candidate& c : s.candidates) {
      if (c.strategy == s.strategy && c.algorithm == s.algorithm && c.chunks == s.chunks) {
        EXPECT_DOUBLE_EQ(c.measured_s, fastest) << overlap::to_string(s);
      }
    }
    expect_same_everywhere(s);
    bool reported = false;
    for (const auto& p : ctx.plan_reports())
      reported = reported || p.schedule.find("measured choice") != std::string::npos;
    EXPECT_TRUE(reported);
  }
}

TEST(measured_automatic, reduce_scatter_calls_measure_too) {
  overlap::context ctx(MPI_COMM_WORLD, with_calibration(write_file(slow_network().to_json())));
  rs_case cs{overlap::scattered::rows, strategy::automatic, 90, 70, 96, split::skewed, split::balanced, 1, 3};
  for (int i = 0; i < 8; ++i) run_rs_case<float>(ctx, cs);
  EXPECT_EQ(ctx.measuring(), 0u);
  if (ctx.size() == 1) return;
  bool measured = false;
  for (const auto& p : ctx.plan_reports())
    measured = measured || p.schedule.find("measured choice") != std::string::npos;
  EXPECT_TRUE(measured);
}

TEST(measured_automatic, a_saved_choice_is_taken_without_measuring) {
  std::string saved;
  overlap::schedule first;
  {
    overlap::context ctx(MPI_COMM_WORLD, with_calibration(write_file(slow_network().to_json())));
    first = call_ag_shape(ctx, 8);
    saved = "overlap-test-saved-choices-" + std::to_string(world_size()) + ".json";
    EXPECT_TRUE(ctx.save_calibration(saved));
    MPI_Barrier(MPI_COMM_WORLD);
  }
  overlap::context later(MPI_COMM_WORLD, with_calibration(saved));
  size_t measuring[1];
  const overlap::schedule s = call_ag_shape(later, 1, false, measuring);
  EXPECT_EQ(measuring[0], 0u);
  EXPECT_TRUE(s.same_as(first)) << overlap::to_string(s) << " against " << overlap::to_string(first);
  if (later.size() == 1) return;
  EXPECT_TRUE(s.by_measurement);
  EXPECT_NE(s.evidence.find(saved), std::string::npos) << s.evidence;
  EXPECT_EQ(later.plans_built(), 1u);  // only the chosen candidate's plan
}

TEST(measured_automatic, the_model_setting_times_nothing) {
  overlap::config cfg = with_calibration(write_file(slow_network().to_json()));
  cfg.automatic = overlap::automatic_choice::model;
  overlap::context ctx(MPI_COMM_WORLD, cfg);
  size_t measuring[3];
  const overlap::schedule s = call_ag_shape(ctx, 3, false, measuring);
  EXPECT_EQ(measuring[0], 0u);
  EXPECT_FALSE(s.by_measurement);
  EXPECT_EQ(s.by_model, ctx.size() > 1);
  EXPECT_EQ(ctx.plans_built(), 1u);
}

TEST(measured_automatic, the_setting_must_agree_across_ranks) {
  if (world_size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  overlap::config cfg = with_calibration(write_file(slow_network().to_json()));
  if (world_rank() == 1) cfg.automatic = overlap::automatic_choice::model;
  overlap::context ctx(MPI_COMM_WORLD, cfg);
  try {
    call_ag_shape(ctx, 1);
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("config.automatic"), std::string::npos) << e.what();
  }
}

}  // namespace
