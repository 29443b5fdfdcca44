#pragma once
/// @file
/// SimGrid's SMPI: the same program built with smpicxx runs on a simulated
/// platform. Ranks are threads of one simulation, run one at a time; a
/// rank's computation is timed on the real CPU and put into simulated time,
/// and transfers progress in simulated time on their own (as with an RDMA
/// NIC). What the library does differently there is decided from
/// mpi::simulated, and nowhere else from the MPI implementation.

#include <mpi.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#if defined(SMPI_H)
#include <simgrid/engine.h>
#include <simgrid/host.h>
#include <smpi/smpi.h>
#include <cstdint>
#include <xbt/config.hpp>
#include <xbt/parse_units.hpp>
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

/// The clock of the library's own bookkeeping, in seconds: when a paced
/// send left, how long a step computed, how long a wait has lasted. On a
/// real MPI, MPI_Wtime. Under SMPI, the simulated clock read as it stands
/// (simgrid_get_clock), because SMPI's MPI_Wtime ends and restarts the
/// rank's timed burst (two thread-CPU clock reads, system calls in a VM)
/// and sleeps 10 ns of simulated time (a simcall): in a 64-rank ring
/// all-reduce these reads were half of all the MPI calls, and of the
/// simulation's cost. The clock read this way does not yet hold the host
/// code run since the rank's last MPI call (SMPI charges it at the next
/// one), a few microseconds of bookkeeping. Not for a loop that waits for
/// the clock to move without an MPI call in it.
[[nodiscard]] inline double wtime() noexcept {
#if defined(SMPI_H)
  return simgrid_get_clock();
#else
  return MPI_Wtime();
#endif
}

/// smpi/host-speed in flop/s: the rate at which SMPI converts this
/// machine's measured computation into flops (0 on a real MPI).
inline double host_speed() {
#if defined(SMPI_H)
  return xbt_parse_get_speed("smpi/host-speed", 0, simgrid::config::get_value<std::string>("smpi/host-speed"),
                             "configuration option");
#else
  return 0;
#endif
}

/// The flop rate of this rank's simulated host (0 on a real MPI).
inline double platform_speed() {
#if defined(SMPI_H)
  return sg_host_get_speed(sg_host_self());
#else
  return 0;
#endif
}

/// Why a simulation with these speeds (flop/s) would charge this machine's
/// computation as next to nothing, or empty when it would not. A second of
/// it is charged host / platform simulated seconds: below a thousandth, a
/// 50 ms GEMM becomes microseconds and every schedule times as its
/// transfers alone. SimGrid's default smpi/host-speed (20 kflop/s) against
/// a platform's Gflop/s is such a case; a simulated node of 32 of this
/// machine's cores (docs/scaling.md) is not.
inline std::string compute_charge_problem(double host, double platform) {
  if (host <= 0 || platform <= 0 || host >= 1e-3 * platform) return {};
  char text[640];
  std::snprintf(text, sizeof text,
                "overlap: SMPI's smpi/host-speed is %.3g flop/s against this platform's hosts at %.3g flop/s: a "
                "second of computation on this machine is charged %.2g simulated seconds, so GEMMs and local work "
                "cost next to nothing and every schedule times as its transfers alone. Set --cfg=smpi/host-speed to "
                "this machine's rate (tools/smpi/run sets 100Gf, or $SMPI_HOST_SPEED)",
                host, platform, host / platform);
  return text;
}

/// Whether SMPI charges the host code between a rank's MPI calls to its
/// simulated clock (smpi/simulate-computation, on by default;
/// tools/smpi/run's SMPI_HOST_TIMING=off turns it off). True on a real MPI.
inline bool host_code_timed() {
#if defined(SMPI_H)
  return simgrid::config::get_value<bool>("smpi/simulate-computation");
#else
  return true;
#endif
}

/// What a simulation that does not time its host code (host_code_timed)
/// charges nothing, or empty where it times it. `gemms_charged`: the
/// library charges its GEMMs itself (OVERLAP_SIM_COMPUTE other than
/// measured), so only other host code goes uncharged.
inline std::string host_timing_problem(bool timed, bool gemms_charged) {
  if (timed) return {};
  if (!gemms_charged)
    return "overlap: SMPI's smpi/simulate-computation is off and OVERLAP_SIM_COMPUTE=measured: no computation is "
           "charged, so GEMMs and local work cost nothing and every schedule times as its transfers alone. Use "
           "OVERLAP_SIM_COMPUTE=steady, skipped or calibrated, or time the host code (SMPI_HOST_TIMING=on)";
  return "overlap: SMPI's smpi/simulate-computation is off (tools/smpi/run's SMPI_HOST_TIMING=off): only what the "
         "library charges counts (GEMMs per OVERLAP_SIM_COMPUTE; in timing-only runs, the copies and sums it skips); "
         "other host code, such as the layers' element-wise passes, costs nothing";
}

/// Inside an untimed_scope: charges `seconds` of this machine's computation
/// to this rank's simulated clock (scaled by the platform's host speed
/// against smpi/host-speed). Charged as flops, not through smpi_execute,
/// whose smpi/cpu-threshold (1 us by default) would drop a small GEMM's
/// time altogether. Does nothing on a real MPI.
inline void charge_compute([[maybe_unused]] double seconds) {
#if defined(SMPI_H)
  static const double reference_flops = host_speed();  // a string with units ("100Gf"): parsed once per rank
  if (seconds > 0) smpi_execute_flops(seconds * reference_flops);
#endif
}

/// Inside an untimed_scope: advances this rank's simulated clock by
/// `seconds` of the simulated node's own computation (a figure measured in
/// simulated time, as the calibration's GEMM rates are), whatever the
/// node's speed. Does nothing on a real MPI.
inline void charge_simulated([[maybe_unused]] double seconds) {
#if defined(SMPI_H)
  if (seconds > 0) smpi_execute_flops(seconds * sg_host_get_speed(sg_host_self()));
#endif
}

/// One object of type T for every simulated rank of this simulation, made
/// on first use and never freed; one per process and name on a real MPI. SMPI gives
/// each rank its own copy of the program's globals, statics included, so
/// what the ranks share hangs off the process environment, which every
/// rank's copy shares with the C library (a variable named after `name`
/// holding the object's address). Not a property of the platform: reading
/// or setting one is a simcall, which lets the other ranks run in between,
/// and ranks that met the first use in the same scheduling round each made
/// an object of their own. Safe without locks: SMPI runs the ranks one at
/// a time, and nothing here yields.
template <class T>
T& process_wide(const char* name) {
#if defined(SMPI_H)
  std::string key = "OVERLAP_SIMULATION_SHARED_";
  for (const char* c = name; *c != '\0'; ++c) key += std::isalnum(static_cast<unsigned char>(*c)) ? *c : '_';
  if (const char* at = std::getenv(key.c_str())) {
    void* p = nullptr;
    std::sscanf(at, "%p", &p);  // written by the snprintf below
    return *static_cast<T*>(p);
  }
  T* made = new T();  // lives as long as the simulation
  char at[32];
  std::snprintf(at, sizeof at, "%p", static_cast<void*>(made));
  setenv(key.c_str(), at, 1);
  return *made;
#else
  static std::map<std::string, T> objects;  // by name (map nodes stay put)
  return objects[name];
#endif
}

/// Under SMPI, prints compute_charge_problem for this simulation's speeds
/// and host_timing_problem to stderr, once per simulation, on world rank 0
/// (every rank's settings are the same). `gemms_charged`: as for
/// host_timing_problem. Does nothing on a real MPI.
inline void say_compute_charge_problem(bool gemms_charged) {
  if (!simulated) return;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) return;
  bool& said = process_wide<bool>("overlap/compute-charge-said");
  if (said) return;
  said = true;
  for (const std::string& problem :
       {compute_charge_problem(host_speed(), platform_speed()), host_timing_problem(host_code_timed(), gemms_charged)})
    if (!problem.empty()) std::fprintf(stderr, "%s\n", problem.c_str());
}

/// Whether this rank's new workspaces are shared by every simulated rank
/// (SMPI_SHARED_MALLOC): their contents are then garbage, and neither their
/// memory nor their transfers' copies grow with the ranks. Set for timing-
/// only runs (sim_compute::skipped) and, for their payloads, by the
/// calibration. Per rank: SMPI loads one copy of the program per rank.
/// Always false on a real MPI.
inline bool& shared_workspaces() noexcept {
  static bool shared = false;
  return shared;
}

/// Sets shared_workspaces() for a scope (the calibration's payload buffers,
/// whose contents do not matter), then restores it.
class shared_workspaces_scope {
 public:
  shared_workspaces_scope() : before_(shared_workspaces()) { shared_workspaces() = simulated; }
  shared_workspaces_scope(const shared_workspaces_scope&) = delete;
  shared_workspaces_scope& operator=(const shared_workspaces_scope&) = delete;
  ~shared_workspaces_scope() { shared_workspaces() = before_; }

 private:
  bool before_;
};

namespace detail {
/// The shared blocks of a simulation (SMPI_SHARED_MALLOC'd, never freed
/// before it ends), each lent to any number of ranks at once.
struct shared_block {
  void* at = nullptr;
  size_t bytes = 0;
};
/// The blocks this rank holds now (SMPI gives every rank its own statics).
inline std::vector<void*>& shared_blocks_held() {
  static std::vector<void*> held;
  return held;
}
}  // namespace detail

/// Under SMPI: a block of at least `bytes` shared by the simulated ranks,
/// the smallest of the simulation's blocks that this rank does not hold
/// already (a new one when none fits), so that a rank's live workspaces
/// never overlap while every rank's i-th workspace is the same memory.
/// SMPI maps and populates each shared allocation once per call, page
/// table included: a 1024-rank all-gather of 2 GiB per rank spent most of
/// its real time there, with allocations of their own per rank.
inline void* lend_shared_block([[maybe_unused]] size_t bytes) {
#if defined(SMPI_H)
  auto& blocks = process_wide<std::vector<detail::shared_block>>("overlap/shared-blocks");
  std::vector<void*>& held = detail::shared_blocks_held();
  detail::shared_block* best = nullptr;
  for (detail::shared_block& b : blocks)
    if (b.bytes >= bytes && (best == nullptr || b.bytes < best->bytes) &&
        std::find(held.begin(), held.end(), b.at) == held.end())
      best = &b;
  if (best == nullptr) {
    void* p = smpi_shared_malloc(bytes, __FILE__, __LINE__);  // page-aligned mappings
    if (p == nullptr) return nullptr;
    blocks.push_back({p, bytes});
    best = &blocks.back();
  }
  held.push_back(best->at);
  return best->at;
#else
  return nullptr;
#endif
}
/// Gives back a block of lend_shared_block's; it stays mapped for the
/// other ranks and the next lend.
inline void return_shared_block(void* p) noexcept {
  std::vector<void*>& held = detail::shared_blocks_held();
  if (auto it = std::find(held.begin(), held.end(), p); it != held.end()) held.erase(it);
}

/// `bytes` (a multiple of `alignment`, > 0) aligned to `alignment` (<= a page),
/// shared by the simulated ranks when shared_workspaces(); nullptr on failure.
/// `shared` says how to free it (free_workspace).
inline void* allocate_workspace(size_t alignment, size_t bytes, bool& shared) {
  shared = simulated && shared_workspaces();
  if (shared) return lend_shared_block(bytes);
  return std::aligned_alloc(alignment, bytes);
}
/// Frees what allocate_workspace returned (with the `shared` it reported).
inline void free_workspace(void* p, bool shared) noexcept {
  if (shared) return return_shared_block(p);
  std::free(p);
}

}  // namespace overlap::mpi
