#pragma once
/// @file
/// Bounded waits for the watchdog (config::timeout_s): test, spin briefly,
/// then sleep with a growing back-off so a rank waiting for an absent peer
/// does not keep a core busy; give up after the timeout.

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include "overlap/mpi/simulator.hpp"

namespace overlap::mpi {

/// A wait that outlasted the watchdog's timeout; what() says what it waited for.
class wait_timeout : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Calls test() until it returns true (then true) or until timeout_s seconds
/// have passed (then false). Spins for the first millisecond (a transfer
/// about to finish), then sleeps 10 us, doubling up to 1 ms between tests.
template <class Test>
[[nodiscard]] bool poll_until(Test&& test, double timeout_s) {
  using std::chrono::microseconds;
  const double start = MPI_Wtime();
  microseconds nap{10};
  while (!test()) {
    const double waited = MPI_Wtime() - start;
    if (waited > timeout_s) return false;
    // Under SMPI each MPI_Test advances simulated time; a real sleep would
    // only be charged to this rank as computation.
    if (!simulated && waited > 1e-3) {
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, microseconds{1000});
    }
  }
  return true;
}

}  // namespace overlap::mpi
