#pragma once
/// @file
/// Eigen backend: header-only fallback for float and double.

#include <Eigen/Core>

#include <memory>

#include "overlap/backend/gemm.hpp"

namespace overlap::backend {

template <class T>
class eigen_gemm final : public gemm_kernel<T> {
 public:
  explicit eigen_gemm(const gemm_desc& d) : d_(d) {}

  void run(const T* a, const T* b, T* c, const T* bias) const override {
    if (detail::run_degenerate(d_, c, bias)) return;
    using mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    using stride = Eigen::OuterStride<>;
    using cmap = Eigen::Map<const mat, Eigen::Unaligned, stride>;
    Eigen::Map<mat, Eigen::Unaligned, stride> cm(c, d_.m, d_.n, stride(d_.ldc));
    // Stored shapes: A is m x k (or k x m when transposed), B is k x n (or n x k).
    const cmap am(a, d_.trans_a ? d_.k : d_.m, d_.trans_a ? d_.m : d_.k, stride(d_.lda));
    const cmap bm(b, d_.trans_b ? d_.n : d_.k, d_.trans_b ? d_.k : d_.n, stride(d_.ldb));
    if (d_.trans_a && d_.trans_b) apply(cm, am.transpose() * bm.transpose());
    else if (d_.trans_a) apply(cm, am.transpose() * bm);
    else if (d_.trans_b) apply(cm, am * bm.transpose());
    else apply(cm, am * bm);
    detail::apply_epilogue(d_, c, bias);
  }

 private:
  template <class Dst, class Product>
  void apply(Dst& dst, const Product& p) const {
    if (d_.accumulate) dst.noalias() += p;
    else dst.noalias() = p;
  }
  gemm_desc d_;
};

/// Creates Eigen kernels; stateless.
class eigen_backend {
 public:
  template <class T>
  [[nodiscard]] std::shared_ptr<const gemm_kernel<T>> make(const gemm_desc& d) const {
    return std::make_shared<eigen_gemm<T>>(d);
  }
};

}  // namespace overlap::backend
