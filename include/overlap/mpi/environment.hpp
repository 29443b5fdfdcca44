#pragma once
/// @file
/// Explicit MPI initialisation for programs (apps, tests, examples). The
/// library never initialises MPI behind the caller's back.

#include <mpi.h>

#include "overlap/core/error.hpp"

namespace overlap::mpi {

/// RAII MPI_Init_thread / MPI_Finalize. Requests MPI_THREAD_MULTIPLE, which
/// the progress thread needs; provided() tells what the MPI library gave.
class environment {
 public:
  /// MPI_Init_thread with `required`; an MPI error throws overlap::error.
  environment(int& argc, char**& argv, int required = MPI_THREAD_MULTIPLE) {
    OVERLAP_MPI(MPI_Init_thread, &argc, &argv, required, &provided_);
  }
  environment(const environment&) = delete;
  environment& operator=(const environment&) = delete;
  ~environment() { MPI_Finalize(); }
  [[nodiscard]] int provided() const noexcept { return provided_; }  ///< the thread level MPI provides

 private:
  int provided_ = MPI_THREAD_SINGLE;
};

}  // namespace overlap::mpi
