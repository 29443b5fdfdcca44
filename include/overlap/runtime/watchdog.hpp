#pragma once
/// @file
/// Collectives bounded by the watchdog (config::timeout_s, OVERLAP_TIMEOUT_S):
/// with it off, the blocking call; with it on, the non-blocking form and a
/// wait that gives up after timeout_s. A wait for ranks that never come is
/// then an error on the ranks that came, not a hang.

#include <mpi.h>

#include <cstdio>
#include <string>

#include "overlap/core/error.hpp"
#include "overlap/mpi/communicator.hpp"
#include "overlap/mpi/wait.hpp"
#include "overlap/runtime/failure.hpp"

namespace overlap::detail {

/// Runs a collective of an op (Ctx: the context; a template, so that
/// agreement.hpp, which context.hpp includes, may use it): `blocking`
/// (returns an MPI code) when the watchdog is off, else `start` (posts the
/// non-blocking form into its MPI_Request*) and a bounded wait. The ranks
/// agreed to run it, so an MPI error or a timeout is fatal (ctx.fatal);
/// describe() names what the call is for, e.g. the op and phase.
/// Waits for a non-blocking collective of an op that `call` started into
/// `req`: MPI_Wait when the watchdog is off, else MPI_Test until it completes
/// or timeout_s passes. The ranks agreed to run it, so an MPI error or a
/// timeout is fatal (ctx.fatal); describe() names what the call is for.
template <class Ctx, class Describe>
void watched_wait(Ctx& ctx, const char* call, MPI_Request& req, Describe&& describe) {
  const int timeout_s = ctx.config().timeout_s;
  int rc = MPI_SUCCESS;
  if (timeout_s <= 0) {
    rc = MPI_Wait(&req, MPI_STATUS_IGNORE);
  } else {
    const bool done = mpi::poll_until(
        [&] {
          int flag = 0;
          rc = MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
          return rc != MPI_SUCCESS || flag != 0;
        },
        timeout_s);
    if (!done)
      ctx.fatal("watchdog: " + describe() + ": waited more than " + std::to_string(timeout_s) + " s in " + call +
                    " for the other " + std::to_string(ctx.size() - 1) + " ranks of the context",
                call, 0, error_source::watchdog);
  }
  if (rc != MPI_SUCCESS) ctx.fatal(describe() + ": " + mpi_error_text(rc), call, rc, error_source::mpi);
}

template <class Ctx, class Blocking, class Start, class Describe>
void watched_collective(Ctx& ctx, const char* call, Blocking&& blocking, Start&& start, Describe&& describe) {
  if (ctx.config().timeout_s <= 0) {
    const int rc = blocking();
    if (rc != MPI_SUCCESS) ctx.fatal(describe() + ": " + mpi_error_text(rc), call, rc, error_source::mpi);
    return;
  }
  MPI_Request req = MPI_REQUEST_NULL;
  const int rc = start(&req);
  if (rc != MPI_SUCCESS) ctx.fatal(describe() + ": " + mpi_error_text(rc), call, rc, error_source::mpi);
  watched_wait(ctx, call, req, describe);
}

/// Collective: a duplicate of comm (MPI_Comm_dup), bounded by the watchdog
/// when timeout_s > 0 (MPI_Comm_idup). No context exists yet, so a timeout
/// throws overlap::error on this rank (after printing it) instead of
/// ctx.fatal. `who` names the caller in the message.
[[nodiscard]] inline mpi::communicator watched_dup(MPI_Comm comm, int timeout_s, const std::string& who) {
  if (timeout_s <= 0) return mpi::communicator::borrow(comm).dup();
  MPI_Comm copy = MPI_COMM_NULL;
  MPI_Request req = MPI_REQUEST_NULL;
  OVERLAP_MPI(MPI_Comm_idup, comm, &copy, &req);
  const bool done = mpi::poll_until(
      [&] {
        int flag = 0;
        OVERLAP_MPI(MPI_Test, &req, &flag, MPI_STATUS_IGNORE);
        return flag != 0;
      },
      timeout_s);
  if (!done) {
    const std::string what = "watchdog: " + who + ": waited more than " + std::to_string(timeout_s) +
                             " s in MPI_Comm_idup for the other ranks of the communicator";
    std::fprintf(stderr, "overlap: fatal error (world rank %d): %s\n", world_rank(), what.c_str());
    throw error(error_source::watchdog, 0, "MPI_Comm_idup", what);
  }
  return mpi::communicator::adopt(copy);
}

}  // namespace overlap::detail
