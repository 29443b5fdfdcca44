#pragma once
/// @file
/// RAII wrapper of an MPI communicator with explicit ownership.

#include <mpi.h>

#include <utility>

#include "overlap/core/error.hpp"

namespace overlap::mpi {

/// A communicator that is either borrowed (never freed) or owned (freed by
/// the destructor). Move-only: duplicating is the explicit, collective dup().
class communicator {
 public:
  communicator() = default;

  /// Wraps a communicator the caller keeps ownership of.
  [[nodiscard]] static communicator borrow(MPI_Comm comm) { return communicator(comm, false); }

  /// Takes ownership of a communicator the caller created (e.g. with
  /// MPI_Comm_idup) and sets MPI_ERRORS_RETURN on it, as dup() does.
  [[nodiscard]] static communicator adopt(MPI_Comm comm) {
    communicator owned(comm, true);
    OVERLAP_MPI(MPI_Comm_set_errhandler, comm, MPI_ERRORS_RETURN);
    return owned;
  }

  /// Collective over this communicator: MPI_Comm_dup, with MPI_ERRORS_RETURN set
  /// on the duplicate so every failure reaches the library's error path.
  [[nodiscard]] communicator dup() const {
    MPI_Comm copy = MPI_COMM_NULL;
    OVERLAP_MPI(MPI_Comm_dup, comm_, &copy);
    communicator owned(copy, true);
    OVERLAP_MPI(MPI_Comm_set_errhandler, copy, MPI_ERRORS_RETURN);
    return owned;
  }

  communicator(const communicator&) = delete;
  communicator& operator=(const communicator&) = delete;
  /// Takes other's communicator; other holds none after.
  communicator(communicator&& other) noexcept
      : comm_(std::exchange(other.comm_, MPI_COMM_NULL)), owned_(std::exchange(other.owned_, false)) {}
  /// Frees this one's (when owned), then takes other's.
  communicator& operator=(communicator&& other) noexcept {
    if (this != &other) {
      release();
      comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
      owned_ = std::exchange(other.owned_, false);
    }
    return *this;
  }
  ~communicator() { release(); }

  [[nodiscard]] MPI_Comm get() const noexcept { return comm_; }  ///< the handle (MPI_COMM_NULL when moved from)
  [[nodiscard]] bool owned() const noexcept { return owned_; }   ///< freed by the destructor
  /// This process's rank in it.
  [[nodiscard]] int rank() const {
    int r = 0;
    OVERLAP_MPI(MPI_Comm_rank, comm_, &r);
    return r;
  }
  /// Its number of ranks.
  [[nodiscard]] int size() const {
    int s = 0;
    OVERLAP_MPI(MPI_Comm_size, comm_, &s);
    return s;
  }

 private:
  communicator(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {}
  void release() noexcept {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owned_ && comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
    comm_ = MPI_COMM_NULL;
    owned_ = false;
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  bool owned_ = false;
};

}  // namespace overlap::mpi
