// The ring engine on its own, with a toy pattern on a one-rank ring
// (MPI_COMM_SELF sends to itself): every step's data arrives `lead` steps
// ahead, and a step that throws leaves no request behind.
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "overlap/engine/ring.hpp"
#include "overlap/mpi/communicator.hpp"

namespace {

// Step t receives value t into slot t % (lead + 1) and, at step t, checks
// that it holds t, then sends the value t + lead to itself for step t + lead.
struct toy_pattern {
  int n = 8, lead_ = 2, throw_at = -1;
  std::vector<int> slots = std::vector<int>(3, -1);
  std::vector<int> outgoing = std::vector<int>(8, 0);
  int checked = 0;
  [[nodiscard]] int steps() const { return n; }
  [[nodiscard]] int lead() const { return lead_; }
  [[nodiscard]] overlap::engine::transfer recv(int t) const {
    return {const_cast<int*>(&slots[static_cast<size_t>(t % (lead_ + 1))]), MPI_INT};
  }
  [[nodiscard]] overlap::engine::transfer send(int t) {
    if (t + lead_ >= n) return {};
    outgoing[static_cast<size_t>(t)] = t + lead_;
    return {&outgoing[static_cast<size_t>(t)], MPI_INT};
  }
  void compute(int t) {
    if (t == throw_at) throw std::runtime_error("step failed");
    if (t >= lead_) {
      EXPECT_EQ(slots[static_cast<size_t>(t % (lead_ + 1))], t) << "step " << t;
      ++checked;
    }
  }
};

TEST(ring_engine, data_arrives_lead_steps_ahead) {
  auto comm = overlap::mpi::communicator::borrow(MPI_COMM_SELF).dup();
  overlap::mpi::request_group requests;
  toy_pattern pat;
  overlap::engine::run_ring({comm.get(), 0, 0, 7}, pat, requests, nullptr);
  EXPECT_EQ(pat.checked, pat.n - pat.lead_);
  EXPECT_TRUE(requests.empty());
}

TEST(ring_engine, a_throwing_step_leaves_no_pending_request) {
  auto comm = overlap::mpi::communicator::borrow(MPI_COMM_SELF).dup();
  overlap::mpi::request_group requests;
  overlap::engine::progress_thread progress(std::chrono::microseconds(50));
  toy_pattern bad;
  bad.throw_at = 3;
  EXPECT_THROW(overlap::engine::run_ring({comm.get(), 0, 0, 7}, bad, requests, &progress), std::runtime_error);
  EXPECT_TRUE(requests.empty());
  toy_pattern good;  // the same group and thread work afterwards
  overlap::engine::run_ring({comm.get(), 0, 0, 7}, good, requests, &progress);
  EXPECT_EQ(good.checked, good.n - good.lead_);
}

}  // namespace
