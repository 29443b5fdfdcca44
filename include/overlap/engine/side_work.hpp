#pragma once
/// @file
/// Work of the caller's that an op runs, a piece at a time, in its waits for
/// transfers (mpi::request_group::fill_waits): the single-threaded way to
/// overlap the caller's products with an op's communication, where a started
/// op cannot run on a second thread (SimGrid SMPI: a rank's second thread
/// must not call MPI, and computation is charged to the simulated rank only
/// on its own thread).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "overlap/mpi/request.hpp"

namespace overlap::engine {

/// Pieces of work run in the order they were added: run_one() by the waits
/// of the op whose request group fills with it, run_rest() after the op for
/// whatever its waits left. Local; not thread-safe. A piece that throws
/// propagates out of the wait that ran it (the op then fails as on any other
/// error in its steps) and is not run again.
class side_work final : public mpi::request_group::idle_work {
 public:
  /// Appends a piece.
  void add(std::function<void()> piece) { pieces_.push_back(std::move(piece)); }
  /// Runs the next piece; false when none was left.
  bool run_one() override {
    if (next_ == pieces_.size()) return false;
    std::function<void()> piece = std::move(pieces_[next_++]);
    piece();
    return true;
  }
  /// Runs every piece not run yet.
  void run_rest() {
    while (run_one()) {
    }
  }
  /// Pieces not run yet.
  [[nodiscard]] std::size_t left() const noexcept { return pieces_.size() - next_; }
  /// Pieces run so far (by waits or run_rest).
  [[nodiscard]] std::size_t done() const noexcept { return next_; }

 private:
  std::vector<std::function<void()>> pieces_;
  std::size_t next_ = 0;
};

/// While it lives, the waits of `group` run `work`'s pieces (then what they ran before).
class filling_waits {
 public:
  /// From now on group's waits run work's pieces.
  filling_waits(mpi::request_group& group, side_work& work) noexcept : group_(group), was_(group.fill_waits(&work)) {}
  filling_waits(const filling_waits&) = delete;
  filling_waits& operator=(const filling_waits&) = delete;
  ~filling_waits() { group_.fill_waits(was_); }

 private:
  mpi::request_group& group_;
  mpi::request_group::idle_work* was_;
};

/// How to cut a product's rows into pieces of side work: at most `pieces`
/// runs of at least `least` rows each.
struct row_split {
  int pieces = 8;      ///< the most runs
  int64_t least = 32;  ///< the fewest rows in a run (when there are enough rows)
};

/// Calls f(first, count) for each run of rows [0, rows) cut as s says (one
/// run when rows < 2 * s.least).
template <class F>
void for_row_runs(int64_t rows, const row_split& s, F&& f) {
  int64_t n = s.pieces < 1 ? 1 : s.pieces;
  if (s.least > 0 && rows / s.least < n) n = rows / s.least < 1 ? 1 : rows / s.least;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t first = rows * i / n, last = rows * (i + 1) / n;
    if (last > first) f(first, last - first);
  }
}

}  // namespace overlap::engine
