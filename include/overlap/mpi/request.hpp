#pragma once
/// @file
/// Move-only non-blocking requests that cannot be dropped while pending.

#include <mpi.h>

#include <utility>
#include <vector>

#include "overlap/error.hpp"

namespace overlap::mpi {

/// A group of outstanding requests completed together. Storage is reserved
/// once (plans size it), so posting in the hot loop does not allocate.
/// Destroying a group with pending requests cancels and completes them, so a
/// request never outlives the buffers of the scope that posted it.
class request_group {
 public:
  request_group() = default;
  request_group(const request_group&) = delete;
  request_group& operator=(const request_group&) = delete;
  request_group(request_group&& other) noexcept : reqs_(std::move(other.reqs_)) { other.reqs_.clear(); }
  request_group& operator=(request_group&& other) noexcept {
    if (this != &other) {
      abandon();
      reqs_ = std::move(other.reqs_);
      other.reqs_.clear();
    }
    return *this;
  }
  ~request_group() { abandon(); }

  void reserve(size_t n) { reqs_.reserve(n); }
  /// A slot for MPI_Isend / MPI_Irecv to write the new request into.
  [[nodiscard]] MPI_Request* add() { return &reqs_.emplace_back(MPI_REQUEST_NULL); }
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
  }

 private:
  void abandon() noexcept {
    for (auto& r : reqs_) {
      if (r == MPI_REQUEST_NULL) continue;
      MPI_Cancel(&r);
      MPI_Wait(&r, MPI_STATUS_IGNORE);
    }
    reqs_.clear();
  }

  std::vector<MPI_Request> reqs_;
};

}  // namespace overlap::mpi
