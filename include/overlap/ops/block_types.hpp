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
/// created once per (rows, cols, ld) and owned by the plan.
class block_types {
 public:
  explicit block_types(dtype t = dtype::f32) : base_(mpi_type_of(t)) {}
  MPI_Datatype get(int64_t rows, int64_t cols, int64_t ld) {
    auto& t = types_[{rows, cols, ld}];
    if (t.get() == MPI_DATATYPE_NULL) t = mpi::block_type(rows, cols, ld, base_);
    return t.get();
  }

 private:
  MPI_Datatype base_;
  std::map<std::tuple<int64_t, int64_t, int64_t>, mpi::datatype> types_;
};

}  // namespace overlap::detail
