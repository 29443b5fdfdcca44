#pragma once
/// @file
/// Conversions between the element types (float, double, bfloat16) that the
/// layers, their apps and their tests share.

#include <type_traits>

#include "overlap/core/bfloat16.hpp"

namespace overlap::layers::detail {

/// v as To; bfloat16 converts through float.
template <class To, class From>
To cast(From v) {
  if constexpr (std::is_same_v<To, From>)
    return v;
  else if constexpr (std::is_same_v<To, bfloat16>)
    return bfloat16(static_cast<float>(v));
  else if constexpr (std::is_same_v<From, bfloat16>)
    return static_cast<To>(static_cast<float>(v));
  else
    return static_cast<To>(v);
}

}  // namespace overlap::layers::detail
