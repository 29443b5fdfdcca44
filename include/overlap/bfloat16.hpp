#pragma once
/// @file
/// bfloat16: the upper 16 bits of an IEEE float. Storage and conversion only;
/// products run in oneDNN with fp32 accumulation.

#include <cstdint>
#include <cstring>

namespace overlap {

struct bfloat16 {
  uint16_t bits = 0;

  bfloat16() = default;
  /// Rounds to nearest, ties to even; NaN stays NaN.
  explicit bfloat16(float f) {
    uint32_t u = 0;
    std::memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      bits = static_cast<uint16_t>((u >> 16) | 0x40u);
      return;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    bits = static_cast<uint16_t>(u >> 16);
  }
  explicit operator float() const {
    const uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f = 0;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
  explicit operator double() const { return static_cast<double>(static_cast<float>(*this)); }
  friend bool operator==(bfloat16 a, bfloat16 b) { return a.bits == b.bits; }
  friend bool operator!=(bfloat16 a, bfloat16 b) { return a.bits != b.bits; }
};

}  // namespace overlap
