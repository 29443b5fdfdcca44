// Explicit instantiations for the compiled flavour (overlap::compiled): code
// that links it gets these from the library instead of instantiating the
// engine in every translation unit (the header declares them extern).
#include "overlap/overlap.hpp"

namespace overlap {

template void all_gather_matmul<float>(context&, matrix_view<const float>, matrix_view<const float>,
                                       matrix_view<float>, const ag_options&);
template void all_gather_matmul<double>(context&, matrix_view<const double>, matrix_view<const double>,
                                        matrix_view<double>, const ag_options&);
template void all_gather_matmul<float>(context&, matrix_view<const float>, matrix_view<const float>,
                                       matrix_view<float>, matrix_view<float>, const ag_options&);
template void all_gather_matmul<double>(context&, matrix_view<const double>, matrix_view<const double>,
                                        matrix_view<double>, matrix_view<double>, const ag_options&);
template void matmul_reduce_scatter<float>(context&, matrix_view<const float>, matrix_view<const float>,
                                           matrix_view<float>, const rs_options&);
template void matmul_reduce_scatter<double>(context&, matrix_view<const double>, matrix_view<const double>,
                                            matrix_view<double>, const rs_options&);
template void all_gather_matmul<bfloat16>(context&, matrix_view<const bfloat16>, matrix_view<const bfloat16>,
                                          matrix_view<bfloat16>, const ag_options&);
template void all_gather_matmul<bfloat16>(context&, matrix_view<const bfloat16>, matrix_view<const bfloat16>,
                                          matrix_view<bfloat16>, matrix_view<bfloat16>, const ag_options&);
template void matmul_reduce_scatter<bfloat16>(context&, matrix_view<const bfloat16>, matrix_view<const bfloat16>,
                                              matrix_view<bfloat16>, const rs_options&);

}  // namespace overlap
