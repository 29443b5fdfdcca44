#pragma once
/// @file
/// The layer's local products (attention, weight gradients): GEMMs of one
/// rank, on a backend of their own, so they may run while a started op's
/// GEMMs run on the context's worker thread (a backend's stream and its
/// kernels' workspaces are not shared between threads).

#include <map>
#include <memory>
#include <type_traits>

#include "overlap/backend/eigen.hpp"
#include "overlap/backend/gemm.hpp"
#include "overlap/backend/onednn.hpp"

namespace overlap::layers {

/// Which operand a local product reads transposed: C = A B, A B^T or A^T B.
enum class product { ab, abt, atb };
/// Whether a local product replaces C or is added to it.
enum class into { replace, add };

/// C = op(A) op(B) (or C += with into::add), row-major with leading
/// dimensions, in float (oneDNN) or double (Eigen). Local: no communication.
/// Kernels are cached by shape, up to kernel_bound shapes (then dropped
/// together: a mixture-of-experts layer's per-expert GEMMs take a new
/// shape with every routing, and the backend keeps a cache of its own). Not
/// thread-safe: one caller at a time.
template <class A>
class local_gemm {
  static_assert(std::is_same_v<A, float> || std::is_same_v<A, double>, "local products run in float or double");

 public:
  /// The matrices of one product, each with its leading dimension.
  struct operands {
    const A* a;   ///< the left operand
    int64_t lda;  ///< its leading dimension
    const A* b;   ///< the right operand
    int64_t ldb;  ///< its leading dimension
    A* c;         ///< the result
    int64_t ldc;  ///< its leading dimension
  };

  /// The matrices of a product in the ops' element type U (float or
  /// bfloat16 when A is float, double when A is double), with a bias of n
  /// values added to every row of C (none when null).
  template <class U>
  struct typed_operands {
    const U* a;     ///< the left operand
    int64_t lda;    ///< its leading dimension
    const U* b;     ///< the right operand
    int64_t ldb;    ///< its leading dimension
    U* c;           ///< the result, of U
    int64_t ldc;    ///< its leading dimension
    const U* bias;  ///< n values, or null
  };

  /// m x n result of op(a) (m x k) times op(b) (k x n); a transposed is
  /// stored k x m, b transposed is stored n x k.
  void run(product p, int64_t m, int64_t n, int64_t k, const operands& x, into w = into::replace) {
    gemm_desc d =
        gemm_desc::shape(m, n, k).strides(x.lda, x.ldb, x.ldc).transposed(p == product::atb, p == product::abt);
    d.types(dtype_of<A>(), dtype_of<A>()).accumulating(w == into::add);
    launch(d, gemm_operands().a(x.a).b(x.b).c(x.c));
  }
  /// The same in element type U, C replaced (bias added when given).
  template <class U>
  void run_typed(product p, int64_t m, int64_t n, int64_t k, const typed_operands<U>& x) {
    static_assert(std::is_same_v<U, double> == std::is_same_v<A, double>, "double runs on Eigen, the rest on oneDNN");
    gemm_desc d =
        gemm_desc::shape(m, n, k).strides(x.lda, x.ldb, x.ldc).transposed(p == product::atb, p == product::abt);
    d.types(dtype_of<U>(), dtype_of<U>());
    d.bias = x.bias != nullptr;
    launch(d, gemm_operands().a(x.a).b(x.b).c(x.c).bias(x.bias));
  }

 private:
  void launch(const gemm_desc& d, const gemm_operands& io) {
    if (overlap::detail::run_degenerate(d, io)) return;
    kernel(d).run(io);
  }
  const gemm_kernel& kernel(const gemm_desc& d) {
    if (cache_.size() >= kernel_bound && cache_.count(d) == 0) cache_.clear();
    auto& k = cache_[d];
    if (!k) {
      if constexpr (std::is_same_v<A, double>) {
        k = backend::eigen_backend{}.make(d);
      } else {
        if (!onednn_) onednn_ = std::make_unique<backend::onednn_backend>();
        // bf16 widened to f32 where oneDNN has no bf16 matmul (below AVX-512), as the context does.
        k = onednn_->make(d, d.in == dtype::bf16 && !backend::detail::native_bf16());
      }
    }
    return *k;
  }

  std::unique_ptr<backend::onednn_backend> onednn_;
  static constexpr size_t kernel_bound = 256;
  std::map<gemm_desc, std::shared_ptr<const gemm_kernel>> cache_;
};

}  // namespace overlap::layers
