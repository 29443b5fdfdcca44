// Correct use: compiles (the control of the compile-failure tests).
#include "common.hpp"

void call(overlap::context& ctx) {
  overlap::matrix_view<const float> a(a_data.data(), 2, 3), b(b_data.data(), 3, 2);
  overlap::matrix_view<float> c(c_data.data(), 2, 2);
  overlap::ag_options opt;
  opt.epilogue.bias = c_data.data();  // a float bias for a float op
  overlap::all_gather_matmul<float>(ctx, a, b, c, opt);
  overlap::matmul_reduce_scatter<float>(ctx, a, b, c);
}
