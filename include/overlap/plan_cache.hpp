#pragma once
/// @file
/// overlap: forwarding header. The old path of overlap/runtime/plan_cache.hpp (moved in 0.3.0: runtime/ holds the
/// context and what stands behind it: agreement, failures, the watchdog, the plan cache, meshes). Include the new
/// path.

#include "overlap/runtime/plan_cache.hpp"
