// An element type the ops do not take.
// expect: overlap supports float, double and bfloat16
#include "common.hpp"

void call(overlap::context& ctx) {
  std::vector<int> x(4);
  overlap::matrix_view<const int> a(x.data(), 2, 2);
  overlap::matrix_view<int> c(x.data(), 2, 2);
  overlap::all_gather_matmul<int>(ctx, a, a, c);
}
