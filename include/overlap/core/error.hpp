#pragma once
/// @file
/// The one error path of the library: every MPI and backend status code is
/// turned into an overlap::error that names the call, the code and the rank.

#include <mpi.h>

#include <stdexcept>
#include <string>

namespace overlap {

/// Where a failing status code came from.
enum class error_source {
  mpi,       ///< an MPI call returned an error code
  backend,   ///< the GEMM library failed
  watchdog,  ///< a wait outlasted config::timeout_s (OVERLAP_TIMEOUT_S)
};

/// A failed MPI or backend call. Invalid arguments are reported as
/// std::invalid_argument instead, on every rank of the communicator.
class error : public std::runtime_error {
 public:
  /// `call` (e.g. "MPI_Isend") returned `code`; `detail` adds context.
  error(error_source source, int code, std::string call, const std::string& detail)
      : std::runtime_error(format(source, code, call) + (detail.empty() ? "" : ": " + detail)),
        source_(source),
        code_(code),
        call_(std::move(call)) {}

  /// Which library failed: MPI or the GEMM backend.
  [[nodiscard]] error_source source() const noexcept { return source_; }
  /// The MPI error code or the backend's status value.
  [[nodiscard]] int code() const noexcept { return code_; }
  /// The name of the call that failed, e.g. "MPI_Isend".
  [[nodiscard]] const std::string& call() const noexcept { return call_; }

 private:
  /// The message up to its detail: the call, the rank, the source and code.
  static std::string format(error_source source, int code, const std::string& call) {
    std::string msg = "overlap: ";
    msg += call;
    msg += " failed";
    int initialized = 0;
    int finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) {
      int rank = -1;
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      msg += " on world rank " + std::to_string(rank);
    }
    if (source == error_source::watchdog)
      msg += " (timeout)";
    else
      msg += (source == error_source::mpi ? " (MPI error " : " (backend status ") + std::to_string(code) + ")";
    return msg;
  }

  error_source source_;
  int code_;
  std::string call_;
};

namespace detail {

[[noreturn]] inline void throw_mpi_error(int code, const char* call) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
  throw error(error_source::mpi, code, call, std::string(text, static_cast<size_t>(len)));
}

/// Checks an MPI return code; the library's communicators use MPI_ERRORS_RETURN
/// so that failures arrive here instead of aborting the job.
inline void check_mpi(int code, const char* call) {
  if (code != MPI_SUCCESS) throw_mpi_error(code, call);
}

}  // namespace detail
}  // namespace overlap

/// Calls an MPI function and throws overlap::error naming it when it fails.
#define OVERLAP_MPI(call_name, ...) ::overlap::detail::check_mpi(call_name(__VA_ARGS__), #call_name)
