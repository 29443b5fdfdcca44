#pragma once
/// @file
/// The ops as the agreement, the plan keys and the message tags name them.

#include <array>
#include <cstdint>

#include "overlap/engine/tags.hpp"
#include "overlap/enum_names.hpp"

namespace overlap::detail {

/// The ops. The value enters the argument agreement, plan keys and
/// fingerprints, and sets the op's message tags (tags_of).
enum class op_id : int64_t {
  all_gather_matmul = 1,
  matmul_reduce_scatter = 2,
  matmul_all_reduce = 3,
  ring_attention = 4
};

/// The message tags of one op's point-to-point transfers (engine/tags.hpp):
/// one per ring lane, one for the other-operands algorithm's output blocks.
/// matmul_all_reduce's rings are matmul_reduce_scatter's (and its all-gathers
/// are collectives): it has the reduce-scatter's tags. Ring attention runs
/// one lane and no other-operands algorithm: every field is its lane's tag.
struct op_tags {
  int lanes[2];
  int blocks;
};
[[nodiscard]] constexpr op_tags tags_of(op_id op) {
  using engine::message_tag, engine::tag_value;
  if (op == op_id::ring_attention) {
    const int t = tag_value(message_tag::attention_lane);
    return {{t, t}, t};
  }
  if (op == op_id::all_gather_matmul)
    return {{tag_value(message_tag::ag_lane0), tag_value(message_tag::ag_lane1)}, tag_value(message_tag::ag_blocks)};
  return {{tag_value(message_tag::rs_lane0), tag_value(message_tag::rs_lane1)}, tag_value(message_tag::rs_blocks)};
}

/// The names messages give an op's entry points and options.
struct entry_names {
  const char* call;            ///< "overlap::all_gather_matmul"
  const char* start;           ///< "overlap::start_all_gather_matmul"
  const char* schedule;        ///< "overlap::all_gather_matmul_schedule"
  const char* options;         ///< "ag_options"
  const char* layout;          ///< the layout option: "gathered"
  const char* layout_option;   ///< "ag_options.gathered"
  const char* chunks_setting;  ///< "config.ag_chunks"
};
[[nodiscard]] constexpr entry_names names_of(op_id op) {
  if (op == op_id::all_gather_matmul)
    return {"overlap::all_gather_matmul",
            "overlap::start_all_gather_matmul",
            "overlap::all_gather_matmul_schedule",
            "ag_options",
            "gathered",
            "ag_options.gathered",
            "config.ag_chunks"};
  if (op == op_id::matmul_all_reduce)
    return {"overlap::matmul_all_reduce",
            "overlap::start_matmul_all_reduce",
            "overlap::matmul_all_reduce_schedule",
            "ar_options",
            "reduced",
            "ar_options.reduced",
            "config.rs_chunks"};
  return {"overlap::matmul_reduce_scatter",
          "overlap::start_matmul_reduce_scatter",
          "overlap::matmul_reduce_scatter_schedule",
          "rs_options",
          "scattered",
          "rs_options.scattered",
          "config.rs_chunks"};
}

}  // namespace overlap::detail

namespace overlap {
template <>
struct enum_names<detail::op_id> {
  static constexpr std::array<enum_entry<detail::op_id>, 4> entries{
      {{detail::op_id::all_gather_matmul, "all_gather_matmul"},
       {detail::op_id::matmul_reduce_scatter, "matmul_reduce_scatter"},
       {detail::op_id::matmul_all_reduce, "matmul_all_reduce"},
       {detail::op_id::ring_attention, "ring_attention"}}};
};
}  // namespace overlap
