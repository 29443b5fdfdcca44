// Preloaded into MPICH ranks by the tests (tools/mpi/stack, LD_PRELOAD) when
// ranks outnumber cores. MPICH 4.0's ch4:ucx device spins in UCX's progress
// while it waits and has no setting that yields (MPIR_CVAR_POLLS_BEFORE_YIELD
// is ch3's): a waiting rank then holds its core for a whole scheduler slice
// (8 ms per MPI_Barrier at 3 ranks on 2 cores, against 0.002 ms at 2). This
// wraps ucp_worker_progress and yields the core when the rank spins in a wait:
// after a few polls in a row, each within microseconds of the last, that found
// nothing. A lone test between two pieces of work (the poll progress policy
// tests between GEMM bands) never yields, so its computation keeps the core,
// unlike Open MPI's mpi_yield_when_idle, which yields after any empty poll.
// The library never needs it: on a node with a core per rank, spinning costs
// no other rank anything.
#include <dlfcn.h>
#include <sched.h>
#include <time.h>

using ucp_worker_h = struct ucp_worker*;
using progress_fn = unsigned (*)(ucp_worker_h);

namespace {
long long now_ns() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<long long>(t.tv_sec) * 1000000000LL + t.tv_nsec;
}
}  // namespace

extern "C" unsigned ucp_worker_progress(ucp_worker_h worker) {
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-reinterpret-cast): dlsym returns void*
  static const auto real = reinterpret_cast<progress_fn>(dlsym(RTLD_NEXT, "ucp_worker_progress"));
  constexpr long long tight_ns = 20000;  // polls closer than this belong to one wait loop
  constexpr int spins = 4;               // empty polls of a loop before it yields
  thread_local long long last = 0;
  thread_local int empty = 0;
  const unsigned events = real(worker);
  const long long t = now_ns();
  empty = events == 0 && t - last < tight_ns ? empty + 1 : 0;
  last = t;
  if (empty >= spins) sched_yield();
  return events;
}
