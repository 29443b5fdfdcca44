// A call whose plan is cached allocates nothing on the C++ heap: argument
// checks build no message unless one fails, the plan key is rebuilt in the
// context's scratch, and the ring engine, the request groups and the
// progress thread reuse what the plan owns. Counted with a replaced global
// operator new, over every schedule of both ops. The Eigen backend keeps the
// GEMM library's own allocations out of the count (oneDNN allocates inside
// every primitive execution; that is the library's, not ours).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <vector>

#include "calibrations.hpp"
#include "overlap/overlap.hpp"
#include "reference.hpp"

// The replacements below pair malloc with free; GCC cannot see that they
// replace the global operators and warns at every inlined delete.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace {
std::atomic<long> allocations{0};
std::atomic<bool> counting{false};
}  // namespace

void* operator new(std::size_t n) {
  if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
// The nothrow forms too (std::stable_sort's buffer uses them): every pair
// malloc/free, so a sanitizer sees no mismatch.
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n == 0 ? 1 : n);
}
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace {

using testing_support::plan_choice;
using testing_support::plan_choices;

TEST(cached_call, allocates_nothing) {
  overlap::config cfg;
  cfg.backend = overlap::backend_kind::eigen;
  overlap::context ctx(MPI_COMM_WORLD, cfg);
  const int R = ctx.size();
  const int64_t m = 24, n = 16, k = 20;  // per rank: A rows (AG) / C rows (RS)
  std::vector<double> a(static_cast<size_t>(m * R * k), 1.0), b(static_cast<size_t>(k * n), 0.5),
      c(static_cast<size_t>(m * R * n)), bias(static_cast<size_t>(n), 0.25);
  for (const plan_choice& choice : plan_choices) {
    overlap::ag_options ag;
    ag.strategy = choice.strategy, ag.algorithm = choice.algorithm;
    ag.epilogue = {overlap::activation::relu, bias.data()};
    overlap::rs_options rs;
    rs.strategy = choice.strategy, rs.algorithm = choice.algorithm;
    auto calls = [&] {
      overlap::all_gather_matmul<double>(ctx, {a.data(), m, k}, {b.data(), k, n}, {c.data(), m * R, n}, ag);
      overlap::matmul_reduce_scatter<double>(ctx, {a.data(), m * R, k}, {b.data(), k, n}, {c.data(), m, n}, rs);
    };
    calls();  // builds and caches both plans
    MPI_Barrier(MPI_COMM_WORLD);
    allocations = 0;
    counting = true;
    for (int i = 0; i < 5; ++i) calls();
    counting = false;
    EXPECT_EQ(allocations.load(), 0) << testing_support::to_string(choice) << ": heap allocations in 5 cached calls";
  }
  EXPECT_EQ(ctx.plans_built(), 2 * std::size(plan_choices));
}

// strategy::automatic where it measures (a calibration makes it ask the
// model on one machine): once the choice settled, a call runs the chosen
// plan and allocates nothing either. (The window stays below the one call
// in measured_choice::drift_every that is timed: a call this small varies
// by more than the drift bound, which would measure again.)
TEST(cached_call, a_settled_measured_choice_allocates_nothing) {
  overlap::config cfg = testing_support::with_calibration(
      testing_support::write_file(testing_support::slow_network().to_json(), "cached-call-calibration"));
  cfg.backend = overlap::backend_kind::eigen;
  overlap::context ctx(MPI_COMM_WORLD, cfg);
  const int R = ctx.size();
  const int64_t m = 24, n = 16, k = 20;
  std::vector<double> a(static_cast<size_t>(m * R * k), 1.0), b(static_cast<size_t>(k * n), 0.5),
      c(static_cast<size_t>(m * R * n));
  auto call = [&] {
    overlap::all_gather_matmul<double>(ctx, {a.data(), m, k}, {b.data(), k, n}, {c.data(), m * R, n});
  };
  int settling = 0;
  do {
    call();
  } while (++settling < 20 && ctx.measuring() > 0);
  ASSERT_EQ(ctx.measuring(), 0u);
  call();  // the first settled call writes the choice's words for plan_reports, once
  MPI_Barrier(MPI_COMM_WORLD);
  allocations = 0;
  counting = true;
  for (int i = 0; i + 3 < overlap::detail::measured_choice::drift_every; ++i) call();
  counting = false;
  EXPECT_EQ(allocations.load(), 0) << "heap allocations in cached calls of a settled measured choice";
}

}  // namespace
