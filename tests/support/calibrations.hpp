#pragma once
// Calibrations the tests give a context, so that strategy::automatic asks
// the cost model on one machine as it does across nodes.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "overlap/config.hpp"
#include "overlap/schedule/calibration.hpp"
#include "reference.hpp"

namespace testing_support {

/// A calibration of a slow network (1 Gbit/s, 50 us) and a flat 50 GFLOP/s.
inline overlap::calibration slow_network() {
  overlap::calibration c;
  const overlap::link_rates l{50e-6, 125e6, 125e6, 1.2, {}};
  c.links[overlap::link_class::network] = l;
  c.links[overlap::link_class::shared] = l;
  for (auto t : {overlap::dtype::f32, overlap::dtype::f64, overlap::dtype::bf16})
    c.gemm[t] = overlap::gemm_rates{{128, 2048}, std::vector<double>(8, 50e9)};
  return c;
}

/// Rank 0 writes `text` to a file every rank's config then names. The name
/// holds rank 0's process id: ctest runs suites side by side in one
/// folder, and two suites at the same rank count writing one name read each
/// other's half-written file.
inline std::string write_file(const std::string& text, const std::string& name = "calibration") {
  int pid = world_rank() == 0 ? static_cast<int>(getpid()) : 0;
  MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
  const std::string path =
      "overlap-test-" + name + "-" + std::to_string(world_size()) + "-" + std::to_string(pid) + ".json";
  // Removed when the suite ends (a name per process would otherwise pile up).
  static struct removed_at_exit {
    std::vector<std::string> paths;
    ~removed_at_exit() {
      for (const std::string& p : paths) std::remove(p.c_str());
    }
  } files;
  if (world_rank() == 0) {
    std::ofstream(path) << text;
    if (std::find(files.paths.begin(), files.paths.end(), path) == files.paths.end()) files.paths.push_back(path);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return path;
}

inline overlap::config with_calibration(const std::string& path) {
  overlap::config cfg;
  cfg.calibration = path;
  return cfg;
}

}  // namespace testing_support
