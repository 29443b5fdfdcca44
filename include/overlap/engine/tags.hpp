#pragma once
/// @file
/// Every message tag of the library's point-to-point traffic, in one enum:
/// no two kinds of message share a tag, so the messages of consecutive
/// operations on one communicator (two ops, an op and a calibration probe)
/// never match each other's receives.

namespace overlap::engine {

/// The tags, by kind of message (values are MPI tags; op_tags::owned_by gives an op its own).
enum class message_tag : int {
  /// The ops' tags start here: op k (ops/op_id.hpp) owns 4 (k - 1) and the
  /// three after it (op_tags::owned_by), up to op_tags_last.
  op_tags_first = 4,
  op_tags_last = 899,
  // the calibration's probes of the ring links (calibrate/measure.hpp)
  exchange_forward = 901,   ///< a ring exchange: to the previous rank
  exchange_backward = 902,  ///< and, both ways, to the next one
  slowdown_forward = 903,   ///< traffic beside a GEMM: to the previous rank
  slowdown_backward = 904,  ///< and to the next one
  latency_chain = 905,      ///< a chain of small messages round the ring
  // bulk collectives timed in their message pattern under SMPI (mpi/timing_only.hpp)
  timing_ring = 906,  ///< a block of a ring reduce-scatter, all-gather or all-reduce, to the next rank
};

/// The tag's value for MPI calls.
[[nodiscard]] constexpr int tag_value(message_tag t) noexcept { return static_cast<int>(t); }

}  // namespace overlap::engine
