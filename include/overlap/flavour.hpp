#pragma once
/// @file
/// overlap: forwarding header. The old path of overlap/core/flavour.hpp (moved in 0.3.0: core/ holds the leaf types
/// every floor uses (no MPI, no context)). Include the new path.

#include "overlap/core/flavour.hpp"
