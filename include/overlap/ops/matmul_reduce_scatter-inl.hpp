#pragma once
/// @file
/// The implementation of matmul_reduce_scatter (its plans, their building and
/// running): part of the header-only flavour, compiled once into the library
/// otherwise (flavour.hpp).

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "overlap/core/matrix.hpp"
#include "overlap/engine/buffer.hpp"
#include "overlap/engine/ring.hpp"
#include "overlap/mpi/datatype.hpp"
#include "overlap/mpi/timing_only.hpp"
#include "overlap/ops/accumulate.hpp"
#include "overlap/ops/block_types.hpp"
#include "overlap/ops/call_agreement.hpp"
#include "overlap/ops/checks.hpp"
#include "overlap/ops/choose.hpp"
#include "overlap/ops/geometry.hpp"
#include "overlap/ops/matmul_reduce_scatter.hpp"
#include "overlap/ops/op_id.hpp"
#include "overlap/ops/options.hpp"
#include "overlap/ops/others.hpp"
#include "overlap/ops/packing.hpp"
#include "overlap/ops/pipeline.hpp"
#include "overlap/ops/plan.hpp"
#include "overlap/ops/run.hpp"
#include "overlap/ops/site.hpp"
#include "overlap/ops/verbose.hpp"
#include "overlap/runtime/context.hpp"
#include "overlap/schedule/chunks.hpp"

namespace overlap {
namespace detail {

/// A ring step's output piece (global C coordinates), where its
/// accumulator lives, and where its product goes. Its accumulator is sent
/// at the next step, once computed (rs_ring_pattern::send).
struct rs_step : ring_step {
  bool dst_c = false;     ///< the final step: the product goes to this rank's c
  bool acc_in_c = false;  ///< the accumulator lives in c (else in a slot, slot_offset in bytes)
  bool add_slot = false;  ///< c = product + the fp32 accumulator in the slot (bf16, final step)
  bool finish = false;    ///< final step, c's block strided: the product sums into the slot, a pass writes c
  /// Final step of a flat ring whose accumulators are c's type and c's block
  /// dense: the owner's product goes into c without waiting for the
  /// accumulator, which arrives in a slot and is added (with the epilogue)
  /// at the next step, or after the ring for the last: the last piece's
  /// GEMM no longer follows the last transfer (rs_ring_pattern::add_arrived).
  bool ahead = false;
  /// Flat rings: the step before which this step's send (posted at the
  /// next step) must complete: the first later step that writes its slot
  /// (send_deadlines); -1: the window's bound.
  int send_due = -1;
  gemm_desc merge;  ///< hierarchical, lane 0, recv: adds the slot into lane 1's accumulator
  [[nodiscard]] bool in_slot() const noexcept { return !acc_in_c; }
};

/// What the exchanged table says about the whole problem.
struct rs_global {
  bool rows = true;
  int64_t m = 0, n = 0;
  shard_layout layout;      ///< the scattered dimension over the ranks
  std::vector<int64_t> ks;  ///< every rank's K_r
  int64_t knee_units = 0;   ///< the largest GEMM rate knee over ranks
};

/// A plan of matmul_reduce_scatter: the shared parts (op_plan), the
/// scattered output's geometry, the accumulators' type, and what the bulk
/// schedule adds.
template <class T>
struct rs_plan final : op_plan<T, rs_step, std::byte> {
  rs_global whole;         ///< the problem: C's m x n, scattered by rows or columns over `layout`
  dtype acc = dtype::f32;  ///< what accumulators are summed and sent in
  // bulk
  engine::buffer<std::byte> product_ws, result_ws;
  std::vector<int> counts;
  std::vector<gemm_desc> bulk_descs;                             ///< one per output block
  std::vector<std::shared_ptr<const gemm_kernel>> bulk_kernels;  ///< one per output block
  gemm_desc finish;  ///< the bulk pass over c: convert the reduced result, bias, activation
};

/// How a piece's product enters its destination.
struct rs_piece_output {
  bool accumulate = false;  ///< += the accumulator already there
  bool last = false;        ///< into c (type T, the epilogue runs), else into an accumulator (type acc)
  bool add_slot = false;    ///< c = product + the fp32 accumulator in a slot (bf16, final step)
};

/// Where a piece sits in its shard's chain of partial sums and in the plan.
struct rs_piece {
  int shard = 0;
  int part = 0, parts = 1;    ///< the shard's part along the scattered dimension (bidirectional: 2)
  int chunk = 0, chunks = 1;  ///< the piece within the part
  bool first = false;         ///< the chain starts: nothing arrives to add to
  bool last = false;          ///< the chain ends on this rank: the sum goes to c
  int slot = 0;               ///< the slot its accumulator uses, unless it is in c
  bool flat = false;          ///< on a flat ring (its last step may compute ahead: rs_step::ahead)
};

/// Where a GEMM of rs_others_build reads an operand: source, element offset,
/// leading dimension.
struct rs_operand {
  others_src src = others_src::exchanged;
  int64_t off = 0, ld = 1;
};

/// What each rank contributes when the ranks exchange their calls (on a plan
/// miss anywhere): the options, which must agree (matmul_row::agreed and more_agreed name them), and
/// this rank's sizes. Exchanged as one MPI datatype (exchange_rows).
struct rs_exchanged : matmul_row {
  int64_t bf16_transfers;

  static constexpr std::array<agreed_field<rs_exchanged>, 1> more_agreed{{
      {"bf16_transfers", &rs_exchanged::bf16_transfers},
  }};
};

template <class T>
class rs_ring_pattern;

/// matmul_reduce_scatter's names and message tags (ops/op_id.hpp).
template <>
struct op_info<op_id::matmul_reduce_scatter> : owns_tags<op_id::matmul_reduce_scatter> {
  static constexpr entry_names names =
      OVERLAP_ENTRY_NAMES("matmul_reduce_scatter", "rs_options", "scattered", "rs_chunks");
};

/// matmul_reduce_scatter as an op of the shared pipeline
/// (ops/pipeline.hpp): what is its own, from the checks of one rank to the
/// bulk run.
template <class T>
struct rs_op : op_defaults,
               op_names<op_id::matmul_reduce_scatter, &rs_options::scattered, &config::rs_chunks>,
               op_types<T, rs_args<T>, rs_options, rs_plan<T>, rs_exchanged, rs_global, rs_ring_pattern<T>> {
  /// Every plan applies: bulk, the rings, the two-level ring, the inputs travelling.
  static constexpr op_builders<rs_plan<T>, rs_args<T>, rs_options, rs_global> builders() {
    return {&rs_op::build_bulk, &rs_op::build_ring, &rs_op::build_hierarchical, &rs_op::build_others};
  }
  static void describe(rs_plan<T>& p, const rs_options& o, const rs_global& g) {
    p.whole = g;
    p.acc = acc_type(dtype_of<T>(), o, p.strategy);
  }
  static std::string summary(const rs_plan<T>& p, const rs_global& g) {
    return (p.algorithm == algorithm::others ? std::string(" moving the inputs") : std::string()) +
           ", scattered sizes [" + list(g.layout.sizes()) + "], C " + std::to_string(p.whole.m) + " x " +
           std::to_string(p.whole.n) + ", accumulators " + to_string(p.acc);
  }
  static std::string plan_notes(const rs_plan<T>& /*p*/) { return ""; }

  // The checks, the exchange and the choice (ops/pipeline.hpp, prepare).

  /// Step 1 of preparing a call: the checks each rank makes alone (options,
  /// views, aliasing, shapes); returns the backend for the plan key. Messages
  /// are built only for a rule that fails.
  static int local_checks(const context& ctx, arg_checks& checks, const rs_args<T>& x, const rs_options& opt) {
    check_matmul_args<rs_op>(checks, opt, x);
    const dims2 la = op_dims(x.a, opt.transpose_a), lb = op_dims(x.b, opt.transpose_b);
    const bool ta = opt.transpose_a, tb = opt.transpose_b;
    require_equal(checks, ta, tb, lb.rows, "b.rows", la.cols, "a.cols", ", this rank's K");
    if (opt.scattered == scattered::rows)
      require_equal(checks, ta, tb, x.c.cols, "c.cols", lb.cols, "b.cols");
    else
      require_equal(checks, ta, tb, x.c.rows, "c.rows", la.rows, "a.rows");
    return checked_backend<T>(ctx, checks);
  }

  /// This rank's row of the exchange.
  static rs_exchanged row_of(const context& ctx, const rs_args<T>& x, const rs_options& opt) {
    // Pieces split the scattered dimension: their GEMMs' rate depends on the other one.
    const int64_t other =
        opt.scattered == scattered::rows ? op_dims(x.b, opt.transpose_b).cols : op_dims(x.a, opt.transpose_a).rows;
    return {matmul_row_of<rs_op>(ctx, opt, x, ctx.piece_knee(dtype_of<T>(), other)), opt.bf16_transfers};
  }

  /// Step 3: the rules that span ranks, on the exchanged table (element r =
  /// rank r's row); every rank sees the same table, so all throw alike.
  static rs_global global_checks(const context& ctx, const arg_checks& checks, const rs_options& opt,
                                 const std::vector<rs_exchanged>& table) {
    auto fail = [&](const std::string& msg) { throw std::invalid_argument(checks.op() + ": " + msg); };
    const std::string an = op_name("a", opt.transpose_a), bn = op_name("b", opt.transpose_b);
    const rs_exchanged& first = table.front();
    rs_global g;
    g.rows = opt.scattered == scattered::rows;
    std::vector<int64_t> sizes;
    for (size_t r = 0; r < table.size(); ++r) {
      require_agreed(ctx, checks, table, r, &rs_exchanged::a_rows, an + ".rows (M)");
      require_agreed(ctx, checks, table, r, &rs_exchanged::b_cols, bn + ".cols (N)");
      sizes.push_back(g.rows ? table[r].c_rows : table[r].c_cols);
      g.ks.push_back(table[r].a_cols);
      g.knee_units = std::max(g.knee_units, table[r].knee);
    }
    g.m = first.a_rows;
    g.n = first.b_cols;
    g.layout = shard_layout(sizes);
    const int64_t want = g.rows ? g.m : g.n;
    if (g.layout.total() != want)
      fail(std::string(g.rows ? "the sum of c.rows over ranks (" : "the sum of c.cols over ranks (") +
           std::to_string(g.layout.total()) + ") must equal " + (g.rows ? an + ".rows (M = " : bn + ".cols (N = ") +
           std::to_string(want) + ")");
    return g;
  }

  /// The type partial sums travel and are summed in: bf16 products' in fp32,
  /// unless a ring may send bf16 (MPI cannot sum bf16, so bulk reduces in fp32).
  static dtype acc_type(dtype t, const rs_options& opt, overlap::strategy s) {
    const dtype wide = t == dtype::bf16 ? dtype::f32 : t;
    return s == strategy::bulk || !opt.bf16_transfers ? wide : t;
  }

  /// Step 4: the schedule, as asked or as the cost model chooses (the same on
  /// every rank: it depends on the exchanged table and one calibration).
  static schedule choose(context& ctx, const rs_args<T>& x, const rs_options& opt, const rs_global& g) {
    const int R = ctx.size();
    const dtype t = dtype_of<T>();
    // Chunks split the scattered dimension; the choice depends on global sizes only.
    auto chunks_for = [&](int lanes) {
      const int64_t acc = static_cast<int64_t>(size_of(acc_type(t, opt, strategy::ring)));
      chunk_request r;
      r.configured = ctx.config().rs_chunks, r.rule = rs_chunk_rule, r.ranks = R, r.lanes = lanes;
      r.piece_units = g.layout.total() / R / lanes, r.bytes_per_unit = (g.rows ? g.n : g.m) * acc;
      r.one_node = ctx.one_node(), r.knee_units = g.knee_units;
      return plan_chunks(r);
    };
    // Hierarchical: pieces of a shard go round the node one step behind each
    // other, so that each one's accumulator has a step to arrive (>= 2 pieces).
    const int configured = ctx.config().rs_chunks;
    schedule_request req = request_of<rs_op>(opt);
    // The other-operands algorithm gathers B (rows) or A (columns) in pieces of
    // its free dimension, N or M, the same on every rank: as configured, else
    // the model's count, else one (without the model nothing says whether a
    // piece's products hide the next piece's transfer, and thin pieces cost
    // GEMM rate).
    const int64_t free = g.rows ? g.n : g.m;
    req.others_pieces = others_piece_counts<rs_op>(ctx.config(), free);
    req.others_rule = req.others_pieces.front();
    req.hierarchical_chunks = configured > 0 ? configured : 2;
    return choose_schedule(ctx, req, t, chunks_for,
                           [&](const schedule& s) { return priced<rs_op>(build_site::dry(ctx), x, opt, g, s); });
  }

  /// A plan of matmul_reduce_scatter as the cost model prices it (`priced`,
  /// ops/pipeline.hpp): its ring steps, others plan, or GEMMs and collective.
  static work work_of(const rs_plan<T>& p, const build_site& at) {
    const auto acc = static_cast<int64_t>(size_of(p.acc));
    if (p.algorithm == algorithm::others) return others_work(p.others, at.rank());
    if (p.strategy != strategy::bulk) return ring_plan_work(p, acc, true);
    work w;
    for (const gemm_desc& d : p.bulk_descs) w.gemms.push_back({d.m, d.n, d.k});
    w.reduce_scatter_block = double(*std::max_element(p.counts.begin(), p.counts.end())) * double(acc);
    return w;
  }

  // The plans.

  /// The bulk plan: one product in blocks laid out as MPI_Reduce_scatter wants
  /// them (by rows that is C itself; by columns, each rank's column block
  /// contiguous), the reduce-scatter, and a pass over c.
  static void build_bulk(const build_site& at, rs_plan<T>& plan, const rs_args<T>& x, const rs_options& opt) {
    const int R = at.size();
    const dtype t = dtype_of<T>(), acc = plan.acc;
    plan.product_ws = at.buffer<std::byte>(static_cast<size_t>(plan.whole.m * plan.whole.n) * size_of(acc));
    plan.counts.resize(static_cast<size_t>(R));
    for (int r = 0; r < R; ++r) {
      const auto [rows, cols] = block_of(plan, r);
      plan.counts[static_cast<size_t>(r)] = mpi::detail::to_count(rows.len * cols.len, "reduce-scatter count");
      if (!plan.whole.rows || r == 0) {
        const int64_t nr = plan.whole.rows ? plan.whole.m : rows.len, nc = plan.whole.rows ? plan.whole.n : cols.len;
        plan.bulk_descs.push_back(gemm(x, opt, acc, {nr, nc}, nc, {}));
        plan.bulk_kernels.push_back(at.kernel(plan.bulk_descs.back()));
      }
    }
    // The reduced block lands in c when c is dense and of the accumulator's
    // type; otherwise in result_ws, and the finishing pass adds it into c.
    const bool via_ws = x.c.ld != x.c.cols || acc != t;
    if (via_ws) plan.result_ws = at.buffer<std::byte>(static_cast<size_t>(x.c.rows * x.c.cols) * size_of(acc));
    plan.finish = finishing_pass(x.c.rows, x.c.cols, x.c.ld, t, static_cast<bool>(opt.epilogue.bias),
                                 opt.epilogue.activation, via_ws, x.c.cols, acc);
  }

  /// The GEMM of an nr x nc output piece (ld of its destination) with all of K.
  static gemm_desc gemm(const rs_args<T>& x, const rs_options& opt, dtype acc, dims2 piece, int64_t ld,
                        const rs_piece_output& how) {
    const int64_t nr = piece.rows, nc = piece.cols;
    gemm_desc d;
    d.m = nr, d.n = nc, d.k = op_dims(x.a, opt.transpose_a).cols;
    d.lda = x.a.ld, d.ldb = x.b.ld, d.ldc = ld;
    d.trans_a = opt.transpose_a, d.trans_b = opt.transpose_b;
    d.accumulate = how.accumulate;
    d.in = dtype_of<T>();
    d.out = how.last ? dtype_of<T>() : acc;
    if (how.add_slot) d.addend = true, d.ld_addend = nc, d.addend_type = acc;
    if (how.last) d.bias = static_cast<bool>(opt.epilogue.bias), d.act = opt.epilogue.activation;
    return d;
  }

  /// Output shard `shard` as row and column ranges of C.
  static std::pair<range, range> block_of(const rs_plan<T>& plan, int shard) {
    range rows{0, plan.whole.m}, cols{0, plan.whole.n};
    (plan.whole.rows ? rows : cols) = range{plan.whole.layout.offset(shard), plan.whole.layout.size(shard)};
    return {rows, cols};
  }

  /// The ring plan (positions on the context's ring: p + i is ring_at(i)).
  /// Lane 0: at step t = i * chunks + j this rank adds its
  /// partial product for chunk j of the output shard of p + i + 1 to the
  /// accumulator that came from p + 1 and, at step t + 1, passes it on to
  /// p - 1. After R rounds the accumulator of its own shard has visited every
  /// rank and lands in c. With two lanes (bidirectional) each shard is halved
  /// along the scattered dimension and lane 1 runs the second halves the other
  /// way (the shard of p - i - 1, from p - 1 to p + 1). The accumulator a step
  /// needs was computed by its neighbour `chunks` steps earlier and sent one
  /// step later, so receives are posted lead = chunks - 1 steps ahead and sends
  /// may stay in flight as long; 2 * chunks - 1 slots per lane are never
  /// rewritten while in use.
  static void build_ring(const build_site& at, rs_plan<T>& plan, const rs_args<T>& x, const rs_options& opt,
                         int chunks) {
    plan.types = block_types(plan.acc);
    const engine::ring_slots slots =
        build_flat_ring(at, plan, travels::output, chunks,
                        [&](const ring_visit& v, engine::ring_slots& s) { return ring_step(at, plan, x, opt, v, s); });
    send_deadlines(plan);
    finish_ring(at, plan, slots);
  }

  /// Each send's deadline on a flat ring (rs_step::send_due), while slot
  /// offsets are still slot indices: the first later step that writes the
  /// slot it reads, by a product into it or by a receive posted into it
  /// (`lead` steps before the step that needs it); the end of the ring where
  /// none does. The window's bound (t + 1 + send_slack) holds a paced send's
  /// slot longer than that at the ring's end, where the owner's last product
  /// would wait for the last send although it writes no slot.
  static void send_deadlines(rs_plan<T>& plan) {
    const int S = plan.n_steps, lanes = plan.lanes, lead = plan.window.lead;
    // One sweep from the end: first_write[slot] is the earliest deadline any
    // step after t imposes on that slot (O(steps), as plans of thousands of
    // steps are built at scale).
    int64_t slots = 0;
    for (const rs_step& st : plan.steps) slots = std::max(slots, st.in_slot() ? st.slot_offset + 1 : 0);
    std::vector<int> first_write(static_cast<size_t>(slots), S);
    for (int t = S - 1; t >= 0; --t) {
      for (int l = 0; l < lanes; ++l) {
        rs_step& st = plan.steps[static_cast<size_t>(t) * static_cast<size_t>(lanes) + static_cast<size_t>(l)];
        const int due = st.in_slot() ? first_write[static_cast<size_t>(st.slot_offset)] : S;
        st.send_due = st.send && st.in_slot() && due > t + 1 ? due : -1;
      }
      for (int l = 0; l < lanes; ++l) {
        const rs_step& st = plan.step(t, l);
        if (!st.in_slot()) continue;
        int& w = first_write[static_cast<size_t>(st.slot_offset)];
        if (st.recv) w = std::min(w, t - lead);
        if (st.compute && !st.ahead && !st.add_slot) w = std::min(w, t);
      }
    }
  }

  /// The hierarchical plan, the all-gather's (ag_build_hierarchical) run
  /// backwards: S ranks on each of N nodes, R = N * S; this rank is local rank
  /// j of node a (in the order by node). Step t = (r * S + k) * C + h adds
  /// this rank's product for piece h (of C) of the shard of local rank
  /// j + k + 1 of node a + r + 1. Lane 1 runs inside the node (from local rank
  /// j + 1 to j - 1): a piece's accumulator starts at k = 0 and goes round the
  /// node, so that at k = S - 1 it reaches the rank with the shard's local
  /// index holding the node's sum. Lane 0 runs between nodes (from rank j of
  /// node a + 1 to rank j of node a - 1): there, at k = S - 1 of round r > 0,
  /// the sum the next node finished a round earlier is added too, and the
  /// result goes on to node a - 1, until at round N - 1 the shard is this
  /// rank's own and the sum lands in c. Each node link carries R - S
  /// accumulators per rank instead of the flat ring's R - 1. Lane 1 has C - 1
  /// steps to deliver (so C >= 2 overlaps it), lane 0 a round (S * C - 1
  /// steps): receives are posted that far ahead and sends may stay in flight
  /// as long, in 2 S C - 1 slots per lane. Both lanes' entries of a step
  /// describe the same piece; lane 1's computes, lane 0's receives the other
  /// node's sum (added before the product) and forwards lane 1's accumulator.
  static void build_hierarchical(const build_site& site, rs_plan<T>& plan, const rs_args<T>& x, const rs_options& opt,
                                 int chunks) {
    plan.types = block_types(plan.acc);
    const engine::ring_slots slots = build_two_level_ring(
        site, plan, travels::output, chunks, lane_slots::own,
        [&](const node_visit& v, engine::ring_slots& s) { two_level_step(site, plan, x, opt, v, s); });
    finish_ring(site, plan, slots);
  }

  /// Both lanes' entries of step v of the two-level ring (build_hierarchical).
  static void two_level_step(const build_site& site, rs_plan<T>& plan, const rs_args<T>& x, const rs_options& opt,
                             const node_visit& v, engine::ring_slots& slots) {
    const int S = site.node_slots(), N = site.size() / S, t = v.step, r = v.node, k = v.local;
    rs_piece at;
    at.shard = v.shard;
    at.chunk = v.chunk, at.chunks = v.chunks;
    at.first = v.first, at.last = v.last;
    at.slot = t % slots.per_lane * 2 + 1;
    rs_step inside = piece_step(site, plan, x, opt, at, slots);
    inside.send = inside.send && k < S - 1;
    rs_step between;
    between.r0 = inside.r0, between.nr = inside.nr, between.c0 = inside.c0, between.nc = inside.nc;
    between.compute = false;
    between.ld = inside.nc;
    between.slot_offset = int64_t{t % slots.per_lane} * 2;
    slots.elems = std::max(slots.elems, between.nr * between.nc);  // lane 1's may be in c, this one's never
    between.recv = inside.nonempty() && k == S - 1 && r > 0;
    between.send = inside.nonempty() && k == S - 1 && r < N - 1;
    // The other node's sum into this node's: accumulator += slot (no product).
    between.merge = gemm_desc::shape(inside.nr, inside.nc, 0).strides(0, 0, inside.ld).types(plan.acc, plan.acc);
    between.merge.accumulate = true, between.merge.addend = true;
    between.merge.ld_addend = between.ld, between.merge.addend_type = plan.acc;
    plan.steps.push_back(std::move(between));
    plan.steps.push_back(std::move(inside));
  }

  /// The ring step of visit `v` (docs in build_ring).
  static rs_step ring_step(const build_site& site, rs_plan<T>& plan, const rs_args<T>& x, const rs_options& opt,
                           const ring_visit& v, engine::ring_slots& slots) {
    const ring_position& at = v.pos;
    rs_piece piece;
    piece.shard = v.shard;
    piece.part = at.lane, piece.parts = at.lanes, piece.chunk = at.chunk, piece.chunks = at.chunks;
    piece.first = v.first, piece.last = v.last;
    piece.slot = static_cast<int>(at.slot(slots));
    piece.flat = true;
    return piece_step(site, plan, x, opt, piece, slots);
  }

  /// A step computing piece `at`: this rank's partial product for it, added
  /// to the accumulator that arrived (unless first), forwarded (unless last).
  static rs_step piece_step(const build_site& site, rs_plan<T>& plan, const rs_args<T>& x, const rs_options& opt,
                            const rs_piece& at, engine::ring_slots& slots) {
    auto [rows, cols] = block_of(plan, at.shard);
    range& chunked = plan.whole.rows ? rows : cols;
    chunked = chunked.chunk(at.parts, at.part).chunk(at.chunks, at.chunk);
    rs_step st;
    st.r0 = rows.begin, st.nr = rows.len, st.c0 = cols.begin, st.nc = cols.len;
    st.dst_c = at.last;
    // The last accumulator arrives in c itself where its place there is one
    // contiguous block of the accumulators' type. Otherwise (a bf16 product's
    // fp32 sums, a strided block of c, a batch) it arrives in a slot and is
    // added while c is written: Open MPI 4.1's TCP path corrupts large messages
    // sent from contiguous memory into a strided receive type (docs/design.md,
    // "Transfers land in contiguous blocks").
    const bool c_block = plan.batch.count == 1 && (st.nr <= 1 || x.c.ld == st.nc);
    st.ahead = st.dst_c && at.flat && !at.first && plan.acc == dtype_of<T>() && c_block && st.nonempty();
    st.acc_in_c = st.dst_c && plan.acc == dtype_of<T>() && c_block && !st.ahead;
    // c = product + slot in the GEMM only where c's block is dense: oneDNN 2.6
    // runs that post-op against a strided c in its reference kernel (hundreds
    // of times slower); there the GEMM sums into the slot and a pass writes c.
    st.add_slot = st.dst_c && !st.acc_in_c && !at.first && c_block && !st.ahead;
    st.finish = st.dst_c && !c_block;
    if (st.acc_in_c) {
      st.ld = x.c.ld;
    } else {
      st.ld = st.nc;
      st.slot_offset = at.slot;  // scaled to bytes later
      slots.elems = std::max(slots.elems, st.nr * st.nc);
    }
    st.recv = st.nonempty() && !at.first;
    st.send = st.nonempty() && !at.last;
    const bool into_c = st.dst_c && !st.finish;
    // Ahead: c = the product alone (no epilogue); add_arrived finishes it.
    st.desc = gemm(x, opt, plan.acc, {st.nr, st.nc}, into_c ? x.c.ld : st.ld,
                   {!at.first && !st.add_slot && !st.ahead, into_c && !st.ahead, st.add_slot});
    // Pieces of a row-scattered output read all of b (a batch's members read different b's).
    st.desc.pack_b = plan.whole.rows && plan.batch.count == 1;
    st.kernel = site.step_kernel(st.desc);
    return st;
  }

  /// Completes a ring plan (finish_ring): slots hold accumulators, and a
  /// slot holds every batch member's, one after the other.
  static void finish_ring(const build_site& at, rs_plan<T>& plan, const engine::ring_slots& slots) {
    detail::finish_ring(at, plan, slots, static_cast<int64_t>(size_of(plan.acc)),
                        [](const rs_step& st) { return st.nr * st.nc; });
  }

  // The inputs' plans (algorithm::others).

  /// algorithm::others for matmul_reduce_scatter: instead of partial sums of
  /// the whole output, the inputs travel (rs_others_inputs), and this rank
  /// computes its block of c itself in two terms. First its own K_p, from its
  /// own operands, while the collectives move the peers' blocks; then the
  /// peers' K, one GEMM over all of it per piece of the gathered operand, once
  /// the piece arrived: rows, c[:, piece] += op(A)[my rows, peers' K] @
  /// op(B)[peers' K, piece]; columns, c[piece, :] += op(A)[piece, peers' K] @
  /// op(B)[peers' K, my cols]. Two passes over c, not one per peer (bf16: the
  /// first term in fp32, added while the second writes c). `g.ks[q]`: rank q's K_q.
  static void build_others(const build_site& at, rs_plan<T>& plan, const rs_args<T>& x, const rs_options& opt,
                           const rs_global& g, int pieces) {
    const std::vector<int64_t>& ks = g.ks;
    others_plan<T>& o = plan.others;
    const int R = at.size(), p = at.rank();
    pieces = std::max(pieces, 1);
    others_inputs(at, plan, o, opt, ks, pieces);
    const bool fp32_sum = dtype_of<T>() == dtype::bf16 && R > 1;
    o.out = fp32_sum ? dtype::f32 : dtype_of<T>();
    others_own(at, plan, o, x, opt, ks[static_cast<size_t>(p)], R == 1);
    std::vector<int64_t> peers(static_cast<size_t>(R - 1));  // the peers' K_q in the order their blocks lie
    for (int i = 1; i < R; ++i) peers[static_cast<size_t>(i - 1)] = ks[static_cast<size_t>((p + i) % R)];
    if (R > 1) others_peers(at, plan, o, x, opt, peers, pieces);
    const int64_t own = plan.whole.layout.size(p);
    o.output = others_output::local;
    others_allocate(at, o, fp32_sum ? (plan.whole.rows ? own * plan.whole.n : plan.whole.m * own) : 0);
  }

  /// The inputs of rs_others_build. Rows: the rows of every peer's A that meet
  /// this rank's output rows are exchanged (MPI_Ialltoallv), every peer's B is
  /// gathered in `pieces` column pieces (one MPI_Iallgatherv each); columns: B's
  /// columns exchanged, A gathered in row pieces. Received blocks lie in ring
  /// order from rank p + 1 on, this rank's own last, so that the peers' blocks
  /// are one run.
  static void others_inputs(const build_site& at, const rs_plan<T>& plan, others_plan<T>& o, const rs_options& opt,
                            const std::vector<int64_t>& ks, int pieces) {
    const int R = at.size(), p = at.rank(), next = (p + 1) % R;
    const bool ta = opt.transpose_a, tb = opt.transpose_b;
    const shard_layout& sh = plan.whole.layout;
    const int64_t kp = ks[static_cast<size_t>(p)], own = sh.size(p),
                  free = plan.whole.rows ? plan.whole.n : plan.whole.m;
    others_traffic t;
    for (int q = 0; q < R; ++q) t.sent.push_back(sh.size(q) * kp), t.got.push_back(own * ks[static_cast<size_t>(q)]);
    others_exchange(o, t, next, [&](int q, int64_t to) {
      const range block{sh.offset(q), sh.size(q)};
      return plan.whole.rows ? stored_block(others_src::caller_a, ta, block, {0, kp}, to)
                             : stored_block(others_src::caller_b, tb, {0, kp}, block, to);
    });
    others_gathers(
        o, pieces,
        [&](int j) {
          std::vector<int64_t> counts(ks.size());
          for (size_t q = 0; q < ks.size(); ++q) counts[q] = ks[q] * others_piece(free, j, pieces).len;
          return others_counts(counts, next);
        },
        [&](int j, const others_gather& ga) {
          const int64_t to = ga.base + ga.at.displs[static_cast<size_t>(p)];
          const range pc = others_piece(free, j, pieces);
          return plan.whole.rows ? stored_block(others_src::caller_b, tb, {0, kp}, pc, to)
                                 : stored_block(others_src::caller_a, ta, pc, {0, kp}, to);
        });
  }

  /// One operand of the peers' K made of their received blocks (one per K_q
  /// of `ks`, one after the other from element `at` of `from`, each `extent` x
  /// K_q in op's terms): where K runs down the stored blocks they already form
  /// one dense matrix; where it runs across (`k_across`) g assembles them side
  /// by side at element `to` of the assembled buffer (`blocks`, the copies
  /// its GEMM makes before it runs).
  static rs_operand assemble(std::vector<others_concat>& blocks, others_src from, int64_t at,
                             const std::vector<int64_t>& ks, int64_t extent, bool k_across, int64_t to) {
    if (!k_across) return {from, at, packed_ld(extent)};
    const int64_t k = std::accumulate(ks.begin(), ks.end(), int64_t{0});
    int64_t col = 0;
    for (int64_t kq : ks) {
      blocks.push_back({from, at, extent, kq, to + col, k});
      at += extent * kq, col += kq;
    }
    return {others_src::assembled, to, packed_ld(k)};
  }

  /// rs_others_build's first term: this rank's own K_p from the caller's
  /// operands, its rows of op(A_p) and all of op(B_p), or all of op(A_p) and
  /// its columns of op(B_p); into c, or (bf16) into fp32 products.
  static void others_own(const build_site& site, const rs_plan<T>& plan, others_plan<T>& o, const rs_args<T>& x,
                         const rs_options& opt, int64_t kp, bool last) {
    const int p = site.rank();
    const bool ta = opt.transpose_a, tb = opt.transpose_b, fp32_sum = o.out != dtype_of<T>();
    const int64_t own = plan.whole.layout.size(p), at = plan.whole.layout.offset(p);
    const int64_t m = plan.whole.rows ? own : plan.whole.m, n = plan.whole.rows ? plan.whole.n : own;
    others_gemm g;
    g.peer = p;
    g.a = others_src::caller_a, g.b = others_src::caller_b;
    if (plan.whole.rows) g.a_off = ta ? at : at * x.a.ld;
    if (!plan.whole.rows) g.b_off = tb ? at * x.b.ld : at;
    g.to_c = !fp32_sum;
    g.desc = gemm_desc::shape(m, n, kp)
                 .strides(x.a.ld, x.b.ld, fp32_sum ? n : x.c.ld)
                 .transposed(ta, tb)
                 .types(dtype_of<T>(), o.out);
    if (last) others_epilogue(g, opt);
    g.kernel = site.kernel(g.desc);
    o.gemms.push_back(std::move(g));
  }

  /// rs_others_build's second term: the peers' K (`peers`: their K_q in the
  /// order their blocks lie), one GEMM per piece of the gathered operand,
  /// added to the first term. K runs across a stored block of op(A) unless A
  /// is stored transposed, and across one of op(B) when B is. The assembled
  /// buffer: the exchanged operand (own x K, assembled before the first
  /// piece's GEMM), then each piece of the gathered one (len x K).
  static void others_peers(const build_site& site, const rs_plan<T>& plan, others_plan<T>& o, const rs_args<T>& x,
                           const rs_options& opt, const std::vector<int64_t>& peers, int pieces) {
    const int p = site.rank();
    const bool ta = opt.transpose_a, tb = opt.transpose_b, fp32_sum = o.out != dtype_of<T>();
    const int64_t own = plan.whole.layout.size(p), free = plan.whole.rows ? plan.whole.n : plan.whole.m,
                  n = plan.whole.rows ? plan.whole.n : own;
    const int64_t k = std::accumulate(peers.begin(), peers.end(), int64_t{0});
    const bool ex_across = plan.whole.rows ? !ta : tb, ga_across = plan.whole.rows ? tb : !ta;
    std::vector<others_concat> exchanged;
    const rs_operand ex = assemble(exchanged, others_src::exchanged, 0, peers, own, ex_across, 0);
    int64_t to = ex_across ? own * k : 0;
    for (int j = 0; j < pieces; ++j) {
      const range pc = others_piece(free, j, pieces);
      others_gemm g;
      if (j == 0) g.assemble = exchanged;
      g.peer = p;
      g.inputs = j;  // the exchange (with piece 0) and piece j
      g.to_c = true;
      const rs_operand ga = assemble(g.assemble, others_src::gathered, o.gathers[static_cast<size_t>(j)].base, peers,
                                     pc.len, ga_across, to);
      if (ga_across) to += pc.len * k;
      const rs_operand& a = plan.whole.rows ? ex : ga;
      const rs_operand& b = plan.whole.rows ? ga : ex;
      g.a = a.src, g.a_off = a.off, g.b = b.src, g.b_off = b.off;
      g.out = plan.whole.rows ? pc.begin : pc.begin * x.c.ld;
      g.bias_off = plan.whole.rows ? pc.begin : 0;
      g.desc = gemm_desc::shape(plan.whole.rows ? own : pc.len, plan.whole.rows ? pc.len : own, k)
                   .strides(a.ld, b.ld, x.c.ld)
                   .transposed(ta, tb)
                   .types(dtype_of<T>(), dtype_of<T>())
                   .accumulating(!fp32_sum);
      if (fp32_sum) {
        g.addend = true, g.addend_off = plan.whole.rows ? pc.begin : pc.begin * n;
        g.desc.addend = true, g.desc.ld_addend = n, g.desc.addend_type = dtype::f32;
      }
      others_epilogue(g, opt);
      g.kernel = site.kernel(g.desc);
      o.gemms.push_back(std::move(g));
    }
  }

  /// The epilogue of the last GEMM of rs_others_build's sum.
  static void others_epilogue(others_gemm& g, const rs_options& opt) {
    g.desc.bias = static_cast<bool>(opt.epilogue.bias), g.desc.act = opt.epilogue.activation;
  }

  // Running.

  /// The bulk run: one GEMM, the reduce-scatter, and a pass over c.
  static void bulk(context& ctx, rs_plan<T>& plan, const rs_args<T>& x, const rs_options& opt, const T* bias) {
    std::byte* ws = plan.product_ws.data();
    const auto acc_size = static_cast<int64_t>(size_of(plan.acc));
    run_local_step(ctx, plan, [&] {
      if (plan.whole.rows) {
        plan.bulk_kernels[0]->run(gemm_operands().a(x.a.data).b(x.b.data).c(ws));
      } else {
        for (int r = 0; r < ctx.size(); ++r) {
          const int64_t off = plan.whole.layout.offset(r);
          const T* b = x.b.data + (opt.transpose_b ? off * x.b.ld : off);
          plan.bulk_kernels[static_cast<size_t>(r)]->run(
              gemm_operands().a(x.a.data).b(b).c(ws + plan.whole.m * off * acc_size));
        }
      }
    });
    const bool via_ws = plan.finish.addend;
    void* dst = mpi::any_buffer(via_ws ? static_cast<void*>(plan.result_ws.data()) : static_cast<void*>(x.c.data));
    const MPI_Datatype type = mpi_type_of(plan.acc);
    // Timing only under SMPI (shared workspaces of garbage): the collective's
    // ring pattern, its sums charged, not SimGrid's MPI_Reduce_scatter,
    // which allocates every rank's whole input (mpi/timing_only.hpp).
    const bool pattern_only = mpi::timing_only_buffers();
    const mpi::ring_blocks pattern{ws, plan.counts.data(), type, engine::tag_value(engine::message_tag::timing_ring)};
    run_collective(
        ctx, plan, "MPI_Reduce_scatter",
        [&] {
          return pattern_only ? mpi::timing_reduce_scatter(pattern, ctx.comm())
                              : MPI_Reduce_scatter(ws, dst, plan.counts.data(), type, MPI_SUM, ctx.comm());
        },
        [&](MPI_Request* r) {
          if (!pattern_only) return MPI_Ireduce_scatter(ws, dst, plan.counts.data(), type, MPI_SUM, ctx.comm(), r);
          *r = MPI_REQUEST_NULL;  // done before the watchdog waits
          return mpi::timing_reduce_scatter(pattern, ctx.comm());
        });
    // c = act(reduced + bias) (the pass also converts an fp32 result to bf16).
    run_local_step(ctx, plan, [&] {
      run_degenerate(plan.finish, gemm_operands().c(x.c.data).bias(bias).addend(plan.result_ws.data()));
    });
  }

  static rs_args<T> member(const rs_args<T>& x, const overlap::batch& b, int64_t m) {
    return {detail::member(x.a, b.a, m), detail::member(x.b, b.b, m), detail::member(x.c, b.c, m)};
  }
};

/// How write_block treats what c's block holds: replaced by the sums, or
/// added to them (an ahead step's product in c, rs_step::ahead).
enum class block_write { replace, add };

/// c (nr x nc, ldc) = act(s + bias), or act(c + s + bias) with
/// block_write::add: the sums s (dense, the accumulators' type A) written to
/// their strided place in c, in T's wide type. Charged, not made, in SMPI's
/// timing-only runs (mpi::timing_only_buffers: c and s are shared garbage; at
/// 1024 ranks, tp 8, these passes over 256 MiB blocks took most of a
/// reduce-scatter's simulation).
template <class T, class A>
void write_block(T* c, int64_t ldc, const A* s, int64_t nr, int64_t nc, const T* bias, activation act,
                 block_write how = block_write::replace) {
  if (mpi::timing_only_buffers()) return mpi::charge_add(static_cast<long long>(nr) * nc, static_cast<int>(sizeof(A)));
  using wide = std::conditional_t<std::is_same_v<T, double>, double, float>;
  for (int64_t i = 0; i < nr; ++i)
    for (int64_t j = 0; j < nc; ++j) {
      auto v = static_cast<wide>(s[i * nc + j]);
      if (how == block_write::add) v += static_cast<wide>(c[i * ldc + j]);
      if (bias != nullptr) v += static_cast<wide>(bias[j]);
      if (act != activation::none) v = static_cast<wide>(activate(v, act));
      c[i * ldc + j] = T(v);
    }
}

/// The ring pattern of matmul_reduce_scatter, for engine::run_ring: a
/// step's accumulator is sent at the next step, once computed.
template <class T>
class rs_ring_pattern : public ring_pattern<rs_ring_pattern<T>, rs_plan<T>> {
  using base = ring_pattern<rs_ring_pattern<T>, rs_plan<T>>;
  using base::plan_;

 public:
  rs_ring_pattern(rs_plan<T>& plan, const rs_args<T>& x, const rs_options& opt, const T* bias, int rank)
      : base(plan),
        x_(x),
        opt_(opt),
        bias_(bias),
        own_(plan.whole.layout.offset(rank)),
        two_levels_(plan.strategy == strategy::hierarchical) {}
  /// A step's accumulator; an ahead step's is needed only at the next step
  /// (or after the ring, for the last), which adds it (add_arrived).
  [[nodiscard]] engine::transfer recv(int t, int lane) const {
    engine::transfer in = base::recv(t, lane);
    if (plan_.step(t, lane).ahead) in.due = t + 1;  // the last step's: its due is past the steps, the final wait
    return in;
  }
  [[nodiscard]] engine::transfer send(int t, int lane) const {
    if (t == 0) return {};
    const rs_step& st = plan_.step(t - 1, lane);
    if (!st.send) return {};
    // Hierarchical: both lanes forward the accumulator lane 1's entry computed.
    engine::transfer out = this->transfer_of(st, two_levels_ ? plan_.step(t - 1, 1) : st);
    out.due = st.send_due;
    return out;
  }
  void compute(int t) {
    if (t > 0) add_arrived(t - 1);
    for (int l = 0; l < plan_.lanes; ++l) {
      const rs_step& st = plan_.step(t, l);
      for (int64_t m = 0; m < plan_.batch.count; ++m) {
        if (two_levels_ && st.recv && !st.compute)  // the next node's sum, into this node's
          run_degenerate(st.merge, gemm_operands().c(piece(plan_.step(t, 1), m)).addend(piece(st, m)));
        if (st.compute) compute(st, m);
      }
    }
  }

  /// Whether the last step has an accumulator that arrives after the ring (an ahead step).
  [[nodiscard]] bool work_after_ring() const {
    for (int l = 0; l < plan_.lanes; ++l)
      if (plan_.step(plan_.n_steps - 1, l).ahead) return true;
    return false;
  }
  /// After the ring: the last step's accumulators, arrived (ahead steps).
  void after_ring() { add_arrived(plan_.n_steps - 1); }

  /// The step's accumulator of batch member m (0 for the transfers: a
  /// step's datatype reaches the others): in c, or in its slot.
  [[nodiscard]] void* piece(const rs_step& st, int64_t m = 0) const {
    const auto member_bytes = static_cast<int64_t>(size_of(plan_.acc)) * st.nr * st.nc;
    return st.acc_in_c ? static_cast<void*>(in_c(st, m))
                       : static_cast<void*>(plan_.slots.data() + st.slot_offset + m * member_bytes);
  }

 private:
  /// Batch member m's product of the step's piece.
  void compute(const rs_step& st, int64_t m) {
    // Rows r0.. of op(a) and columns c0.. of op(b), wherever transposes put them.
    const T* a = x_.a.data + m * plan_.batch.a + (opt_.transpose_a ? st.r0 : st.r0 * x_.a.ld);
    const T* b = x_.b.data + m * plan_.batch.b + (opt_.transpose_b ? st.c0 * x_.b.ld : st.c0);
    const T* bias = bias_ == nullptr ? nullptr : bias_ + (plan_.whole.rows ? st.c0 : st.c0 - own_);
    void* dst = st.dst_c && !st.finish ? static_cast<void*>(in_c(st, m)) : piece(st, m);
    gemm_operands io;
    io.a(a).b(st.desc.pack_b ? plan_.pack.b(b) : b).c(dst).bias(bias);
    st.kernel->run(io.addend(st.add_slot ? piece(st, m) : nullptr));
    if (!st.finish) return;
    const activation act = opt_.epilogue.activation;
    if (plan_.acc == dtype_of<T>())
      write_block(in_c(st, m), x_.c.ld, static_cast<const T*>(piece(st, m)), st.nr, st.nc, bias, act);
    else
      write_block(in_c(st, m), x_.c.ld, static_cast<const float*>(piece(st, m)), st.nr, st.nc, bias, act);
  }

  /// Step t's ahead entries, whose accumulators have arrived (their receive
  /// was due before step t + 1): c = act(product + accumulator + bias).
  void add_arrived(int t) {
    for (int l = 0; l < plan_.lanes; ++l) {
      const rs_step& st = plan_.step(t, l);
      if (!st.ahead) continue;
      const T* bias = bias_ == nullptr ? nullptr : bias_ + (plan_.whole.rows ? st.c0 : st.c0 - own_);
      write_block(in_c(st, 0), x_.c.ld, static_cast<const T*>(piece(st, 0)), st.nr, st.nc, bias,
                  opt_.epilogue.activation, block_write::add);
    }
  }

  [[nodiscard]] T* in_c(const rs_step& st, int64_t m) const {
    T* c = x_.c.data + m * plan_.batch.c;
    return plan_.whole.rows ? c + (st.r0 - own_) * x_.c.ld + st.c0 : c + st.r0 * x_.c.ld + (st.c0 - own_);
  }
  const rs_args<T>& x_;
  const rs_options& opt_;
  const T* bias_;
  int64_t own_;      ///< where this rank's output shard starts in C
  bool two_levels_;  ///< the hierarchical schedule
};

}  // namespace detail
}  // namespace overlap
