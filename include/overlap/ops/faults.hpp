#pragma once
/// @file
/// Test hooks that make one rank fail or stall inside an op (the fault and
/// watchdog tests use them; nothing else should).

#include <chrono>
#include <string>
#include <thread>

#include "overlap/core/error.hpp"
#include "overlap/engine/ring.hpp"

namespace overlap::detail {

/// Test hook: the context rank `rank` fails (throws overlap::error from its
/// GEMM) at ring step `step` of every ring it runs, or, with stall_s > 0,
/// sleeps that long there (and before a bulk op's collective) instead;
/// rank -1: off. Tests of the fatal policy and the watchdog set it; nothing
/// else should.
struct fault_injection {
  int rank = -1;
  int step = -1;
  double stall_s = 0;
};
inline fault_injection test_fault;

/// The stall of test_fault, on its rank.
inline void maybe_stall(int rank) {
  if (test_fault.rank == rank && test_fault.stall_s > 0)
    std::this_thread::sleep_for(std::chrono::duration<double>(test_fault.stall_s));
}

/// A pattern whose step `step` fails, for fault_injection.
template <class Pattern>
struct faulty_pattern {
  Pattern& p;
  int step;
  [[nodiscard]] int steps() const { return p.steps(); }
  [[nodiscard]] engine::ring_window window() const { return p.window(); }
  [[nodiscard]] engine::transfer recv(int t, int lane) const { return p.recv(t, lane); }
  [[nodiscard]] engine::transfer send(int t, int lane) const { return p.send(t, lane); }
  void compute(int t) {
    if (t == step) {
      if (test_fault.stall_s <= 0)
        throw error(error_source::backend, -1, "test fault", "injected at ring step " + std::to_string(t + 1));
      maybe_stall(test_fault.rank);
    }
    p.compute(t);
  }
};

}  // namespace overlap::detail
