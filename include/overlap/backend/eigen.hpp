#pragma once
/// @file
/// Eigen backend: header-only fallback for float and double.

#include <Eigen/Core>

#include <memory>
#include <stdexcept>
#include <string>

#include "overlap/backend/gemm.hpp"

namespace overlap::backend {

template <class T>
/// A GEMM of T (float or double) computed by Eigen: the fallback backend, and f64's.
class eigen_gemm final : public gemm_kernel {
 public:
  /// A kernel for `d` (in == out == T); nothing is allocated until run().
  explicit eigen_gemm(const gemm_desc& d) : d_(d) {}

  void run(const gemm_operands& io) const override {
    if (overlap::detail::run_degenerate(d_, io)) return;
    const T* a = static_cast<const T*>(io.a());
    const T* b = static_cast<const T*>(io.b());
    T* c = static_cast<T*>(io.c());
    using mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    using stride = Eigen::OuterStride<>;
    using cmap = Eigen::Map<const mat, Eigen::Unaligned, stride>;
    Eigen::Map<mat, Eigen::Unaligned, stride> cm(c, d_.m, d_.n, stride(d_.ldc));
    // Stored shapes: A is m x k (or k x m when transposed), B is k x n (or n x k).
    const cmap am(a, d_.trans_a ? d_.k : d_.m, d_.trans_a ? d_.m : d_.k, stride(d_.lda));
    const cmap bm(b, d_.trans_b ? d_.n : d_.k, d_.trans_b ? d_.k : d_.n, stride(d_.ldb));
    if (d_.trans_a && d_.trans_b)
      apply(cm, am.transpose() * bm.transpose());
    else if (d_.trans_a)
      apply(cm, am.transpose() * bm);
    else if (d_.trans_b)
      apply(cm, am * bm.transpose());
    else
      apply(cm, am * bm);
    overlap::detail::apply_epilogue(d_, io);
  }

 private:
  template <class Dst, class Product>
  void apply(Dst& dst, const Product& p) const {
    if (d_.accumulate)
      dst.noalias() += p;
    else
      dst.noalias() = p;
  }
  gemm_desc d_;
};

#ifdef OVERLAP_COMPILED
// Compiled once, in the library (src/instantiations.cpp): Eigen's products
// at -O3 are the costliest part of every unit that reaches this header
// (docs/building.md).
extern template class eigen_gemm<float>;
extern template class eigen_gemm<double>;
#endif

/// Creates Eigen kernels (float and double, one type per product); stateless.
class eigen_backend {
 public:
  /// A kernel for `d`; throws std::invalid_argument for bf16 or mixed types.
  [[nodiscard]] std::shared_ptr<const gemm_kernel> make(const gemm_desc& d) const {
    if (d.in != d.out || d.in == dtype::bf16)
      throw std::invalid_argument(std::string("overlap: the eigen backend multiplies f32 or f64 with the same output "
                                              "type; asked for ") +
                                  to_string(d.in) + " -> " + to_string(d.out) + " (use the onednn backend for bf16)");
    if (d.in == dtype::f64) return std::make_shared<eigen_gemm<double>>(d);
    return std::make_shared<eigen_gemm<float>>(d);
  }
};

}  // namespace overlap::backend
