#pragma once
/// @file
/// The GEMM concept the engine is written against.
///
/// A backend turns a gemm_desc (shapes, strides, transposes, beta) into a
/// kernel once, when a plan is built; the ring loop then only calls
/// kernel.run(a, b, c) with this step's pointers. Backends: onednn (default
/// for float) and eigen (header-only fallback; float and double).

#include <cmath>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>

namespace overlap {

/// Which GEMM library computes the products.
enum class backend_kind {
  automatic,  ///< oneDNN for float, Eigen for double
  onednn,     ///< oneDNN matmul primitives (float)
  eigen,      ///< Eigen products (float, double)
};

[[nodiscard]] inline const char* to_string(backend_kind b) {
  switch (b) {
    case backend_kind::automatic: return "automatic";
    case backend_kind::onednn: return "onednn";
    case backend_kind::eigen: return "eigen";
  }
  return "?";
}

/// Elementwise function applied to each output element by a fused epilogue.
enum class activation { none, relu, gelu };

[[nodiscard]] inline const char* to_string(activation a) {
  switch (a) {
    case activation::none: return "none";
    case activation::relu: return "relu";
    case activation::gelu: return "gelu";
  }
  return "?";
}

/// C (m x n, ldc) = act(op(A) (m x k) * op(B) (k x n) [+ C when accumulate] [+ bias]).
/// op(A) = A stored m x k with lda, or, with trans_a, A^T of a k x m matrix.
/// bias, when present, has n values (one per output column).
struct gemm_desc {
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  bool trans_a = false;
  bool trans_b = false;
  bool accumulate = false;  ///< beta = 1 (sum post-op) instead of beta = 0
  bool bias = false;
  overlap::activation act = overlap::activation::none;

  [[nodiscard]] bool has_epilogue() const noexcept { return bias || act != overlap::activation::none; }
  [[nodiscard]] auto tie() const { return std::tie(m, n, k, lda, ldb, ldc, trans_a, trans_b, accumulate, bias, act); }
  bool operator<(const gemm_desc& o) const { return tie() < o.tie(); }
  bool operator==(const gemm_desc& o) const { return tie() == o.tie(); }
};

/// A GEMM of one fixed gemm_desc, ready to run on any pointers. Not thread-safe.
template <class T>
class gemm_kernel {
 public:
  virtual ~gemm_kernel() = default;
  /// bias: n values when the desc has a bias, else ignored.
  virtual void run(const T* a, const T* b, T* c, const T* bias = nullptr) const = 0;
};

namespace detail {
template <class T>
T activate(T x, activation a) {
  switch (a) {
    case activation::none: return x;
    case activation::relu: return x > T(0) ? x : T(0);
    case activation::gelu: return static_cast<T>(0.5 * double(x) * (1.0 + std::erf(double(x) * 0.70710678118654752440)));
  }
  return x;
}

/// The epilogue as a pass over C, for backends without fused post-ops.
template <class T>
void apply_epilogue(const gemm_desc& d, T* c, const T* bias) {
  if (!d.has_epilogue()) return;
  for (int64_t i = 0; i < d.m; ++i)
    for (int64_t j = 0; j < d.n; ++j) {
      T& v = c[i * d.ldc + j];
      v = activate<T>(d.bias ? static_cast<T>(v + bias[j]) : v, d.act);
    }
}

/// The shapes every backend handles the same way without calling the library:
/// an empty output, or an empty contraction (C = 0, or C unchanged with beta = 1).
/// Returns true when it handled the call.
template <class T>
bool run_degenerate(const gemm_desc& d, T* c, const T* bias) {
  if (d.m == 0 || d.n == 0) return true;
  if (d.k != 0) return false;
  if (!d.accumulate)
    for (int64_t i = 0; i < d.m; ++i)
      for (int64_t j = 0; j < d.n; ++j) c[i * d.ldc + j] = T(0);
  apply_epilogue(d, c, bias);
  return true;
}
}  // namespace detail

}  // namespace overlap
