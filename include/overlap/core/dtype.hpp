#pragma once
/// @file
/// Element types the library moves and multiplies, known at run time so a
/// plan can mix them (bf16 operands with an fp32 accumulator).

#include <mpi.h>

#include <array>
#include <cstddef>
#include <type_traits>

#include "overlap/core/bfloat16.hpp"
#include "overlap/core/enum_names.hpp"

namespace overlap {

/// The element types of the ops: float, double and overlap::bfloat16.
enum class dtype { f32, f64, bf16 };

/// The names of dtype's values, as the environment, messages and JSON spell them.
template <>
struct enum_names<dtype> {
  /// Every value with its name.
  static constexpr std::array<enum_entry<dtype>, 3> entries{
      {{dtype::f32, "f32"}, {dtype::f64, "f64"}, {dtype::bf16, "bf16"}}};
};

/// Whether the ops take T as an element type.
template <class T>
inline constexpr bool is_element_v =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, bfloat16>;

/// The dtype of an element type (float, double or bfloat16; others do not compile).
template <class T>
constexpr dtype dtype_of() {
  if constexpr (std::is_same_v<T, float>)
    return dtype::f32;
  else if constexpr (std::is_same_v<T, double>)
    return dtype::f64;
  else {
    static_assert(std::is_same_v<T, bfloat16>, "overlap supports float, double and bfloat16");
    return dtype::bf16;
  }
}

/// Bytes per value of t.
[[nodiscard]] inline size_t size_of(dtype t) { return t == dtype::f64 ? 8 : (t == dtype::f32 ? 4 : 2); }

/// The MPI type that moves values of t (bf16 travels as raw 16-bit words).
[[nodiscard]] inline MPI_Datatype mpi_type_of(dtype t) {
  return t == dtype::f64 ? MPI_DOUBLE : (t == dtype::f32 ? MPI_FLOAT : MPI_UINT16_T);
}

/// Reads element i of a buffer of type t as double (slow paths only).
[[nodiscard]] inline double load(dtype t, const void* p, int64_t i) {
  switch (t) {
    case dtype::f32: return static_cast<const float*>(p)[i];
    case dtype::f64: return static_cast<const double*>(p)[i];
    case dtype::bf16: return static_cast<double>(static_cast<float>(static_cast<const bfloat16*>(p)[i]));
  }
  return 0;
}
/// Writes v, rounded to t, as element i of a buffer of type t (slow paths only).
inline void store(dtype t, void* p, int64_t i, double v) {
  switch (t) {
    case dtype::f32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case dtype::f64: static_cast<double*>(p)[i] = v; break;
    case dtype::bf16: static_cast<bfloat16*>(p)[i] = bfloat16(static_cast<float>(v)); break;
  }
}

}  // namespace overlap
