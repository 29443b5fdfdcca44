#pragma once
/// @file
/// The GEMM concept the engine is written against.
///
/// A backend turns a gemm_desc (shapes, strides, transposes, beta) into a
/// kernel once, when a plan is built; the ring loop then only calls
/// kernel.run(a, b, c) with this step's pointers. Backends: onednn (default
/// for float) and eigen (header-only fallback; float and double).

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

/// C (m x n, ldc) = op(A) (m x k) * op(B) (k x n) [+ C when accumulate].
/// op(A) = A stored m x k with lda, or, with trans_a, A^T of a k x m matrix.
struct gemm_desc {
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  bool trans_a = false;
  bool trans_b = false;
  bool accumulate = false;  ///< beta = 1 (sum post-op) instead of beta = 0

  [[nodiscard]] auto tie() const { return std::tie(m, n, k, lda, ldb, ldc, trans_a, trans_b, accumulate); }
  bool operator<(const gemm_desc& o) const { return tie() < o.tie(); }
  bool operator==(const gemm_desc& o) const { return tie() == o.tie(); }
};

/// A GEMM of one fixed gemm_desc, ready to run on any pointers. Not thread-safe.
template <class T>
class gemm_kernel {
 public:
  virtual ~gemm_kernel() = default;
  virtual void run(const T* a, const T* b, T* c) const = 0;
};

namespace detail {
/// The shapes every backend handles the same way without calling the library:
/// an empty output, or an empty contraction (C = 0, or C unchanged with beta = 1).
/// Returns true when it handled the call.
template <class T>
bool run_degenerate(const gemm_desc& d, T* c) {
  if (d.m == 0 || d.n == 0) return true;
  if (d.k != 0) return false;
  if (!d.accumulate)
    for (int64_t i = 0; i < d.m; ++i)
      for (int64_t j = 0; j < d.n; ++j) c[i * d.ldc + j] = T(0);
  return true;
}
}  // namespace detail

}  // namespace overlap
