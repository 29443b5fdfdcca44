#pragma once
/// @file
/// The handle of a started op (start_all_gather_matmul,
/// start_matmul_reduce_scatter): the caller computes something else while
/// the op's transfers and partial products run, then waits.

#include <cstdio>
#include <exception>
#include <utility>

#include "overlap/engine/worker.hpp"

namespace overlap {

/// An op in flight on a context's worker thread. wait() blocks until the op
/// has finished, test() asks without blocking (as MPI_Wait and MPI_Test do),
/// and both rethrow its error (overlap::error after a fatal failure
/// under OVERLAP_ON_FATAL=throw); the destructor waits too, printing an error
/// nobody waited for. Move-only; a default-constructed handle holds nothing.
class pending {
 public:
  pending() = default;
  /// The op running on w (the start_* functions make these).
  explicit pending(engine::worker* w) noexcept : w_(w) {}
  pending(const pending&) = delete;
  pending& operator=(const pending&) = delete;
  /// Takes other's op; other holds nothing after.
  pending(pending&& other) noexcept : w_(std::exchange(other.w_, nullptr)) {}
  /// Waits for this handle's op (printing an error nobody waited for), then takes other's.
  pending& operator=(pending&& other) noexcept {
    if (this != &other) {
      finish_quietly();
      w_ = std::exchange(other.w_, nullptr);
    }
    return *this;
  }
  ~pending() { finish_quietly(); }

  /// Blocks until the op has finished (its output is then complete);
  /// rethrows what it threw. Local: only this rank waits.
  void wait() {
    if (engine::worker* w = std::exchange(w_, nullptr)) w->wait();
  }
  /// Whether the op has finished, without blocking: true completes the
  /// handle as wait() does (c is complete, an error is rethrown, valid()
  /// turns false); false leaves it in flight. An empty handle tests true, as
  /// MPI_Test of MPI_REQUEST_NULL does. Local. Poll it between pieces of the
  /// caller's own work; the op advances on the worker thread either way.
  [[nodiscard]] bool test() {
    if (w_ != nullptr && !w_->ended()) return false;
    wait();
    return true;
  }
  /// True until wait() or a true test() returned (or the handle was moved from).
  [[nodiscard]] bool valid() const noexcept { return w_ != nullptr; }

 private:
  void finish_quietly() noexcept {
    try {
      wait();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "overlap: a started op failed and nobody waited for it: %s\n", e.what());
    } catch (...) {
      std::fprintf(stderr, "overlap: a started op failed and nobody waited for it\n");
    }
  }

  engine::worker* w_ = nullptr;
};

}  // namespace overlap
