// A view of doubles where the op takes floats.
// expect: matrix_view<const double>|could not convert|no matching function
#include "common.hpp"

void call(overlap::context& ctx) {
  overlap::matrix_view<const double> a(d_data.data(), 2, 3);
  overlap::matrix_view<const float> b(b_data.data(), 3, 2);
  overlap::matrix_view<float> c(c_data.data(), 2, 2);
  overlap::all_gather_matmul<float>(ctx, a, b, c);
}
