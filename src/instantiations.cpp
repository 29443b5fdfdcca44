// The compiled flavour (overlap::compiled): the one translation unit that
// includes the implementation (every -inl.hpp), defines the OVERLAP_FUNC
// functions and instantiates every op for every element type of
// OVERLAP_FOR_EACH_ELEMENT. Code that links the library parses declarations
// only (flavour.hpp).
#include "overlap/backend/eigen.hpp"
#include "overlap/engine/trace-inl.hpp"
#include "overlap/ops/all_gather_matmul-inl.hpp"
#include "overlap/ops/matmul_all_reduce-inl.hpp"
#include "overlap/ops/matmul_reduce_scatter-inl.hpp"
#include "overlap/overlap.hpp"
#include "overlap/runtime/context-inl.hpp"
#include "overlap/schedule/calibration-inl.hpp"

namespace overlap::detail {

// Every op's three entry points (ops/entry_points.hpp) for element type T:
// the one list of explicit instantiations. A new op adds its line here.
#define OVERLAP_ENTRY_POINTS(Op, Args, Options)                         \
  template void op_call<Op>(context&, const Args&, const Options&);     \
  template pending op_start<Op>(context&, const Args&, const Options&); \
  template schedule op_schedule<Op>(context&, const Args&, const Options&);
#define OVERLAP_INSTANTIATE(T)                           \
  OVERLAP_ENTRY_POINTS(ag_op<T>, ag_args<T>, ag_options) \
  OVERLAP_ENTRY_POINTS(rs_op<T>, rs_args<T>, rs_options) \
  OVERLAP_ENTRY_POINTS(ar_op<T>, ar_args<T>, ar_options)
OVERLAP_FOR_EACH_ELEMENT(OVERLAP_INSTANTIATE)
#undef OVERLAP_INSTANTIATE
#undef OVERLAP_ENTRY_POINTS

}  // namespace overlap::detail

// The Eigen kernels (backend/eigen.hpp declares them extern in this flavour).
template class overlap::backend::eigen_gemm<float>;
template class overlap::backend::eigen_gemm<double>;
