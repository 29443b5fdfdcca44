#pragma once
/// @file
/// The accumulate option of both ops (C += the op's result): C's contents
/// are saved when a call starts and added back when its result is in C, so
/// every schedule, algorithm and element type accumulates alike.

#include <algorithm>
#include <cstdint>

#include "overlap/engine/buffer.hpp"
#include "overlap/matrix.hpp"

namespace overlap::detail {

/// A plan's copy of C's contents before a call (allocated when the plan is
/// built, with the plan's other buffers, before the ranks agree to run).
template <class T>
struct saved_output {
  bool on = false;
  engine::buffer<T> before;

  /// Allocates room for c (rows x cols, packed) when the call accumulates.
  void prepare(bool accumulate, const matrix_view<T>& c) {
    on = accumulate;
    if (on) before = engine::buffer<T>(static_cast<size_t>(c.rows * c.cols));
  }
  /// Copies c (the call's start).
  void save(const matrix_view<T>& c) {
    for (int64_t i = 0; i < c.rows; ++i) std::copy_n(c.data + i * c.ld, c.cols, before.data() + i * c.cols);
  }
  /// c = result + contents before (the call's end); bfloat16 adds in float
  /// and rounds once more.
  void add_to(const matrix_view<T>& c) const {
    using wide = std::conditional_t<std::is_same_v<T, double>, double, float>;
    for (int64_t i = 0; i < c.rows; ++i) {
      T* row = c.data + i * c.ld;
      const T* old = before.data() + i * c.cols;
      for (int64_t j = 0; j < c.cols; ++j) row[j] = T(static_cast<wide>(row[j]) + static_cast<wide>(old[j]));
    }
  }
};

}  // namespace overlap::detail
