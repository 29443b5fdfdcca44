#pragma once
/// @file
/// overlap: forwarding header. The old path of overlap/kernels/local_gemm.hpp (moved in 0.3.0: kernels/ holds the
/// local primitives (no communication) that ring attention and the transformer block share). Include the new path.

#include "overlap/kernels/local_gemm.hpp"
