// The compiled flavour (overlap::compiled): the one translation unit that
// includes the implementation (every -inl.hpp), defines the OVERLAP_FUNC
// functions and instantiates both ops for every element type of
// OVERLAP_FOR_EACH_ELEMENT. Code that links the library parses declarations
// only (flavour.hpp).
#include "overlap/context-inl.hpp"
#include "overlap/ops/all_gather_matmul-inl.hpp"
#include "overlap/ops/matmul_reduce_scatter-inl.hpp"
#include "overlap/overlap.hpp"
#include "overlap/schedule/calibration-inl.hpp"

namespace overlap::detail {

#define OVERLAP_INSTANTIATE(T)                                                                              \
  template void all_gather_matmul_impl<T>(context&, const ag_args<T>&, const ag_options&);                  \
  template schedule all_gather_matmul_schedule_impl<T>(context&, const ag_args<T>&, const ag_options&);     \
  template void matmul_reduce_scatter_impl<T>(context&, const rs_args<T>&, const rs_options&);              \
  template schedule matmul_reduce_scatter_schedule_impl<T>(context&, const rs_args<T>&, const rs_options&); \
  template pending all_gather_matmul_start_impl<T>(context&, const ag_args<T>&, const ag_options&);         \
  template pending matmul_reduce_scatter_start_impl<T>(context&, const rs_args<T>&, const rs_options&);
OVERLAP_FOR_EACH_ELEMENT(OVERLAP_INSTANTIATE)
#undef OVERLAP_INSTANTIATE

}  // namespace overlap::detail
