#pragma once
/// @file
/// Umbrella header of overlap: communication-hiding tensor-parallel matrix
/// products for MPI on CPU clusters. See docs/ and README.md.

#include "overlap/backend/dtype.hpp"
#include "overlap/backend/eigen.hpp"
#include "overlap/backend/gemm.hpp"
#include "overlap/backend/onednn.hpp"
#include "overlap/bfloat16.hpp"
#include "overlap/config.hpp"
#include "overlap/context.hpp"
#include "overlap/error.hpp"
#include "overlap/matrix.hpp"
#include "overlap/mpi/communicator.hpp"
#include "overlap/mpi/environment.hpp"
#include "overlap/ops/all_gather_matmul.hpp"
#include "overlap/ops/matmul_reduce_scatter.hpp"
#include "overlap/ops/options.hpp"
#include "overlap/schedule/calibration.hpp"
#include "overlap/schedule/schedule.hpp"
