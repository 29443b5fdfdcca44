#pragma once
/// @file
/// MPI datatypes: the base type of an element type, and owned derived types
/// that describe a (possibly strided) row-major matrix block.

#include <mpi.h>

#include <atomic>
#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "overlap/core/error.hpp"

namespace overlap::mpi {

/// `p`, or a valid address when p is null: for the buffer of a zero count.
/// The standard allows any pointer there, but SimGrid SMPI rejects a null
/// one (MPI_ERR_BUFFER), as a rank with an empty shard passes.
[[nodiscard]] inline void* any_buffer(void* p) noexcept {
  static char none = 0;
  return p != nullptr ? p : &none;
}

/// What one message carries: `count` elements of `type`. A block the
/// library transfers is, where it is contiguous, `count` elements of the
/// base type, and else one element of a derived type: MPI moves the first
/// as plain bytes, while some implementations copy every derived one
/// through a buffer of their own (SimGrid SMPI serialises it, three copies
/// per message).
struct layout {
  MPI_Datatype type = MPI_DATATYPE_NULL;  ///< the base type or a derived one
  int count = 0;                          ///< how many of `type`
};

/// An owned, committed derived datatype (freed by the destructor); move-only.
class datatype {
 public:
  datatype() = default;
  /// Takes ownership of a committed type (MPI_DATATYPE_NULL: none).
  explicit datatype(MPI_Datatype committed) : type_(committed) {
    if (type_ != MPI_DATATYPE_NULL) ++live_count();
  }
  datatype(const datatype&) = delete;
  datatype& operator=(const datatype&) = delete;
  /// Takes o's type; o holds none after.
  datatype(datatype&& o) noexcept : type_(std::exchange(o.type_, MPI_DATATYPE_NULL)) {}
  /// Frees this one's type, then takes o's.
  datatype& operator=(datatype&& o) noexcept {
    if (this != &o) {
      release();
      type_ = std::exchange(o.type_, MPI_DATATYPE_NULL);
    }
    return *this;
  }
  ~datatype() { release(); }
  [[nodiscard]] MPI_Datatype get() const noexcept { return type_; }  ///< the handle
  /// Datatypes the library holds now, in this process (for leak tests).
  [[nodiscard]] static long live() noexcept { return live_count().load(); }

 private:
  static std::atomic<long>& live_count() noexcept {
    static std::atomic<long> n{0};
    return n;
  }
  void release() noexcept {
    if (type_ == MPI_DATATYPE_NULL) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Type_free(&type_);
    type_ = MPI_DATATYPE_NULL;
    --live_count();
  }
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
};

namespace detail {
inline int to_count(int64_t n, const char* what) {
  if (n < 0 || n > INT_MAX)
    throw std::invalid_argument(std::string("overlap: ") + what + " (" + std::to_string(n) +
                                ") exceeds the MPI count limit INT_MAX");
  return static_cast<int>(n);
}
}  // namespace detail

/// `n` consecutive values of `base` as one committed type.
[[nodiscard]] inline datatype contiguous_type(int64_t n, MPI_Datatype base) {
  MPI_Datatype t = MPI_DATATYPE_NULL;
  OVERLAP_MPI(MPI_Type_contiguous, detail::to_count(n, "contiguous type length"), base, &t);
  datatype owned(t);
  OVERLAP_MPI(MPI_Type_commit, &t);
  return owned;
}

/// A rows x cols block of `base` elements with leading dimension ld as one
/// element of a derived type (MPI_Type_vector); send or receive it with count 1.
[[nodiscard]] inline datatype block_type(int64_t rows, int64_t cols, int64_t ld, MPI_Datatype base) {
  MPI_Datatype t = MPI_DATATYPE_NULL;
  if (ld == cols) {
    OVERLAP_MPI(MPI_Type_contiguous, detail::to_count(rows * cols, "block elements"), base, &t);
  } else {
    OVERLAP_MPI(MPI_Type_vector, detail::to_count(rows, "block rows"), detail::to_count(cols, "block cols"),
                detail::to_count(ld, "block ld"), base, &t);
  }
  datatype owned(t);
  OVERLAP_MPI(MPI_Type_commit, &t);
  return owned;
}

/// `count` copies of the committed type `block`, `stride_bytes` apart (the
/// members of a strided batch), as one committed type; `block` itself when
/// count is 1. The caller keeps `block` alive as long as the result.
[[nodiscard]] inline datatype batched_type(int64_t count, int64_t stride_bytes, MPI_Datatype block) {
  MPI_Datatype t = MPI_DATATYPE_NULL;
  OVERLAP_MPI(MPI_Type_create_hvector, detail::to_count(count, "batch count"), 1, static_cast<MPI_Aint>(stride_bytes),
              block, &t);
  datatype owned(t);
  OVERLAP_MPI(MPI_Type_commit, &t);
  return owned;
}

}  // namespace overlap::mpi
