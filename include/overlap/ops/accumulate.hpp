#pragma once
/// @file
/// The accumulate option of both ops (C += the op's result): C's contents
/// are saved when a call starts and added back when its result is in C, so
/// every schedule, algorithm and element type accumulates alike.

#include <algorithm>
#include <cstdint>

#include "overlap/core/matrix.hpp"
#include "overlap/engine/buffer.hpp"
#include "overlap/ops/geometry.hpp"
#include "overlap/ops/run.hpp"

namespace overlap::detail {

/// A plan's copy of C's contents before a call (allocated when the plan is
/// built, with the plan's other buffers, before the ranks agree to run):
/// every member's, for a batch of `count` C's `stride` elements apart.
template <class T>
struct saved_output {
  bool on = false;
  int64_t count = 1, stride = 0;
  engine::buffer<T> before;

  /// Allocates room for c (rows x cols, packed, per member) when the call accumulates.
  void prepare(bool accumulate, const matrix_view<T>& c, int64_t members = 1, int64_t member_stride = 0) {
    on = accumulate, count = members, stride = member_stride;
    if (on) before = engine::buffer<T>(static_cast<size_t>(c.rows * c.cols * count));
  }
  /// Copies c (the call's start).
  void save(const matrix_view<T>& c) {
    for (int64_t m = 0; m < count; ++m) {
      const matrix_view<T> cm = member(c, stride, m);
      T* to = before.data() + m * c.rows * c.cols;
      for (int64_t i = 0; i < c.rows; ++i) std::copy_n(cm.data + i * c.ld, c.cols, to + i * c.cols);
    }
  }
  /// c = result + contents before (the call's end); bfloat16 adds in float
  /// and rounds once more.
  void add_to(const matrix_view<T>& c) const {
    using wide = std::conditional_t<std::is_same_v<T, double>, double, float>;
    for (int64_t m = 0; m < count; ++m) {
      const matrix_view<T> cm = member(c, stride, m);
      for (int64_t i = 0; i < c.rows; ++i) {
        T* row = cm.data + i * c.ld;
        const T* old = before.data() + (m * c.rows + i) * c.cols;
        for (int64_t j = 0; j < c.cols; ++j) row[j] = T(static_cast<wide>(row[j]) + static_cast<wide>(old[j]));
      }
    }
  }
};

/// Runs `run` (which writes the op's result into c), keeping c's earlier
/// contents when the plan accumulates: the one place both ops, blocking or
/// started, save and add them.
template <class T, class Run>
void run_accumulating(context& ctx, const plan_base& plan, saved_output<T>& saved, const matrix_view<T>& c, Run&& run) {
  if (saved.on) run_local_step(ctx, plan, [&] { saved.save(c); });
  run();
  if (saved.on) run_local_step(ctx, plan, [&] { saved.add_to(c); });
}

}  // namespace overlap::detail
