#pragma once
/// @file
/// overlap: forwarding header. The old path of overlap/attention/causal_split.hpp (moved in 0.3.0: attention/ holds
/// ring attention, its tiles and its options, above the ops it shares a pipeline with). Include the new path.

#include "overlap/attention/causal_split.hpp"
