/* tools/smpi/untimed_host.c: preloaded into a simulation by tools/smpi/run
 * when SMPI_HOST_TIMING=off, beside --cfg=smpi/simulate-computation:no.
 *
 * SMPI times the host code between every two MPI calls of a rank with the
 * thread's CPU clock (clock_gettime(CLOCK_THREAD_CPUTIME_ID), twice per
 * call), even where smpi/simulate-computation:no then throws the reading
 * away. No vDSO serves that clock: each read is a system call, and in this
 * project's VMs a slow one. With the computation not simulated the
 * readings are unused, so here they cost nothing: the clock reads zero. A
 * 64-rank ring all-reduce (docs/smpi.md) took 15.8 s with
 * smpi/simulate-computation:no alone and 5.0 s with this beside it.
 *
 * Every other clock goes to the C library. Nothing in the simulated program
 * may rely on its own thread's CPU time while this is loaded; the overlap
 * library reads only the simulated clock and steady_clock. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <time.h>

typedef int (*clock_gettime_fn)(clockid_t, struct timespec*);

int clock_gettime(clockid_t id, struct timespec* tp) {
  static clock_gettime_fn next = 0;
  if (id == CLOCK_THREAD_CPUTIME_ID && tp != 0) {
    tp->tv_sec = 0;
    tp->tv_nsec = 0;
    return 0;
  }
  if (next == 0) next = (clock_gettime_fn)dlsym(RTLD_NEXT, "clock_gettime");
  return next(id, tp);
}
