#pragma once
/// @file
/// The ops as the agreement, the plan keys and the message tags name them,
/// and what an op declares about itself for the shared code (op_info).

#include <array>
#include <cstdint>

#include "overlap/core/enum_names.hpp"
#include "overlap/engine/tags.hpp"

namespace overlap::detail {

/// The ops' ids: one list (with their names, enum_names below), so that no
/// two ops share one. The value enters the argument agreement, plan keys
/// and fingerprints, and sets the message tags the op owns
/// (op_tags::owned_by). Everything else about an op (its names, its tags,
/// its settings) is declared in the op's own file, as a specialisation of
/// op_info that the shared code looks up.
enum class op_id : int64_t {
  all_gather_matmul = 1,
  matmul_reduce_scatter = 2,
  matmul_all_reduce = 3,
  ring_attention = 4,
  ring_attention_backward = 5,
  all_to_all_matmul = 6,
  matmul_all_to_all = 7,
  /// Ops defined outside this list (a program's or a test's own op, in one
  /// file: docs/design.md, "Adding an op") take ids from here to
  /// extension_last, one each; the library's own never do.
  extension_first = 128,
  extension_last = 224
};

/// The message tags of one op's point-to-point transfers (engine/tags.hpp):
/// one per ring lane, one for the other-operands algorithm's output blocks.
struct op_tags {
  int lanes[2];
  int blocks;
  /// The tags op `id` owns: message_tag::op_tags_first + 4 * (id - 1) and
  /// the next two, so that two ops' messages never match each other's
  /// receives.
  [[nodiscard]] static constexpr op_tags owned_by(op_id id) {
    const int first = engine::tag_value(engine::message_tag::op_tags_first) + 4 * (static_cast<int>(id) - 1);
    return {{first, first + 1}, first + 2};
  }
};

/// What an op's op_info derives from: the tags its id owns
/// (op_tags::owned_by), so that no op states another's.
template <op_id Id>
struct owns_tags {
  static constexpr op_tags tags = op_tags::owned_by(Id);
};

/// The names messages give an op's entry points and options.
struct entry_names {
  const char* call;            ///< "overlap::all_gather_matmul"
  const char* start;           ///< "overlap::start_all_gather_matmul" ("": none)
  const char* schedule;        ///< "overlap::all_gather_matmul_schedule" ("": none)
  const char* options;         ///< "ag_options"
  const char* layout;          ///< the layout option: "gathered"
  const char* layout_option;   ///< "ag_options.gathered"
  const char* chunks_setting;  ///< "config.ag_chunks" ("": none)
};

/// The entry_names of a matmul op from string literals, joined at compile
/// time: its NAME ("all_gather_matmul"), its OPTIONS type ("ag_options"),
/// its LAYOUT option ("gathered") and its CHUNKS setting ("ag_chunks").
#define OVERLAP_ENTRY_NAMES(NAME, OPTIONS, LAYOUT, CHUNKS)                                                       \
  ::overlap::detail::entry_names {                                                                               \
    "overlap::" NAME, "overlap::start_" NAME, "overlap::" NAME "_schedule", OPTIONS, LAYOUT, OPTIONS "." LAYOUT, \
        "config." CHUNKS                                                                                         \
  }

/// What the shared code knows of op `Id`, declared by the op's own file:
/// `tags` (an op_tags: the specialisation derives from owns_tags<Id>) and
/// `names` (its entry_names). No default: an op that declares nothing
/// fails to compile rather than take another op's tags or names.
template <op_id Id>
struct op_info;

}  // namespace overlap::detail

namespace overlap {
/// The ops' names beside their ids: messages about another rank's call name
/// its op from the id it sent (ops/call_agreement.hpp).
template <>
struct enum_names<detail::op_id> {
  static constexpr std::array<enum_entry<detail::op_id>, 7> entries{
      {{detail::op_id::all_gather_matmul, "all_gather_matmul"},
       {detail::op_id::matmul_reduce_scatter, "matmul_reduce_scatter"},
       {detail::op_id::matmul_all_reduce, "matmul_all_reduce"},
       {detail::op_id::ring_attention, "ring_attention"},
       {detail::op_id::ring_attention_backward, "ring_attention_backward"},
       {detail::op_id::all_to_all_matmul, "all_to_all_matmul"},
       {detail::op_id::matmul_all_to_all, "matmul_all_to_all"}}};
};
// Every op's tags stay below the calibration's (the last id owns the highest).
static_assert(detail::op_tags::owned_by(detail::op_id::extension_last).blocks <=
                  engine::tag_value(engine::message_tag::op_tags_last),
              "the ops' message tags must stay below engine::message_tag::op_tags_last");
static_assert(static_cast<int64_t>(enum_names<detail::op_id>::entries.back().value) <
                  static_cast<int64_t>(detail::op_id::extension_first),
              "the library's ops take ids below the extensions'");
}  // namespace overlap
