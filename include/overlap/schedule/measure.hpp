#pragma once
/// @file
/// overlap: forwarding header. The old path of overlap/calibrate/measure.hpp (moved in
/// 0.3.0: schedule/ holds the pure model, which the context's headers use;
/// what calls the context lives above it). Include the new path.

#include "overlap/calibrate/measure.hpp"
