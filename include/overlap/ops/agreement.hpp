#pragma once
/// @file
/// Argument checks that end the same way on every rank.
///
/// A local check that fails on one rank must not leave the other ranks in a
/// collective: every op call first runs one small MPI_Allreduce that carries
/// (any rank failed?, any rank lacks the plan?, the plans' fingerprints). Only
/// on a plan miss are the per-rank sizes exchanged, and the cross-rank rules
/// are then checked on that exchange, identically on every rank.

#include <mpi.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "overlap/context.hpp"
#include "overlap/matrix.hpp"

namespace overlap::detail {

/// Collects the first failed rule of a call on this rank.
class arg_checks {
 public:
  explicit arg_checks(std::string op) : op_(std::move(op)) {}
  /// Records msg unless cond holds or an earlier rule already failed.
  void require(bool cond, const std::string& msg) {
    if (!cond && failure_.empty()) failure_ = msg;
  }
  template <class T>
  void view(const char* name, const matrix_view<T>& v) {
    const std::string n(name);
    require(v.rows >= 0, n + ".rows (" + std::to_string(v.rows) + ") must be >= 0");
    require(v.cols >= 0, n + ".cols (" + std::to_string(v.cols) + ") must be >= 0");
    require(v.ld >= v.cols, n + ".ld (" + std::to_string(v.ld) + ") must be >= " + n + ".cols (" +
                                std::to_string(v.cols) + ")");
    require(v.empty() || v.data != nullptr, n + ".data must not be null for a non-empty " +
                                                std::to_string(v.rows) + " x " + std::to_string(v.cols) +
                                                " view");
  }
  [[nodiscard]] bool failed() const noexcept { return !failure_.empty(); }
  [[nodiscard]] const std::string& failure() const noexcept { return failure_; }
  [[nodiscard]] const std::string& op() const noexcept { return op_; }

 private:
  std::string op_;
  std::string failure_;
};

[[nodiscard]] inline uint64_t hash_values(const std::vector<int64_t>& values, uint64_t seed = 1469598103934665603ull) {
  uint64_t h = seed;  // FNV-1a over the bytes
  for (int64_t v : values) {
    auto u = static_cast<uint64_t>(v);
    for (int b = 0; b < 8; ++b) {
      h ^= (u >> (8 * b)) & 0xffu;
      h *= 1099511628211ull;
    }
  }
  return h;
}

/// Collective. Throws std::invalid_argument on every rank when any rank's
/// checks failed (the message is the lowest failing rank's). Returns true when
/// every rank holds a cached plan and all those plans were built together.
inline bool agree(context& ctx, const arg_checks& checks, const plan_base* cached) {
  // Fingerprints are masked to 62 bits so that negating them cannot overflow.
  const int64_t fp = cached ? static_cast<int64_t>(cached->fingerprint >> 2) : -1;
  int64_t in[4] = {checks.failed() ? 1 : 0, cached ? 0 : 1, fp, -fp};
  int64_t out[4] = {};
  OVERLAP_MPI(MPI_Allreduce, in, out, 4, MPI_INT64_T, MPI_MAX, ctx.comm());
  if (out[0] != 0) {
    int mine = checks.failed() ? ctx.rank() : ctx.size();
    int root = 0;
    OVERLAP_MPI(MPI_Allreduce, &mine, &root, 1, MPI_INT, MPI_MIN, ctx.comm());
    std::string msg = checks.failure();
    int len = static_cast<int>(msg.size());
    OVERLAP_MPI(MPI_Bcast, &len, 1, MPI_INT, root, ctx.comm());
    msg.resize(static_cast<size_t>(len));
    OVERLAP_MPI(MPI_Bcast, msg.data(), len, MPI_CHAR, root, ctx.comm());
    throw std::invalid_argument(checks.op() + ": on rank " + std::to_string(root) + ": " + msg);
  }
  return out[1] == 0 && out[2] == -out[3];
}

/// Collective: every rank's `mine` (all of the same length); row r of the
/// result is rank r's values.
[[nodiscard]] inline std::vector<int64_t> allgather_values(context& ctx, const std::vector<int64_t>& mine) {
  std::vector<int64_t> all(mine.size() * static_cast<size_t>(ctx.size()));
  OVERLAP_MPI(MPI_Allgather, mine.data(), static_cast<int>(mine.size()), MPI_INT64_T, all.data(),
              static_cast<int>(mine.size()), MPI_INT64_T, ctx.comm());
  return all;
}

}  // namespace overlap::detail
