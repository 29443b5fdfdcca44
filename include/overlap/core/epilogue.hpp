#pragma once
/// @file
/// A fused epilogue of the ops: C = act(product + bias), and its typed bias.

#include <array>
#include <cstddef>
#include <type_traits>

#include "overlap/core/dtype.hpp"
#include "overlap/core/enum_names.hpp"

namespace overlap {

/// Elementwise function applied to each output element by a fused epilogue.
enum class activation { none, relu, gelu };

/// The names of activation's values, as the environment, messages and JSON spell them.
template <>
struct enum_names<activation> {
  /// Every value with its name.
  static constexpr std::array<enum_entry<activation>, 3> entries{
      {{activation::none, "none"}, {activation::relu, "relu"}, {activation::gelu, "gelu"}}};
};

/// A pointer to bias values of one element type the ops take (float, double,
/// bfloat16), or none. It remembers the type: an op whose element type differs
/// rejects it with std::invalid_argument on every rank, and a pointer to any
/// other type (void, int, ...) does not compile.
class typed_bias {
 public:
  constexpr typed_bias() noexcept = default;
  /// No bias.
  constexpr typed_bias(std::nullptr_t) noexcept {}  // NOLINT(google-explicit-constructor): `bias = nullptr`
  /// A bias of element type T (float, double or bfloat16): c.cols values.
  template <class T, std::enable_if_t<is_element_v<T>, int> = 0>
  constexpr typed_bias(const T* values) noexcept  // NOLINT(google-explicit-constructor): `bias = ptr`
      : values_(values), type_(dtype_of<T>()) {}

  /// Whether there is a bias.
  [[nodiscard]] constexpr explicit operator bool() const noexcept { return values_ != nullptr; }
  /// The element type the pointer was made from (meaningless when null).
  [[nodiscard]] constexpr dtype type() const noexcept { return type_; }
  /// Whether an op of element type T can read it: null, or made from a const T*.
  template <class T>
  [[nodiscard]] constexpr bool fits() const noexcept {
    return values_ == nullptr || type_ == dtype_of<T>();
  }
  /// The values as T (null when none, or when made from another type).
  template <class T>
  [[nodiscard]] constexpr const T* get() const noexcept {
    return type_ == dtype_of<T>() ? static_cast<const T*>(values_) : nullptr;
  }

 private:
  const void* values_ = nullptr;
  dtype type_ = dtype::f32;
};

/// A fused epilogue: C = act(product + bias), applied exactly once to every
/// output element (after the last accumulation).
struct epilogue {
  overlap::activation activation = overlap::activation::none;  ///< applied after the bias
  /// None, or c.cols values of the op's element type (one per output column of
  /// this rank's c). Per rank: it only touches this rank's c.
  typed_bias bias;
};

}  // namespace overlap
