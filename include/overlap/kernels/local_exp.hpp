#pragma once
/// @file
/// exp over a buffer in place, for the softmax inside attention: oneDNN's
/// eltwise primitive (vectorised, JIT; local_primitives::exp) for float,
/// std::exp for double. A scalar std::exp per score costs about as much as
/// the score's share of the two attention GEMMs, so the softmax would
/// otherwise double their time.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "overlap/kernels/local_primitives.hpp"

namespace overlap::layers {

/// x[i] = exp(x[i]) for i < n. Local; not thread-safe: one caller at a time.
template <class A>
class local_exp {
  static_assert(std::is_same_v<A, float> || std::is_same_v<A, double>, "local math runs in float or double");

 public:
  /// Exponentiates n values at x in place.
  void operator()(A* x, int64_t n) {
    if constexpr (std::is_same_v<A, double>) {
      for (int64_t i = 0; i < n; ++i) x[i] = std::exp(x[i]);
    } else {
      for (int64_t at = 0; at < n; at += piece) prims_.exp(x + at, std::min(piece, n - at));
    }
  }

 private:
  // Longer buffers go in pieces of this many values: a bounded set of
  // primitive lengths, and each piece long enough that a call's overhead
  // is small beside its work.
  static constexpr int64_t piece = int64_t(1) << 20;
  local_primitives prims_;  // used for float only
};

}  // namespace overlap::layers
