#pragma once
/// @file
/// bfloat16: the upper 16 bits of an IEEE float. Storage and conversion only;
/// products run in oneDNN with fp32 accumulation.

#include <cstdint>
#include <cstring>

namespace overlap {

/// A bfloat16 value (1 sign, 8 exponent, 7 mantissa bits), one of the ops' element types.
struct bfloat16 {
  uint16_t bits = 0;  ///< the upper 16 bits of the float it stands for

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
  /// Exact: a bfloat16 is a float with its low 16 bits zero.
  explicit operator float() const {
    const uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f = 0;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
  /// Exact, through float.
  explicit operator double() const { return static_cast<double>(static_cast<float>(*this)); }
  /// Bitwise equality (so a NaN equals itself, and -0 differs from +0).
  friend bool operator==(bfloat16 a, bfloat16 b) { return a.bits == b.bits; }
  /// Bitwise inequality.
  friend bool operator!=(bfloat16 a, bfloat16 b) { return a.bits != b.bits; }
};

}  // namespace overlap
