#pragma once
// Bad input: every rank must raise std::invalid_argument (never hang, never
// compute), and the context must stay usable afterwards.
#include <gtest/gtest.h>
#include <mpi.h>

#include <functional>
#include <stdexcept>
#include <string>

namespace testing_support {

/// Runs `bad` on every rank, expects std::invalid_argument containing
/// `needle` everywhere, then runs `valid`, a valid call on the same context.
inline void expect_all_ranks_reject(const std::string& needle, const std::function<void()>& bad,
                                    const std::function<void()>& valid) {
  bool threw = false;
  try {
    bad();
  } catch (const std::invalid_argument& e) {
    threw = true;
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
  }
  EXPECT_TRUE(threw) << "expected std::invalid_argument mentioning '" << needle << "'";
  int all = 0;
  int mine = threw ? 1 : 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  EXPECT_EQ(all, 1) << "some rank did not throw";
  valid();
}

}  // namespace testing_support
