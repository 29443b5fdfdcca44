#pragma once
/// @file
/// GELU and its derivative over a buffer whose length changes from call to
/// call (a mixture-of-experts layer's rows follow the routing): oneDNN's
/// eltwise (gelu_erf, vectorised; local_primitives) for float, the plain
/// loops of local_math.hpp for double. A scalar std::erf per value costs
/// about 20 ns on real data: for 8192 rows of 4096 that is 0.7 s forward and
/// about 1 s backward per step, more than the experts' GEMMs' share hidden
/// behind the exchange.

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "overlap/kernels/local_math.hpp"
#include "overlap/kernels/local_primitives.hpp"

namespace overlap::layers {

/// Local; not thread-safe: one caller at a time.
template <class A>
class local_gelu {
  static_assert(std::is_same_v<A, float> || std::is_same_v<A, double>, "local math runs in float or double");

 public:
  /// y[i] = gelu(x[i]) for i < n (y may be x).
  void forward(const A* x, A* y, int64_t n) {
    if constexpr (std::is_same_v<A, double>) {
      for (int64_t i = 0; i < n; ++i) y[i] = math::gelu(x[i]);
    } else {
      for_pieces(n, [&](int64_t at, int64_t len) { prims_.gelu(x + at, y + at, len); });
    }
  }
  /// dy[i] *= gelu'(x[i]) for i < n.
  void backward(const A* x, A* dy, int64_t n) {
    if constexpr (std::is_same_v<A, double>) {
      for (int64_t i = 0; i < n; ++i) dy[i] *= math::gelu_grad(x[i]);
    } else {
      for_pieces(n, [&](int64_t at, int64_t len) { prims_.gelu_backward(x + at, dy + at, dy + at, len); });
    }
  }

 private:
  // The primitives are cached by length, so every length is a power of two
  // up to `piece`: a bounded set (21 lengths) whatever the routing.
  static constexpr int64_t piece = int64_t(1) << 20;
  template <class F>
  static void for_pieces(int64_t n, F&& f) {
    int64_t at = 0;
    for (; n - at >= piece; at += piece) f(at, piece);
    for (int64_t len = piece / 2; len > 0; len /= 2)
      if (n - at >= len) f(at, len), at += len;
  }
  local_primitives prims_;  // used for float only
};

}  // namespace overlap::layers
