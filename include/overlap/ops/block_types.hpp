#pragma once
/// @file
/// The derived MPI datatypes of the blocks a plan transfers, created once
/// per shape and owned by the plan.

#include <cstdint>
#include <map>
#include <tuple>

#include "overlap/backend/dtype.hpp"
#include "overlap/mpi/datatype.hpp"

namespace overlap::detail {

/// Derived datatypes of the blocks a plan transfers (elements of one dtype),
/// created once per (rows, cols, ld) and owned by the plan; with a batch,
/// one type carries the block of every member (`count` blocks, `stride`
/// elements apart).
class block_types {
 public:
  explicit block_types(dtype t = dtype::f32) : base_(mpi_type_of(t)), elem_(static_cast<int64_t>(size_of(t))) {}
  MPI_Datatype get(int64_t rows, int64_t cols, int64_t ld) {
    auto& t = types_[{rows, cols, ld}];
    if (t.get() == MPI_DATATYPE_NULL) t = mpi::block_type(rows, cols, ld, base_);
    return t.get();
  }
  MPI_Datatype get(int64_t rows, int64_t cols, int64_t ld, int64_t count, int64_t stride) {
    if (count == 1) return get(rows, cols, ld);
    auto& t = batched_[{rows, cols, ld, count, stride}];
    if (t.get() == MPI_DATATYPE_NULL) t = mpi::batched_type(count, stride * elem_, get(rows, cols, ld));
    return t.get();
  }

 private:
  MPI_Datatype base_;
  int64_t elem_;
  std::map<std::tuple<int64_t, int64_t, int64_t>, mpi::datatype> types_;
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>, mpi::datatype> batched_;
};

}  // namespace overlap::detail
