#pragma once
/// @file
/// The ops as the agreement, the plan keys and the message tags name them.

#include <array>
#include <cstdint>

#include "overlap/enum_names.hpp"

namespace overlap::detail {

/// The ops. The value enters the argument agreement, plan keys and
/// fingerprints, and sets the op's message tags (tags_of).
enum class op_id : int64_t { all_gather_matmul = 1, matmul_reduce_scatter = 2 };

/// The message tags of one op's point-to-point transfers: one per ring lane,
/// one for the other-operands algorithm's output blocks. No two ops share a
/// tag, so the messages of consecutive calls of different ops never match.
struct op_tags {
  int lanes[2];
  int blocks;
};
[[nodiscard]] constexpr op_tags tags_of(op_id op) {
  const int base = 4 * static_cast<int>(op);
  return {{base, base + 1}, base + 2};
}

}  // namespace overlap::detail

namespace overlap {
template <>
struct enum_names<detail::op_id> {
  static constexpr std::array<enum_entry<detail::op_id>, 2> entries{
      {{detail::op_id::all_gather_matmul, "all_gather_matmul"},
       {detail::op_id::matmul_reduce_scatter, "matmul_reduce_scatter"}}};
};
}  // namespace overlap
