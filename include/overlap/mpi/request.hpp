#pragma once
/// @file
/// Move-only non-blocking requests that cannot be dropped while pending.

#include <mpi.h>

#include <utility>
#include <vector>

#include "overlap/error.hpp"

namespace overlap::mpi {

/// A group of outstanding requests, each with a deadline: the step before
/// which it must have completed (the ring engine completes a step's receives
/// just before the step computes, and lets sends run on while the buffers they
/// read stay untouched). Destroying a group with pending requests cancels and
/// completes them, so a request never outlives the buffers of the scope that
/// posted it.
class request_group {
 public:
  request_group() = default;
  request_group(const request_group&) = delete;
  request_group& operator=(const request_group&) = delete;
  request_group(request_group&& other) noexcept
      : reqs_(std::move(other.reqs_)), due_(std::move(other.due_)) {
    other.reqs_.clear();
    other.due_.clear();
  }
  request_group& operator=(request_group&& other) noexcept {
    if (this != &other) {
      abandon();
      reqs_ = std::move(other.reqs_);
      due_ = std::move(other.due_);
      other.reqs_.clear();
      other.due_.clear();
    }
    return *this;
  }
  ~request_group() { abandon(); }

  /// A slot for MPI_Isend / MPI_Irecv to write the new request into; it must
  /// complete before step `deadline` (see wait_due). Storage grows to the
  /// largest window once and is reused, so the hot loop does not allocate.
  [[nodiscard]] MPI_Request* add(int deadline = 0) {
    due_.push_back(deadline);
    return &reqs_.emplace_back(MPI_REQUEST_NULL);
  }
  [[nodiscard]] bool empty() const noexcept { return reqs_.empty(); }
  [[nodiscard]] int size() const noexcept { return static_cast<int>(reqs_.size()); }

  /// Non-blocking progress; true when every request has completed.
  bool test_all() {
    if (reqs_.empty()) return true;
    int done = 0;
    OVERLAP_MPI(MPI_Testall, size(), reqs_.data(), &done, MPI_STATUSES_IGNORE);
    return done != 0;
  }
  /// Cancels and completes every pending request and empties the group (for
  /// error paths: a request must not outlive the step that posted it).
  void cancel_all() noexcept { abandon(); }

  /// Blocks until every request has completed, then empties the group.
  void wait_all() {
    if (reqs_.empty()) return;
    const int rc = MPI_Waitall(size(), reqs_.data(), MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
      abandon();
      detail::throw_mpi_error(rc, "MPI_Waitall");
    }
    reqs_.clear();
    due_.clear();
  }

  /// Blocks until every request whose deadline is <= step has completed and
  /// drops those from the group; later ones stay outstanding.
  void wait_due(int step) {
    size_t kept = 0;
    for (size_t i = 0; i < reqs_.size(); ++i) {
      if (due_[i] <= step) {
        const int rc = MPI_Wait(&reqs_[i], MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
          abandon();
          detail::throw_mpi_error(rc, "MPI_Wait");
        }
        continue;
      }
      reqs_[kept] = reqs_[i];
      due_[kept] = due_[i];
      ++kept;
    }
    reqs_.resize(kept);
    due_.resize(kept);
  }

 private:
  void abandon() noexcept {
    for (auto& r : reqs_) {
      if (r == MPI_REQUEST_NULL) continue;
      MPI_Cancel(&r);
      MPI_Wait(&r, MPI_STATUS_IGNORE);
    }
    reqs_.clear();
    due_.clear();
  }

  std::vector<MPI_Request> reqs_;
  std::vector<int> due_;  ///< deadline step of each request
};

}  // namespace overlap::mpi
