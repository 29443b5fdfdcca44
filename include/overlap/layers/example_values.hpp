#pragma once
/// @file
/// Deterministic values for examples, tests and benchmarks of the block:
/// the same on every rank and in every run, so that each rank can fill its
/// own shards (overlap::layers::visit gives each entry's global place) and a
/// reference can rebuild the whole block.

#include <cmath>
#include <cstdint>
#include <string>

#include "overlap/layers/block_params.hpp"

namespace overlap::layers {

/// A value in [-1, 1) for entry (i, j) of the tensor called `name`
/// (a hash of the three, not a random stream).
inline double example_value(const std::string& name, int64_t i, int64_t j) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a of the name, then a 64-bit mix with the indices
  for (char ch : name) h = (h ^ uint64_t(uint8_t(ch))) * 1099511628211ull;
  h ^= uint64_t(i) * 0x9E3779B97F4A7C15ull + uint64_t(j) * 0xC2B2AE3D27D4EB4Full;
  h ^= h >> 33, h *= 0xff51afd7ed558ccdull, h ^= h >> 33, h *= 0xc4ceb9fe1a85ec53ull, h ^= h >> 33;
  return double(h >> 11) * 0x1.0p-52 - 1.0;
}

/// A plausible parameter of a block (names as block_params): layer-norm
/// gains near 1, small shifts and biases, weights scaled by their fan-in.
inline double example_parameter(const block_shape& s, const std::string& name, int64_t i, int64_t j) {
  const double u = example_value(name, i, j);
  if (name == "ln1_g" || name == "ln2_g") return 1 + 0.2 * u;
  if (name[0] == 'b' || name == "ln1_b" || name == "ln2_b") return 0.1 * u;
  return 1.5 * u / std::sqrt(double(name == "w2" ? s.ffn : s.hidden));
}

/// Block b's parameter of a model of several blocks (layers/block_stack.hpp):
/// as example_parameter, different in every block.
inline double example_parameter(const block_shape& s, int b, const std::string& name, int64_t i, int64_t j) {
  return example_parameter(s, name, i + 7919 * int64_t(b), j);
}

}  // namespace overlap::layers
