#pragma once
/// @file
/// SimGrid's SMPI: the same program built with smpicxx runs on a simulated
/// platform. Ranks are threads of one simulation, run one at a time; a
/// rank's computation is timed on the real CPU and put into simulated time,
/// and transfers progress in simulated time on their own (as with an RDMA
/// NIC). What the library does differently there is decided from
/// mpi::simulated, and nowhere else from the MPI implementation.

#include <mpi.h>

#if defined(SMPI_H)
#include <smpi/smpi.h>
#endif

namespace overlap::mpi {

/// True when the program is built against SMPI's mpi.h (smpicxx).
#if defined(SMPI_H)
inline constexpr bool simulated = true;
#else
inline constexpr bool simulated = false;
#endif

/// Ends SMPI's timing of the code since the last MPI call (that time is
/// charged to this rank) and stops it until the scope ends, so a burst the
/// library times itself is not charged twice. Does nothing on a real MPI.
class untimed_scope {
 public:
  untimed_scope() {
#if defined(SMPI_H)
    smpi_bench_end();
#endif
  }
  untimed_scope(const untimed_scope&) = delete;
  untimed_scope& operator=(const untimed_scope&) = delete;
  ~untimed_scope() {
#if defined(SMPI_H)
    smpi_bench_begin();
#endif
  }
};

/// Inside an untimed_scope: charges `seconds` of this machine's computation
/// to this rank's simulated clock (scaled by the platform's host speed
/// against smpi/host-speed). Does nothing on a real MPI.
inline void charge_compute([[maybe_unused]] double seconds) {
#if defined(SMPI_H)
  if (seconds > 0) smpi_execute(seconds);
#endif
}

}  // namespace overlap::mpi
