// The inputs the apps make and how closely their results must match: the
// global matrices' elements (the same on every rank, from the indices), and
// each element type's tolerance against the exact result.
#pragma once

#include <cstdint>
#include <type_traits>

#include "overlap/core/bfloat16.hpp"

namespace overlap::apps {

template <class T>
T from_float(float f) {
  return static_cast<T>(f);
}

/// Element (i, j) of a global matrix named by `salt`: the same on every
/// rank, in [-1, 1] in steps of 1/1000.
inline float global_value(int64_t i, int64_t j, uint32_t salt) {
  uint64_t h =
      static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull ^ (static_cast<uint64_t>(j) + salt) * 0xC2B2AE3D27D4EB4Full;
  h ^= h >> 29;
  return static_cast<float>(static_cast<int64_t>(h % 2001) - 1000) / 1000.0f;
}

/// The largest max |result - exact| / max |exact| a result of type T may show.
template <class T>
double tolerance() {
  if constexpr (std::is_same_v<T, double>)
    return 1e-10;
  else if constexpr (std::is_same_v<T, float>)
    return 1e-4;
  else
    return 2e-2;  // bf16: inputs rounded to 8 bits, one output rounding
}

}  // namespace overlap::apps
