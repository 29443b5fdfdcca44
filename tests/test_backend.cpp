// The GEMM backends against the naive reference: strides, transposes,
// beta = 1 accumulation and empty shapes. Local (no communication).
#include <gtest/gtest.h>

#include "overlap/backend/eigen.hpp"
#include "overlap/backend/onednn.hpp"
#include "overlap/matrix.hpp"
#include "reference.hpp"

using namespace testing_support;

namespace {

template <class T, class Backend>
void check_backend(Backend& be) {
  uint32_t seed = 1;
  const int64_t dims[][3] = {{1, 1, 1}, {5, 7, 3}, {33, 17, 64}, {4, 6, 0}, {0, 3, 2}};
  for (const auto& d : dims)
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (bool acc : {false, true}) {
          const int64_t m = d[0], n = d[1], k = d[2], pad = 2;
          auto A = random_matrix<T>(m, k, seed++);
          auto B = random_matrix<T>(k, n, seed++);
          // Stored forms: transposed operands are kept as their transpose.
          matrix<T> as = ta ? matrix<T>(k, m, pad) : slice(A, 0, 0, m, k, pad);
          matrix<T> bs = tb ? matrix<T>(n, k, pad) : slice(B, 0, 0, k, n, pad);
          if (ta)
            for (int64_t i = 0; i < m; ++i)
              for (int64_t j = 0; j < k; ++j) as(j, i) = A(i, j);
          if (tb)
            for (int64_t i = 0; i < k; ++i)
              for (int64_t j = 0; j < n; ++j) bs(j, i) = B(i, j);
          auto C0 = random_matrix<T>(m, n, seed++, pad);
          auto C = C0;
          overlap::gemm_desc desc{m, n, k, as.ld, bs.ld, C.ld, ta, tb, acc};
          desc.in = desc.out = overlap::dtype_of<T>();
          be.make(desc)->run(as.data.data(), bs.data.data(), C.data.data());
          auto ref = naive_matmul(A, B);
          if (acc)
            for (int64_t i = 0; i < m; ++i)
              for (int64_t j = 0; j < n; ++j) {
                ref.value(i, j) += C0(i, j);
                ref.magnitude(i, j) += std::abs(double(C0(i, j)));
              }
          expect_near_block(C, ref, 0, 0, k + 1,
                            "m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
                                " ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) + " acc=" + std::to_string(acc));
        }
}

TEST(backend, onednn_float) {
  overlap::backend::onednn_backend be;
  check_backend<float>(be);
}
TEST(backend, eigen_float) {
  overlap::backend::eigen_backend be;
  check_backend<float>(be);
}
TEST(backend, eigen_double) {
  overlap::backend::eigen_backend be;
  check_backend<double>(be);
}

TEST(backend, onednn_caches_kernels_by_shape) {
  overlap::backend::onednn_backend be;
  const overlap::gemm_desc d{8, 8, 8, 8, 8, 8, false, false, false};
  EXPECT_EQ(be.make(d).get(), be.make(d).get());
  overlap::gemm_desc other = d;
  other.in = overlap::dtype::bf16;
  EXPECT_NE(be.make(d).get(), be.make(other).get());
}

// bf16 operands with fp32 accumulation: into an fp32 C, and into a bf16 C
// with an fp32 addend, bias and activation fused (the last ring step).
TEST(backend, onednn_bf16) {
  overlap::backend::onednn_backend be;
  using overlap::bfloat16;
  const int64_t m = 9, n = 13, k = 70;
  const auto A = random_matrix<bfloat16>(m, k, 1), B = random_matrix<bfloat16>(k, n, 2);
  const auto D = random_matrix<float>(m, n, 3, 1);
  std::vector<bfloat16> bias(static_cast<size_t>(n));
  std::vector<double> bias_ref;
  for (int64_t j = 0; j < n; ++j) bias_ref.push_back(double(float(bias[j] = bfloat16(0.5f - 0.125f * float(j % 4)))));
  for (bool to_bf16 : {false, true}) {
    overlap::gemm_desc d{m, n, k, A.ld, B.ld, n};
    d.in = overlap::dtype::bf16;
    d.out = to_bf16 ? overlap::dtype::bf16 : overlap::dtype::f32;
    auto ref = naive_matmul(A, B);
    if (to_bf16) {
      d.addend = true, d.ld_addend = D.ld, d.addend_type = overlap::dtype::f32;
      d.bias = true, d.act = overlap::activation::gelu;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          ref.value(i, j) += D(i, j);
          ref.magnitude(i, j) += std::abs(double(D(i, j)));
        }
      reference_epilogue(ref, bias_ref, d.act);
      matrix<bfloat16> C(m, n);
      be.make(d)->run(A.data.data(), B.data.data(), C.data.data(), bias.data(), D.data.data());
      expect_near_block(C, ref, 0, 0, k + 1, "bf16 -> bf16 + addend + bias + gelu");
    } else {
      matrix<float> C(m, n);
      be.make(d)->run(A.data.data(), B.data.data(), C.data.data());
      expect_near_block(C, ref, 0, 0, k, "bf16 -> f32");
    }
  }
}

TEST(backend, unsupported_types_are_rejected) {
  overlap::backend::onednn_backend onednn;
  overlap::backend::eigen_backend eigen;
  overlap::gemm_desc d{2, 2, 2, 2, 2, 2};
  d.in = d.out = overlap::dtype::f64;
  EXPECT_THROW((void)onednn.make(d), std::invalid_argument);
  d.in = d.out = overlap::dtype::bf16;
  EXPECT_THROW((void)eigen.make(d), std::invalid_argument);
}

TEST(shard_layout, offsets_and_balanced) {
  const overlap::shard_layout l({3, 0, 5});
  EXPECT_EQ(l.parts(), 3);
  EXPECT_EQ(l.offset(0), 0);
  EXPECT_EQ(l.offset(1), 3);
  EXPECT_EQ(l.offset(2), 3);
  EXPECT_EQ(l.total(), 8);
  EXPECT_EQ(l.max_size(), 5);
  const auto b = overlap::shard_layout::balanced(10, 4);
  EXPECT_EQ(b.sizes(), (std::vector<int64_t>{3, 3, 2, 2}));
}

}  // namespace
