#pragma once
/// @file
/// Every message tag of the library's point-to-point traffic, in one enum:
/// no two kinds of message share a tag, so the messages of consecutive
/// operations on one communicator (two ops, an op and a calibration probe)
/// never match each other's receives.

namespace overlap::engine {

/// The tags, by kind of message (values are MPI tags; tags_of() maps an op's lanes to them).
enum class message_tag : int {
  // all_gather_matmul: ring lanes 0 and 1, the other-operands algorithm's output blocks
  ag_lane0 = 4,
  ag_lane1 = 5,
  ag_blocks = 6,
  // matmul_reduce_scatter: likewise
  rs_lane0 = 8,
  rs_lane1 = 9,
  rs_blocks = 10,
  // ring attention (layers/ring_attention.hpp): its one ring lane
  attention_lane = 12,
  // the calibration's probes of the ring links (schedule/measure.hpp)
  exchange_forward = 901,   ///< a ring exchange: to the previous rank
  exchange_backward = 902,  ///< and, both ways, to the next one
  slowdown_forward = 903,   ///< traffic beside a GEMM: to the previous rank
  slowdown_backward = 904,  ///< and to the next one
  latency_chain = 905,      ///< a chain of small messages round the ring
};

/// The tag's value for MPI calls.
[[nodiscard]] constexpr int tag_value(message_tag t) noexcept { return static_cast<int>(t); }

}  // namespace overlap::engine
