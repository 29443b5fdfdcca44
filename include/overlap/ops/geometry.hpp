#pragma once
/// @file
/// Shapes of the ops' operands: logical dimensions of possibly transposed
/// views, index ranges and their chunks, and block copies.

#include <algorithm>
#include <cstdint>
#include <string>

#include "overlap/core/matrix.hpp"
#include "overlap/mpi/timing_only.hpp"

namespace overlap::detail {

/// Rows and columns of op(v): v itself, or v^T when transposed.
struct dims2 {
  int64_t rows = 0, cols = 0;
};
template <class T>
dims2 op_dims(const matrix_view<T>& v, bool transposed) {
  return transposed ? dims2{v.cols, v.rows} : dims2{v.rows, v.cols};
}
/// "a" or "a^T": how messages name an operand's logical form.
inline std::string op_name(const char* n, bool transposed) { return transposed ? std::string(n) + "^T" : n; }
/// Start of chunk j when `extent` is split into `chunks` near-equal parts.
inline int64_t chunk_begin(int64_t extent, int chunks, int j) {
  return extent / chunks * j + std::min<int64_t>(j, extent % chunks);
}

/// A half-open index range [begin, begin + len).
struct range {
  int64_t begin = 0, len = 0;
  [[nodiscard]] range chunk(int chunks, int j) const {
    const int64_t b = chunk_begin(len, chunks, j);
    return {begin + b, chunk_begin(len, chunks, j + 1) - b};
  }
};

/// Copies src into dst (the same shape). In SMPI's timing-only runs the
/// copy is skipped and its time charged (mpi::timing_only_buffers).
template <class T>
void copy_block(matrix_view<const T> src, matrix_view<T> dst) {
  if (mpi::timing_only_buffers()) return mpi::charge_copy(double(src.rows) * double(src.cols) * double(sizeof(T)));
  for (int64_t i = 0; i < src.rows; ++i) std::copy_n(src.data + i * src.ld, src.cols, dst.data + i * dst.ld);
}

/// Member m of a strided batch whose member 0 is v, `stride` elements apart.
template <class T>
matrix_view<T> member(const matrix_view<T>& v, int64_t stride, int64_t m) {
  return {v.data == nullptr ? nullptr : v.data + m * stride, v.rows, v.cols, v.ld};
}

}  // namespace overlap::detail
