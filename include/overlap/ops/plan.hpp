#pragma once
/// @file
/// What every op's plan holds (op_plan) and what every ring plan is made of
/// (ring_step, finish_ring, ring_pattern): the parts of a plan that do not
/// depend on the op. An op's plan derives from op_plan and adds its geometry
/// and its bulk buffers; its ring steps derive from ring_step.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "overlap/backend/gemm.hpp"
#include "overlap/engine/buffer.hpp"
#include "overlap/engine/ring.hpp"
#include "overlap/mpi/datatype.hpp"
#include "overlap/ops/accumulate.hpp"
#include "overlap/ops/block_types.hpp"
#include "overlap/ops/options.hpp"
#include "overlap/ops/others.hpp"
#include "overlap/ops/packing.hpp"
#include "overlap/ops/site.hpp"
#include "overlap/runtime/context.hpp"
#include "overlap/schedule/model.hpp"
#include "overlap/schedule/schedule.hpp"

namespace overlap::detail {

/// One lane's entry of a ring step: a piece (a block of a matrix in global
/// coordinates), where it lives while it travels, whether it moves, and the
/// GEMM that computes with it. The op's step type adds where its piece
/// lives besides a slot and how its product enters the output.
struct ring_step {
  int64_t r0 = 0, c0 = 0, nr = 0, nc = 0;  ///< the piece in global coordinates
  int64_t slot_offset = 0;                 ///< into the slot buffer (a slot index until finish_ring)
  int64_t ld = 0;                          ///< leading dimension where it lives
  mpi::layout wire;                        ///< the piece as a message (block_types, owned by the plan)
  bool recv = false;                       ///< arrives from the next rank of its lane
  bool send = false;                       ///< goes to the previous rank of its lane (when: the op's pattern)
  bool compute = true;                     ///< false: this lane only moves the piece another lane computes
  gemm_desc desc;                          ///< what `kernel` computes
  std::shared_ptr<const gemm_kernel> kernel;
  [[nodiscard]] bool nonempty() const noexcept { return nr > 0 && nc > 0; }
};

/// Where an entry of a flat ring plan sits: round `round` of the ring,
/// piece `chunk` of `chunks` of the shard a lane holds then, lane `lane` of
/// `lanes` (bidirectional: 2). Step t = round * chunks + chunk.
struct ring_position {
  int round = 0;
  int chunk = 0, chunks = 1;
  int lane = 0, lanes = 1;
  [[nodiscard]] int step() const noexcept { return round * chunks + chunk; }
  /// The slot its piece uses: each lane's slots rotate, the lanes' interleave.
  [[nodiscard]] int64_t slot(const engine::ring_slots& s) const noexcept {
    return int64_t{step() % s.per_lane} * s.lanes + lane;
  }
};

/// Calls f(ring_position) for every entry of a flat ring plan of `chunks`
/// pieces per shard (its n_steps and lanes set), in the plan's order: step
/// by step, lane by lane within a step.
template <class Plan, class F>
void for_each_ring_position(const Plan& plan, int chunks, F&& f) {
  for (int i = 0; i < plan.n_steps / chunks; ++i)
    for (int j = 0; j < chunks; ++j)
      for (int l = 0; l < plan.lanes; ++l) f(ring_position{i, j, chunks, l, plan.lanes});
}

/// What travels round a ring, the one thing that tells the two families of
/// ring plans apart. An input's shards (the all-gather family): a piece is
/// computed once it arrived, and round i works on the shard i ranks ahead,
/// its own first. The output's partial sums (the reduce-scatter family): a
/// piece's accumulator is sent on once this rank's product is added, and
/// round i works on the shard i + 1 ranks ahead, so that the last round's
/// is this rank's own.
enum class travels { input, output };

/// The window of a ring whose pieces have `ahead` steps to arrive: an
/// input's piece is received that many steps before its own step and its
/// send stays in flight one step less; an output's accumulator was
/// computed by the neighbour that many steps earlier and sent a step later,
/// so it is received a step less ahead. Slots per lane that are never
/// rewritten while in use: the lead, the step itself, the sends in flight,
/// and an output's slot that is still being sent.
struct ring_layout {
  engine::ring_window window;
  int slots_per_lane = 0;
  ring_layout(travels what, int ahead)
      : window(what == travels::input ? engine::ring_window{ahead, ahead - 1}
                                      : engine::ring_window{ahead - 1, ahead - 2}),
        slots_per_lane(window.lead + (what == travels::input ? 1 : 2) + window.send_slack) {}
  /// How many ranks ahead on the ring lies the shard that round `round` works on.
  static int shard_ahead(travels what, int round) { return what == travels::input ? round : round + 1; }
};

/// One entry of a flat ring: where it sits, the shard its lane holds (an
/// input) or adds to (the output) at that round, and whether that is the
/// shard's first or last visit of the ring.
struct ring_visit {
  ring_position pos;
  int shard = 0;
  bool first = false, last = false;
};

/// The flat ring builder: `chunks` pieces per shard on the plan's lanes
/// (lane 0 from the next rank to the previous, lane 1 the other way, each
/// carrying its half of every shard), for what travels. Sets the plan's
/// steps, window and step count; `step(visit, slots)` makes each entry (the
/// op's piece of the shard). Returns the slots the entries use.
template <class Plan, class Step>
engine::ring_slots build_flat_ring(const build_site& at, Plan& plan, travels what, int chunks, Step&& step) {
  const int R = at.size();
  const ring_layout layout(what, chunks);
  plan.window = layout.window;
  plan.n_steps = R * chunks;
  engine::ring_slots slots{layout.slots_per_lane, plan.lanes, 0};
  for_each_ring_position(plan, chunks, [&](const ring_position& pos) {
    const int ahead = ring_layout::shard_ahead(what, pos.round);
    const ring_visit v{pos, at.ring_at(pos.lane == 0 ? ahead : -ahead), pos.round == 0, pos.round == R - 1};
    plan.steps.push_back(step(v, slots));
  });
  return slots;
}

/// One step of a two-level ring (S ranks on each of N nodes; this rank is
/// local rank j of node a, in the order by node): step t = (r * S + k) * C +
/// h works on piece h of C of the shard of local rank j + k (+ 1 for the
/// output) of node a + r (+ 1 for the output). `first`: the shard's first
/// step inside a node (k = 0); `last`: the ring's last visit of it.
struct node_visit {
  int step = 0, node = 0, local = 0;
  int chunk = 0, chunks = 1;
  int shard = 0;
  bool first = false, last = false;
};

/// Whether the two lanes' entries of a two-level ring's step share their
/// piece's slot (one piece moves on either lane: an input's) or each has
/// its own (an accumulator arriving from the other node beside this node's).
enum class lane_slots { shared, own };

/// The two-level ring builder: lane 0 runs between nodes, lane 1 inside
/// them, C pieces per shard, for what travels; a piece has a round of the
/// node (S * C steps) to arrive. Sets the plan's two lanes, window and step
/// count; `steps(visit, slots)` appends both lanes' entries of each step,
/// in slots laid out as `slots_of` says.
template <class Plan, class Steps>
engine::ring_slots build_two_level_ring(const build_site& at, Plan& plan, travels what, int chunks, lane_slots slots_of,
                                        Steps&& steps) {
  const int R = at.size(), S = at.node_slots(), C = chunks;
  const ring_layout layout(what, S * C);
  plan.lanes = 2;
  plan.window = layout.window;
  plan.n_steps = R * C;
  engine::ring_slots slots{layout.slots_per_lane, slots_of == lane_slots::shared ? 1 : 2, 0};
  const int over = what == travels::input ? 0 : 1;
  for (int t = 0; t < plan.n_steps; ++t) {
    node_visit v;
    v.step = t, v.node = t / (S * C), v.local = t / C % S, v.chunk = t % C, v.chunks = C;
    v.shard = at.node_peer(v.node + over, v.local + over);
    v.first = v.local == 0, v.last = t / C == R - 1;
    steps(v, slots);
  }
  return slots;
}

/// A plan of an op with element type T: the schedule that runs and, for each
/// kind of schedule, what running it takes. Step: the op's ring step (a
/// ring_step); Slot: what its ring slots hold.
template <class T, class Step, class Slot>
struct op_plan : plan_base {
  overlap::schedule sched;  ///< what runs, and the candidates when the model chose
  overlap::strategy strategy = overlap::strategy::ring;
  overlap::algorithm algorithm = overlap::algorithm::named;
  overlap::batch batch;   ///< the options' batch (this rank's strides)
  saved_output<T> saved;  ///< the options' accumulate
  // a ring (bidirectional, hierarchical)
  int lanes = 1;  ///< 2: bidirectional, or hierarchical (lane 0 between nodes, lane 1 inside them)
  int n_steps = 0;
  std::vector<Step> steps;  ///< step t, lane l at [t * lanes + l]
  engine::ring_window window;
  engine::buffer<Slot> slots;
  block_types types;
  b_packing pack;  ///< pieces that read all of b read it packed once per call where the backend can
  // algorithm::others
  others_plan<T> others;

  [[nodiscard]] const Step& step(int t, int lane) const {
    return steps[static_cast<size_t>(t) * static_cast<size_t>(lanes) + static_cast<size_t>(lane)];
  }
};

/// Pieces from this size on are paced under paced_sends::automatic: at
/// 1 Gbit/s 256 KiB takes 2 ms against a latency of tens of microseconds,
/// at 100 Gbit/s 21 us against one or two; below it a lane gains more from
/// messages overlapping their latencies than it loses to their sharing.
inline constexpr int64_t paced_min_bytes = int64_t{256} * 1024;

/// Whether a ring's lanes send one piece at a time: only where its sends
/// may stay in flight past the next step's (send_slack >= 1), so that
/// pieces could share a link, and as `how` says. On the emulated 2-node
/// star (TCP, 1 Gbit/s, f32 2048^3) pacing took the all-gather ring from
/// 93-106 ms to 89-91 and the reduce-scatter's from 102-108 to 94
/// (docs/results.md, "Paced sends").
inline bool paced_lanes(paced_sends how, const engine::ring_window& w, int64_t piece_bytes) {
  if (w.send_slack < 1 || how == paced_sends::off) return false;
  return how == paced_sends::on || piece_bytes >= paced_min_bytes;
}

/// Completes a ring plan once every step is known: B packed once per call
/// where the backend can, the slot indices scaled to offsets (`unit`
/// elements of Slot per element of a piece), the pieces' datatypes (one
/// message carries every batch member's piece, `member_stride(st)` elements
/// apart), and the slots themselves (a dry plan: the offsets alone). Step:
/// in_slot() says whether its piece lives in a slot.
template <class Plan, class MemberStride>
void finish_ring(const build_site& at, Plan& plan, const engine::ring_slots& slots, int64_t unit,
                 MemberStride&& member_stride) {
  if (!at.dry()) plan.pack.choose(plan.steps, [&](const gemm_desc& d) { return at.step_kernel(d); });
  const int64_t members = plan.batch.count;
  const auto piece_bytes = static_cast<int64_t>(slots.elems * members * unit * sizeof(*plan.slots.data()));
  plan.window.paced = paced_lanes(at.paced(), plan.window, piece_bytes);
  plan.window.ahead = plan.window.paced && at.progress() == progress_policy::none;
  for (auto& st : plan.steps) {
    if (st.in_slot()) st.slot_offset *= slots.elems * members * unit;
    if ((st.send || st.recv) && !at.dry()) st.wire = plan.types.get(st.nr, st.nc, st.ld, members, member_stride(st));
  }
  plan.slots = at.template buffer<typename decltype(plan.slots)::value_type>(
      static_cast<size_t>(slots.elems * members * slots.per_lane * slots.lanes * unit));
}

/// A built ring plan as the cost model prices it (schedule/model.hpp),
/// step by step: the products of the lanes that compute, and the bytes of
/// the pieces that travel (`unit` bytes per element of a piece), for one
/// batch member (the model prices one). output_moves: the ring moves the
/// output (work::output_moves).
template <class Plan>
work ring_plan_work(const Plan& plan, int64_t unit, bool output_moves) {
  work w;
  w.ring = true;
  w.lanes = plan.lanes;
  w.output_moves = output_moves;
  for (int t = 0; t < plan.n_steps; ++t) {
    ring_step_work s;
    for (int l = 0; l < plan.lanes; ++l) {
      const auto& st = plan.step(t, l);
      if (st.compute) s.products.push_back({st.desc.m, st.desc.n, st.desc.k});
      const double bytes = double(st.nr * st.nc * unit);
      if (st.recv) s.recv = std::max(s.recv, bytes), s.moved += bytes;
      if (st.send) s.moved += bytes;
    }
    w.ring_steps.push_back(std::move(s));
  }
  return w;
}

/// What every op's ring pattern (engine/ring.hpp) shares: its steps and
/// window come from the plan, and a step receives its piece where the
/// pattern says it lives (Derived::piece(step)).
template <class Derived, class Plan>
class ring_pattern {
 public:
  explicit ring_pattern(Plan& plan) : plan_(plan) {}
  [[nodiscard]] int steps() const { return plan_.n_steps; }
  [[nodiscard]] engine::ring_window window() const { return plan_.window; }
  [[nodiscard]] engine::transfer recv(int t, int lane) const {
    const auto& st = plan_.step(t, lane);
    return st.recv ? transfer_of(st, st) : engine::transfer{};
  }
  /// Whether after_ring has work this call (the pipeline runs and traces a
  /// local step only then): none, unless the op's pattern says otherwise.
  [[nodiscard]] bool work_after_ring() const { return false; }
  /// After the ring's last wait (a local step): nothing, unless the op's
  /// pattern has work left once every transfer completed.
  void after_ring() {}

 protected:
  /// The message of `wire`'s step, at the place where `at` lives.
  template <class Step>
  [[nodiscard]] engine::transfer transfer_of(const Step& wire, const Step& at) const {
    return {static_cast<const Derived&>(*this).piece(at), wire.wire.type, wire.wire.count};
  }
  Plan& plan_;
};

}  // namespace overlap::detail
