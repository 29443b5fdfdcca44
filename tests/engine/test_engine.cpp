// The ring engine on its own, with a toy pattern on a one-rank ring
// (MPI_COMM_SELF sends to itself): every step's data arrives `lead` steps
// ahead on each lane, sends may stay in flight `send_slack` steps, and a step
// that throws leaves no request behind.
#include <gtest/gtest.h>

#include <optional>

#include <stdexcept>
#include <vector>

#include "overlap/engine/ring.hpp"
#include "overlap/mpi/communicator.hpp"

namespace {

// Step t of lane l receives value 100 * l + t into its slot and, at step t,
// checks that it holds that value; it sends the value for step t + lead to
// itself at step t. Slots: lead + 1 + slack per lane.
struct toy_pattern {
  int n = 8, lead = 2, slack = 1, lanes = 1, throw_at = -1;
  std::vector<int> slots = std::vector<int>(16, -1);
  std::vector<int> outgoing = std::vector<int>(16, 0);
  int checked = 0;
  [[nodiscard]] int n_slots() const { return lead + 1 + slack; }
  [[nodiscard]] int steps() const { return n; }
  [[nodiscard]] overlap::engine::ring_window window() const { return {lead, slack}; }
  [[nodiscard]] overlap::engine::transfer recv(int t, int l) const {
    if (t < lead) return {};  // the first steps' data is local (nothing is sent for them)
    return {const_cast<int*>(&slots[static_cast<size_t>(l * n_slots() + t % n_slots())]), MPI_INT};
  }
  [[nodiscard]] overlap::engine::transfer send(int t, int l) {
    if (t + lead >= n) return {};
    int& v = outgoing[static_cast<size_t>(l * n + t)];
    v = 100 * l + t + lead;
    return {&v, MPI_INT};
  }
  void compute(int t) {
    if (t == throw_at) throw std::runtime_error("step failed");
    for (int l = 0; l < lanes && t >= lead; ++l) {
      EXPECT_EQ(slots[static_cast<size_t>(l * n_slots() + t % n_slots())], 100 * l + t) << "step " << t;
      ++checked;
    }
  }
};

overlap::engine::ring_links self_links(MPI_Comm comm, int lanes) {
  overlap::engine::ring_links links;
  links.comm = comm;
  links.n_lanes = lanes;
  links.lanes[0] = {0, 0, 7};
  links.lanes[1] = {0, 0, 8};
  return links;
}

TEST(ring_engine, data_arrives_lead_steps_ahead) {
  auto comm = overlap::mpi::communicator::borrow(MPI_COMM_SELF).dup();
  overlap::mpi::request_group requests;
  for (int lead : {1, 2, 3})
    for (int slack : {0, 1, 2})
      for (int lanes : {1, 2}) {
        toy_pattern pat;
        pat.lead = lead, pat.slack = slack, pat.lanes = lanes;
        overlap::engine::run_ring(self_links(comm.get(), lanes), pat, requests, nullptr);
        EXPECT_EQ(pat.checked, lanes * (pat.n - pat.lead)) << "lead " << lead << " slack " << slack;
        EXPECT_TRUE(requests.empty());
      }
}

TEST(ring_engine, requests_complete_by_their_deadline_only) {
  auto comm = overlap::mpi::communicator::borrow(MPI_COMM_SELF).dup();
  overlap::mpi::request_group group;
  int out[3] = {1, 2, 3}, in[3] = {0, 0, 0};
  for (int i = 0; i < 3; ++i) {
    OVERLAP_MPI(MPI_Irecv, &in[i], 1, MPI_INT, 0, i, comm.get(), group.add(i));
    OVERLAP_MPI(MPI_Isend, &out[i], 1, MPI_INT, 0, i, comm.get(), group.add(i));
  }
  group.wait_due(1);  // deadlines 0 and 1 complete; deadline 2 may stay pending
  EXPECT_EQ(in[0], 1);
  EXPECT_EQ(in[1], 2);
  EXPECT_EQ(group.size(), 2);
  group.wait_all();
  EXPECT_EQ(in[2], 3);
  EXPECT_TRUE(group.empty());
}

TEST(ring_engine, a_throwing_step_leaves_no_pending_request) {
  auto comm = overlap::mpi::communicator::borrow(MPI_COMM_SELF).dup();
  overlap::mpi::request_group requests;
  // Under SimGrid SMPI no second thread may call MPI: the ring runs without one there.
  std::optional<overlap::engine::progress_thread> thread;
  if (!overlap::mpi::simulated) thread.emplace(std::chrono::microseconds(50));
  overlap::engine::progress_thread* progress = thread ? &*thread : nullptr;
  toy_pattern bad;
  bad.throw_at = 3;
  EXPECT_THROW(overlap::engine::run_ring(self_links(comm.get(), 1), bad, requests, progress), std::runtime_error);
  EXPECT_TRUE(requests.empty());
  toy_pattern good;  // the same group and thread work afterwards
  overlap::engine::run_ring(self_links(comm.get(), 1), good, requests, progress);
  EXPECT_EQ(good.checked, good.n - good.lead);
}

}  // namespace

// The plan's chunk choice (schedule/chunks.hpp): configured counts win; one node
// takes the minimum; otherwise 12+ pieces, at least `preferred` chunks, and
// no piece below 128 rows or 512 KiB unless the minimum forces it.
#include "overlap/backend/onednn.hpp"
#include "overlap/schedule/chunks.hpp"

namespace {

// The table below reads: configured, min, preferred, ranks, lanes, piece
// rows, bytes per row, one node, knee rows.
int plan_chunks(int configured, int min_chunks, int preferred, int ranks, int lanes, int64_t units, int64_t bytes,
                bool one_node, int64_t knee = 0) {
  overlap::detail::chunk_request r;
  r.configured = configured, r.rule = {min_chunks, preferred}, r.ranks = ranks, r.lanes = lanes;
  r.piece_units = units, r.bytes_per_unit = bytes, r.one_node = one_node, r.knee_units = knee;
  return overlap::detail::plan_chunks(r);
}

TEST(plan_chunks, rules) {
  const int64_t row = 2048 * 4;  // 8 KiB per row: 64 rows make 512 KiB
  EXPECT_EQ(plan_chunks(5, 1, 2, 2, 1, 1024, row, false), 5);
  EXPECT_EQ(plan_chunks(0, 1, 2, 2, 1, 1024, row, true), 1);
  EXPECT_EQ(plan_chunks(0, 2, 3, 2, 1, 1024, row, true), 2);
  EXPECT_EQ(plan_chunks(0, 1, 2, 2, 1, 1024, row, false), 6);  // 12 pieces of 170 rows
  EXPECT_EQ(plan_chunks(0, 1, 2, 4, 1, 512, row, false), 3);   // 12 pieces of 170 rows
  EXPECT_EQ(plan_chunks(0, 1, 2, 3, 2, 512, row, false), 2);   // two lanes: 12 pieces of 256 rows
  // Below 128 rows or 512 KiB the window's preferred count still holds, down
  // to 32 rows and 128 KiB per piece; only then the minimum.
  EXPECT_EQ(plan_chunks(0, 1, 2, 16, 1, 128, row, false), 2);   // 2 pieces of 64 rows
  EXPECT_EQ(plan_chunks(0, 2, 3, 16, 1, 128, row, false), 3);   // 3 of 42 rows, 341 KiB
  EXPECT_EQ(plan_chunks(0, 2, 3, 4, 2, 256, 4096, false), 3);   // bidirectional: 85 rows of 4 KiB
  EXPECT_EQ(plan_chunks(0, 2, 3, 4, 2, 64, row, false), 2);     // 21 rows: reduce-scatter keeps 2
  EXPECT_EQ(plan_chunks(0, 1, 2, 16, 1, 48, row, false), 1);    // 24 rows cannot be halved
  EXPECT_EQ(plan_chunks(0, 1, 2, 2, 1, 96, 1024, false), 1);    // 48 KiB pieces are too small
  EXPECT_EQ(plan_chunks(0, 1, 2, 2, 1, 256, 1024, false), 2);   // 128 KiB pieces are not
  EXPECT_EQ(plan_chunks(0, 1, 2, 2, 1, 1024, 1024, false), 2);  // 1 KiB rows: 512 KiB needs 512 rows
  EXPECT_EQ(plan_chunks(0, 1, 2, 2, 1, 4096, 1024, false), 6);  // 682 rows of 1 KiB
  EXPECT_EQ(plan_chunks(0, 2, 3, 8, 1, 1024, row, false), 3);   // preferred above 12 / 8
  // A kernel's rate knee raises the 128-row floor: 1024 rows as 3 chunks of 341.
  EXPECT_EQ(plan_chunks(0, 1, 2, 2, 1, 1024, row, false, 302), 3);
  EXPECT_EQ(plan_chunks(0, 2, 3, 2, 1, 1024, row, false, 302), 3);
  EXPECT_EQ(plan_chunks(0, 1, 2, 2, 1, 1024, row, false, 600), 1);  // one 1024-row piece per shard
  EXPECT_EQ(plan_chunks(0, 2, 3, 2, 1, 1024, row, false, 600), 2);  // reduce-scatter's minimum wins
  EXPECT_EQ(plan_chunks(0, 1, 2, 2, 1, 1024, row, false, 100), 6);  // below 128: no change
  EXPECT_EQ(plan_chunks(4, 1, 2, 2, 1, 1024, row, false, 600), 4);  // configured counts still win
}

// oneDNN 2.6's sgemm below AVX-512 reads B in place ("no copy") when
// 1/m + 1/n >= 0.0038; the knee is the smallest extent on the copy side,
// checked here against that rule by brute force. Elsewhere there is none.
TEST(gemm_jit_knee, smallest_extent_on_the_copy_side) {
  using overlap::backend::detail::gemm_jit_knee;
  const auto isa = dnnl::get_effective_cpu_isa();
  const bool applies = isa == dnnl::cpu_isa::avx || isa == dnnl::cpu_isa::avx2 || isa == dnnl::cpu_isa::avx2_vnni;
  for (int64_t other : {1, 100, 263, 264, 300, 512, 1000, 2048, 4096, 1 << 20}) {
    const int64_t knee = gemm_jit_knee(true, other);
    EXPECT_EQ(gemm_jit_knee(false, other), 0) << other;  // bf16 kernels have no such switch
    if (!applies || 1.0 / double(other) >= 0.0038) {
      EXPECT_EQ(knee, 0) << other;
      continue;
    }
    auto nocopy = [&](int64_t m) { return 1.0 / double(m) + 1.0 / double(other) >= 0.0038; };
    EXPECT_FALSE(nocopy(knee)) << other;
    EXPECT_TRUE(nocopy(knee - 1)) << other;
  }
  if (applies) {
    EXPECT_EQ(gemm_jit_knee(true, 2048), 302);
  }
}
}  // namespace
