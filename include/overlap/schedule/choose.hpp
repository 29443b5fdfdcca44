#pragma once
/// @file
/// overlap: forwarding header. The old path of overlap/ops/choose.hpp (moved in
/// 0.3.0: schedule/ holds the pure model, which the context's headers use;
/// what calls the context lives above it). Include the new path.

#include "overlap/ops/choose.hpp"
