#pragma once
/// @file
/// Non-owning row-major matrix views and the block distribution of a
/// dimension over the ranks of a communicator.

#include <cstddef>
#include <cstdint>
#include <numeric>
#include <type_traits>
#include <vector>

namespace overlap {

/// A row-major view: element (i, j) is data[i * ld + j], ld >= cols.
/// Use matrix_view<const T> for inputs. A view with rows == 0 or cols == 0
/// is empty and may have data == nullptr.
template <class T>
struct matrix_view {
  T* data = nullptr;  ///< element (0, 0)
  int64_t rows = 0;   ///< rows of the view
  int64_t cols = 0;   ///< columns of the view
  int64_t ld = 0;     ///< elements from one row's start to the next's (>= cols)

  /// Implicit conversion from a mutable view to a const one.
  template <class U, class = std::enable_if_t<std::is_same_v<const U, T> && !std::is_same_v<U, T>>>
  matrix_view(const matrix_view<U>& other)  // NOLINT(google-explicit-constructor)
      : data(other.data), rows(other.rows), cols(other.cols), ld(other.ld) {}
  matrix_view() = default;
  /// A view of r x c elements at d, rows ld elements apart.
  // (data, rows, cols, ld): the order of every BLAS and of this type's fields,
  // which callers know; a struct here would be the same four names again.
  matrix_view(T* d, int64_t r, int64_t c, int64_t l)  // NOLINT(bugprone-easily-swappable-parameters)
      : data(d), rows(r), cols(c), ld(l) {}
  /// A dense view (ld == cols).
  matrix_view(T* d, int64_t r, int64_t c)  // NOLINT(bugprone-easily-swappable-parameters)
      : data(d), rows(r), cols(c), ld(c) {}

  [[nodiscard]] bool empty() const noexcept { return rows == 0 || cols == 0; }          ///< no elements
  [[nodiscard]] T& operator()(int64_t i, int64_t j) const { return data[i * ld + j]; }  ///< element (i, j); unchecked
  /// The nr x nc sub-block starting at (r0, c0); no bounds checks.
  [[nodiscard]] matrix_view block(int64_t r0, int64_t c0, int64_t nr, int64_t nc) const {
    return {data == nullptr ? nullptr : data + r0 * ld + c0, nr, nc, ld};
  }
};

/// How one dimension of extent total() is split over the ranks: shard r has
/// size(r) elements starting at offset(r). Sizes may be uneven or zero.
class shard_layout {
 public:
  shard_layout() = default;
  /// Shard r has sizes[r] elements; the shards follow each other in rank order.
  explicit shard_layout(std::vector<int64_t> sizes) : sizes_(std::move(sizes)), offsets_(sizes_.size() + 1, 0) {
    std::partial_sum(sizes_.begin(), sizes_.end(), offsets_.begin() + 1);
  }
  /// The balanced block distribution: the first (total % parts) shards get one more.
  [[nodiscard]] static shard_layout balanced(int64_t total, int parts) {
    std::vector<int64_t> s(static_cast<size_t>(parts), total / parts);
    for (int64_t r = 0; r < total % parts; ++r) ++s[static_cast<size_t>(r)];
    return shard_layout(std::move(s));
  }

  [[nodiscard]] int parts() const noexcept { return static_cast<int>(sizes_.size()); }    ///< the number of shards
  [[nodiscard]] int64_t size(int r) const { return sizes_[static_cast<size_t>(r)]; }      ///< shard r's extent
  [[nodiscard]] int64_t offset(int r) const { return offsets_[static_cast<size_t>(r)]; }  ///< where shard r starts
  /// The extent of the whole dimension (the sum of the sizes).
  [[nodiscard]] int64_t total() const noexcept { return offsets_.empty() ? 0 : offsets_.back(); }
  /// The largest shard's extent.
  [[nodiscard]] int64_t max_size() const noexcept {
    int64_t m = 0;
    for (auto s : sizes_) m = s > m ? s : m;
    return m;
  }
  [[nodiscard]] const std::vector<int64_t>& sizes() const noexcept { return sizes_; }  ///< every shard's extent

 private:
  std::vector<int64_t> sizes_;
  std::vector<int64_t> offsets_;
};

}  // namespace overlap
