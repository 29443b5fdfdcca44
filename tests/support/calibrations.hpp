#pragma once
// Calibrations the tests give a context, so that strategy::automatic asks
// the cost model on one machine as it does across nodes.
#include <mpi.h>

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

/// Rank 0 writes `text` to a file every rank's config then names.
inline std::string write_file(const std::string& text, const std::string& name = "calibration") {
  const std::string path = "overlap-test-" + name + "-" + std::to_string(world_size()) + ".json";
  if (world_rank() == 0) std::ofstream(path) << text;
  MPI_Barrier(MPI_COMM_WORLD);
  return path;
}

inline overlap::config with_calibration(const std::string& path) {
  overlap::config cfg;
  cfg.calibration = path;
  return cfg;
}

}  // namespace testing_support
