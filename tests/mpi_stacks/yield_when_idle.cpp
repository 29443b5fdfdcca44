// Preloaded into MPICH ranks by the tests (tools/mpi/stack, LD_PRELOAD) when
// ranks outnumber cores. MPICH 4.0's ch4:ucx device spins in UCX's progress
// while it waits and has no setting that yields (MPIR_CVAR_POLLS_BEFORE_YIELD
// is ch3's): a waiting rank then holds its core for a whole scheduler slice
// (8 ms per MPI_Barrier at 3 ranks on 2 cores, against 0.002 ms at 2). This
// wraps ucp_worker_progress and yields the core after a poll that found
// nothing, as Open MPI's mpi_yield_when_idle does. The library never needs
// it: on a node with a core per rank, spinning costs no other rank anything.
#include <dlfcn.h>
#include <sched.h>

using ucp_worker_h = struct ucp_worker*;
using progress_fn = unsigned (*)(ucp_worker_h);

extern "C" unsigned ucp_worker_progress(ucp_worker_h worker) {
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-reinterpret-cast): dlsym returns void*
  static const auto real = reinterpret_cast<progress_fn>(dlsym(RTLD_NEXT, "ucp_worker_progress"));
  const unsigned events = real(worker);
  if (events == 0) sched_yield();
  return events;
}
