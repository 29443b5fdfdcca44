#pragma once
/// @file
/// Umbrella header of overlap: communication-hiding tensor-parallel matrix
/// products for MPI on CPU clusters. See docs/ and README.md.
///
/// Header-only (CMake target overlap::overlap) every header brings its own
/// implementation, so this includes the whole of it; with the compiled
/// flavour (overlap::compiled, which defines OVERLAP_COMPILED) it declares
/// only, and the library holds the implementation (flavour.hpp): a
/// translation unit that includes it parses none of oneDNN's, Eigen's or
/// nlohmann-json's headers. The layers, whose classes hold oneDNN and Eigen kernels, are
/// included on their own: <overlap/layers/transformer.hpp> and
/// <overlap/layers/moe.hpp>.

#include "overlap/attention/ring_attention.hpp"
#include "overlap/backend/gemm.hpp"
#include "overlap/config.hpp"
#include "overlap/core/bfloat16.hpp"
#include "overlap/core/dtype.hpp"
#include "overlap/core/epilogue.hpp"
#include "overlap/core/error.hpp"
#include "overlap/core/flavour.hpp"
#include "overlap/core/matrix.hpp"
#include "overlap/core/version.hpp"
#include "overlap/mpi/communicator.hpp"
#include "overlap/mpi/environment.hpp"
#include "overlap/ops/all_gather_matmul.hpp"
#include "overlap/ops/all_to_all_matmul.hpp"
#include "overlap/ops/expert_counts.hpp"
#include "overlap/ops/matmul_all_reduce.hpp"
#include "overlap/ops/matmul_all_to_all.hpp"
#include "overlap/ops/matmul_reduce_scatter.hpp"
#include "overlap/ops/options.hpp"
#include "overlap/ops/shared_gather.hpp"
#include "overlap/runtime/context.hpp"
#include "overlap/runtime/mesh.hpp"
#include "overlap/schedule/calibration.hpp"
#include "overlap/schedule/schedule.hpp"
