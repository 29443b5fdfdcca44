// A const view as the output.
// expect: matrix_view<const float>|could not convert|no matching function
#include "common.hpp"

void call(overlap::context& ctx) {
  overlap::matrix_view<const float> a(a_data.data(), 2, 3), b(b_data.data(), 3, 2);
  overlap::matrix_view<const float> c(c_data.data(), 2, 2);
  overlap::matmul_reduce_scatter<float>(ctx, a, b, c);
}
