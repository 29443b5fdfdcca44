#pragma once
/// @file
/// A failure on one rank as a value, so that an agreement can carry it to
/// every rank and every rank throws the same error; and the checks of MPI's
/// state that come before any communication.

#include <mpi.h>

#include <exception>
#include <new>
#include <stdexcept>
#include <string>

#include "overlap/core/error.hpp"

namespace overlap::detail {

/// This process's rank in MPI_COMM_WORLD, or -1 outside MPI_Init..MPI_Finalize.
[[nodiscard]] inline int world_rank() noexcept {
  int initialized = 0, finalized = 0, rank = -1;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

/// "MPI_ERR_... : text" of an MPI error code.
[[nodiscard]] inline std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
  return "MPI error " + std::to_string(code) + (len > 0 ? ": " + std::string(text, static_cast<size_t>(len)) : "");
}

/// std::logic_error unless MPI is initialised and not yet finalised.
inline void require_mpi_running(const char* who) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized)
    throw std::logic_error(std::string(who) +
                           ": MPI has already been finalised; overlap needs MPI between MPI_Init_thread and "
                           "MPI_Finalize (destroy contexts before MPI_Finalize)");
  if (!initialized)
    throw std::logic_error(std::string(who) +
                           ": MPI is not initialised; call MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) "
                           "first (or use overlap::mpi::environment)");
}

/// What went wrong on one rank: the kind of exception, and for overlap::error
/// its source, code and call.
class failure {
 public:
  enum class kind { none, invalid_argument, logic_error, library, out_of_memory, other };

  failure() = default;
  failure(kind k, std::string what) : kind_(k), what_(std::move(what)) {}

  /// Classifies an exception caught on this rank.
  [[nodiscard]] static failure capture(const std::exception_ptr& e) {
    try {
      std::rethrow_exception(e);
    } catch (const error& x) {
      failure f(kind::library, x.what());
      f.source_ = static_cast<int>(x.source());
      f.code_ = x.code();
      f.call_ = x.call();
      return f;
    } catch (const std::invalid_argument& x) {
      return {kind::invalid_argument, x.what()};
    } catch (const std::logic_error& x) {
      return {kind::logic_error, x.what()};
    } catch (const std::bad_alloc& x) {
      return {kind::out_of_memory, std::string("out of memory (") + x.what() + ")"};
    } catch (const std::exception& x) {
      return {kind::other, x.what()};
    } catch (...) {
      return {kind::other, "unknown exception"};
    }
  }

  [[nodiscard]] bool failed() const noexcept { return kind_ != kind::none; }

  /// One string that unpack() turns back into this failure.
  [[nodiscard]] std::string pack() const {
    return std::to_string(static_cast<int>(kind_)) + "\n" + std::to_string(source_) + "\n" + std::to_string(code_) +
           "\n" + call_ + "\n" + what_;
  }
  [[nodiscard]] static failure unpack(const std::string& s) {
    failure f;
    size_t pos = 0;
    auto field = [&] {
      const size_t end = s.find('\n', pos);
      std::string v = s.substr(pos, end - pos);
      pos = end == std::string::npos ? s.size() : end + 1;
      return v;
    };
    f.kind_ = static_cast<kind>(std::stoi(field()));
    f.source_ = std::stoi(field());
    f.code_ = std::stoi(field());
    f.call_ = field();
    f.what_ = s.substr(pos);
    return f;
  }

  /// Throws the failure as the exception type it was caught as (overlap::error
  /// keeps its source, code and call); the message starts with `where`.
  [[noreturn]] void raise(const std::string& where) const {
    const std::string msg = where + ": " + what_;
    switch (kind_) {
      case kind::invalid_argument: throw std::invalid_argument(msg);
      case kind::logic_error: throw std::logic_error(msg);
      case kind::library: throw error(static_cast<error_source>(source_), code_, call_, msg);
      case kind::out_of_memory:
      case kind::other:
      case kind::none: break;
    }
    throw std::runtime_error(msg);
  }

 private:
  kind kind_ = kind::none;
  int source_ = 0;
  int code_ = 0;
  std::string call_;
  std::string what_;
};

}  // namespace overlap::detail
