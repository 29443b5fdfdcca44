#pragma once
/// @file
/// The derived MPI datatypes of the blocks a plan transfers, created once
/// per shape and owned by the plan.

#include <cstdint>
#include <map>
#include <tuple>

#include "overlap/core/dtype.hpp"
#include "overlap/mpi/datatype.hpp"

namespace overlap::detail {

/// The messages of the blocks a plan transfers (elements of one dtype): a
/// contiguous block as a count of the base type, any other as one element of
/// a derived datatype, created once per (rows, cols, ld) and owned by the
/// plan. With a batch, one message carries the block of every member
/// (`count` blocks, `stride` elements apart).
class block_types {
 public:
  explicit block_types(dtype t = dtype::f32) : base_(mpi_type_of(t)), elem_(static_cast<int64_t>(size_of(t))) {}
  mpi::layout get(int64_t rows, int64_t cols, int64_t ld) {
    if (contiguous(rows, cols, ld)) return {base_, mpi::detail::to_count(rows * cols, "block elements")};
    return {derived(rows, cols, ld), 1};
  }
  mpi::layout get(int64_t rows, int64_t cols, int64_t ld, int64_t count, int64_t stride) {
    if (count == 1) return get(rows, cols, ld);
    if (contiguous(rows, cols, ld) && stride == rows * cols)  // the members' blocks follow each other
      return {base_, mpi::detail::to_count(count * rows * cols, "batch elements")};
    auto& t = batched_[{rows, cols, ld, count, stride}];
    if (t.get() == MPI_DATATYPE_NULL) t = mpi::batched_type(count, stride * elem_, derived(rows, cols, ld));
    return {t.get(), 1};
  }

 private:
  static bool contiguous(int64_t rows, int64_t cols, int64_t ld) { return ld == cols || rows <= 1; }
  MPI_Datatype derived(int64_t rows, int64_t cols, int64_t ld) {
    auto& t = types_[{rows, cols, ld}];
    if (t.get() == MPI_DATATYPE_NULL) t = mpi::block_type(rows, cols, ld, base_);
    return t.get();
  }

  MPI_Datatype base_;
  int64_t elem_;
  std::map<std::tuple<int64_t, int64_t, int64_t>, mpi::datatype> types_;
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>, mpi::datatype> batched_;
};

}  // namespace overlap::detail
