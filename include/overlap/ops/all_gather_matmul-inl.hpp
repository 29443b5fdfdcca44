#pragma once
/// @file
/// The implementation of all_gather_matmul (its plans, their building and
/// running): part of the header-only flavour, compiled once into the library
/// otherwise (flavour.hpp).

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "overlap/core/matrix.hpp"
#include "overlap/engine/buffer.hpp"
#include "overlap/engine/ring.hpp"
#include "overlap/ops/accumulate.hpp"
#include "overlap/ops/all_gather_matmul.hpp"
#include "overlap/ops/block_types.hpp"
#include "overlap/ops/call_agreement.hpp"
#include "overlap/ops/checks.hpp"
#include "overlap/ops/choose.hpp"
#include "overlap/ops/geometry.hpp"
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

/// Where the gathered operand X sits in the product and how it is split.
/// "Logical" is op(X); "stored" is X as the caller keeps it (transposed or not).
struct ag_geometry {
  bool lhs = true;                 ///< X is the left operand A (else the right operand B)
  bool shard_rows = true;          ///< op(X) is sharded along its rows (else its columns)
  bool contracting = false;        ///< the sharded dimension is K: partial products accumulate
  bool trans_x = false;            ///< X is stored transposed
  bool trans_o = false;            ///< the other operand is stored transposed
  int64_t x_rows = 0, x_cols = 0;  ///< logical op(X)
  shard_layout layout;             ///< op(X)'s sharded dimension over the ranks

  explicit ag_geometry(const ag_options& o)
      : lhs(o.gathered == gathered::lhs_rows || o.gathered == gathered::lhs_cols),
        shard_rows(o.gathered == gathered::lhs_rows || o.gathered == gathered::rhs_rows),
        contracting(o.gathered == gathered::lhs_cols || o.gathered == gathered::rhs_rows),
        trans_x(lhs ? o.transpose_a : o.transpose_b),
        trans_o(lhs ? o.transpose_b : o.transpose_a) {}
  ag_geometry() = default;

  [[nodiscard]] int64_t stored_rows() const { return trans_x ? x_cols : x_rows; }
  [[nodiscard]] int64_t stored_cols() const { return trans_x ? x_rows : x_cols; }
  [[nodiscard]] bool stored_shard_rows() const { return shard_rows != trans_x; }
  /// Chunks split op(X)'s output dimension: rows of A, or columns of B.
  [[nodiscard]] bool stored_chunk_rows() const { return lhs != trans_x; }
};

/// The view holding this rank's shard of X.
template <class T>
const matrix_view<const T>& local_view(const ag_args<T>& x, const ag_geometry& g) {
  return g.lhs ? x.a : x.b;
}

/// Where a ring piece lives on this rank.
enum class piece_home { local, gathered_out, slot };

/// A ring step's piece of stored X, where it lives, and how its product
/// enters the output.
struct ag_step : ring_step {
  int64_t lr0 = 0, lc0 = 0;  ///< the piece's origin in op(X)
  piece_home home = piece_home::slot;
  bool into_acc = false;  ///< writes the fp32 accumulator (bf16 products)
  bool add_acc = false;   ///< adds the fp32 accumulator into c (its last step)
  bool copy_out = false;  ///< received into a slot, copied to gathered_out when computed
  [[nodiscard]] bool in_slot() const noexcept { return home == piece_home::slot; }
};

/// What the exchanged table says about the whole problem.
struct ag_global {
  ag_geometry full;            ///< with the global extents and the shards' layout
  std::vector<int64_t> other;  ///< every rank's extent of the other operand's free dimension
  bool any_out = false;        ///< some rank wants the gathered operand (gathered_out)
  int64_t knee_units = 0;      ///< the largest GEMM rate knee over ranks
};

/// A plan of all_gather_matmul: the shared parts (op_plan), where X sits,
/// and what the bulk schedule and a bf16 contracting ring add.
template <class T>
struct ag_plan final : op_plan<T, ag_step, T> {
  ag_global whole;  ///< the problem, as the exchanged table gives it
  /// Where X sits, with the global extents and the shards' layout.
  [[nodiscard]] const ag_geometry& geo() const noexcept { return whole.full; }
  /// bf16 with a contracting shard: partial sums stay in fp32 (c-shaped) and
  /// reach c, rounded once, with the last contribution.
  engine::buffer<float> acc;
  // bulk
  engine::buffer<T> gather_ws, blocks_ws;
  std::vector<int> counts, displs;
  gemm_desc bulk_desc;  ///< the GEMM on the gathered operand
  std::shared_ptr<const gemm_kernel> bulk_kernel;
  bool gather_into_out = false;  ///< bulk gathers straight into the caller's gathered view
  ag_plan() { this->types = block_types(dtype_of<T>()); }
};

/// How a piece's product enters the output.
struct ag_piece_output {
  bool accumulate = false;  ///< C += product (contracting pieces after the first)
  bool last = false;        ///< the output block's last contribution: the epilogue runs
  bool into_acc = false;    ///< to the fp32 accumulator (ld = c.cols) instead of c (bf16 products)
  bool add_acc = false;     ///< c = product + accumulator (a bf16 product's last step)
};

/// The operands of an others plan for all_gather_matmul: where this rank's
/// shard of X and the other operand are read, and their extents.
struct ag_others_ctx {
  int R = 1, p = 0;
  dtype t = dtype::f32;
  bool tx = false, to = false;
  int64_t x_ld = 0;                   ///< ld of this rank's shard of X
  others_src x_src, o_src;            ///< the caller's views holding X and the other operand
  const std::vector<int64_t>& other;  ///< every rank's extent of the other operand's free dimension
  [[nodiscard]] int64_t o(int q) const { return other[static_cast<size_t>(q)]; }
};

/// What each rank contributes when the ranks exchange their calls (on a plan
/// miss anywhere): the options, which must agree (matmul_row::agreed names them), and
/// this rank's sizes. Exchanged as one MPI datatype (exchange_rows).
struct ag_exchanged : matmul_row {
  int64_t has_out, out_rows, out_cols;  ///< gathered_out

  static constexpr std::array<agreed_field<ag_exchanged>, 0> more_agreed{};
};

/// The fields of the exchanged row that the rules across ranks read, for a
/// geometry: the dimension every rank must agree on, the sharded one, and
/// the one the shards must sum to; with their names in messages.
struct ag_fields {
  int64_t ag_exchanged::*agreed;
  int64_t ag_exchanged::*sharded;
  int64_t ag_exchanged::*summed;
  std::string agreed_name, sharded_name, summed_name, symbol;

  ag_fields(const ag_geometry& geo, const ag_options& opt) {
    using e = ag_exchanged;
    const std::string an = op_name("a", opt.transpose_a), bn = op_name("b", opt.transpose_b);
    if (geo.lhs) {
      agreed = geo.shard_rows ? &e::a_cols : &e::a_rows;
      sharded = geo.shard_rows ? &e::a_rows : &e::a_cols;
      agreed_name = geo.shard_rows ? an + ".cols (K)" : an + ".rows (M)";
      sharded_name = geo.shard_rows ? an + ".rows" : an + ".cols";
    } else {
      agreed = geo.shard_rows ? &e::b_cols : &e::b_rows;
      sharded = geo.shard_rows ? &e::b_rows : &e::b_cols;
      agreed_name = geo.shard_rows ? bn + ".cols (N)" : bn + ".rows (K)";
      sharded_name = geo.shard_rows ? bn + ".rows" : bn + ".cols";
    }
    summed = &e::c_rows, summed_name = "c.rows", symbol = "M";
    if (!geo.lhs && !geo.shard_rows) summed = &e::c_cols, summed_name = "c.cols", symbol = "N";
    if (geo.contracting) {
      summed = geo.lhs ? &e::b_rows : &e::a_cols;
      summed_name = geo.lhs ? bn + ".rows" : an + ".cols";
      symbol = "K";
    }
  }
};

template <class T>
class ag_ring_pattern;

/// all_gather_matmul's names and message tags (ops/op_id.hpp).
template <>
struct op_info<op_id::all_gather_matmul> : owns_tags<op_id::all_gather_matmul> {
  static constexpr entry_names names = OVERLAP_ENTRY_NAMES("all_gather_matmul", "ag_options", "gathered", "ag_chunks");
};

/// all_gather_matmul as an op of the shared pipeline (ops/pipeline.hpp):
/// what is its own, from the checks of one rank to the bulk run.
template <class T>
struct ag_op : op_defaults,
               op_names<op_id::all_gather_matmul, &ag_options::gathered, &config::ag_chunks>,
               op_types<T, ag_args<T>, ag_options, ag_plan<T>, ag_exchanged, ag_global, ag_ring_pattern<T>> {
  /// Every plan applies: bulk, the rings, the two-level ring, the other operands.
  static constexpr op_builders<ag_plan<T>, ag_args<T>, ag_options, ag_global> builders() {
    return {&ag_op::build_bulk, &ag_op::build_ring, &ag_op::build_hierarchical, &ag_op::build_others};
  }
  /// gathered_out's leading dimension and batch stride decide the plan too.
  static void append_own_views(plan_key& key, const ag_args<T>& x, const ag_options& o) {
    key.insert(key.end(), {x.out.ld, o.batch.out});
  }
  static void describe(ag_plan<T>& p, const ag_options& /*o*/, const ag_global& g) { p.whole = g; }
  static std::string summary(const ag_plan<T>& p, const ag_global& g) {
    return (p.algorithm == algorithm::others ? std::string(" moving the other operands") : std::string()) +
           ", sharded sizes [" + list(g.full.layout.sizes()) + "], op(X) " + std::to_string(g.full.x_rows) + " x " +
           std::to_string(g.full.x_cols);
  }
  static std::string plan_notes(const ag_plan<T>& p) { return p.acc.size() ? ", fp32 accumulator" : ""; }

  // The checks, the exchange and the choice (ops/pipeline.hpp, prepare).

  /// Step 1 of preparing a call: the checks each rank makes alone (options,
  /// views, aliasing, shapes); returns the backend for the plan key. Messages
  /// are built only for a rule that fails.
  static int local_checks(const context& ctx, arg_checks& checks, const ag_args<T>& x, const ag_options& opt) {
    check_matmul_args<ag_op>(checks, opt, x);
    if (x.has_out) out_checks(checks, x, opt.batch);
    const dims2 la = op_dims(x.a, opt.transpose_a), lb = op_dims(x.b, opt.transpose_b);
    auto must_equal = [&](int64_t v1, const char* n1, int64_t v2, const char* n2, const char* what = "") {
      require_equal(checks, opt.transpose_a, opt.transpose_b, v1, n1, v2, n2, what);
    };
    const bool k_rule = opt.gathered == gathered::lhs_rows || opt.gathered == gathered::rhs_cols;
    if (k_rule) must_equal(lb.rows, "b.rows", la.cols, "a.cols", ", the K dimension");
    if (opt.gathered != gathered::lhs_rows) must_equal(x.c.rows, "c.rows", la.rows, "a.rows");
    if (opt.gathered != gathered::rhs_cols) must_equal(x.c.cols, "c.cols", lb.cols, "b.cols");
    return checked_backend<T>(ctx, checks);
  }

  /// The gathered by-product: a view that aliases nothing, in any batch member.
  static void out_checks(arg_checks& checks, const ag_args<T>& x, const overlap::batch& b) {
    checks.view("gathered_out", x.out);
    checks.disjoint("gathered_out", x.out, "a", x.a);
    checks.disjoint("gathered_out", x.out, "b", x.b);
    checks.disjoint("gathered_out", x.out, "c", x.c);
    checks.disjoint_members("gathered_out", x.out, b.out, "gathered_out", x.out, b.out, b.count);
    checks.disjoint_members("gathered_out", x.out, b.out, "a", x.a, b.a, b.count);
    checks.disjoint_members("gathered_out", x.out, b.out, "b", x.b, b.b, b.count);
    checks.disjoint_members("gathered_out", x.out, b.out, "c", x.c, b.c, b.count);
  }

  /// This rank's row of the exchange.
  static ag_exchanged row_of(const context& ctx, const ag_args<T>& x, const ag_options& opt) {
    const int64_t knee = ctx.piece_knee(dtype_of<T>(), ag_geometry(opt).lhs ? x.c.cols : x.c.rows);
    return {matmul_row_of<ag_op>(ctx, opt, x, knee), x.has_out, x.out.rows, x.out.cols};
  }

  /// Step 3: the rules that span ranks, on the exchanged table (element r =
  /// rank r's row); every rank sees the same table, so all throw alike.
  static ag_global global_checks(const context& ctx, const arg_checks& checks, const ag_options& opt,
                                 const std::vector<ag_exchanged>& table) {
    const ag_geometry geo(opt);
    auto fail = [&](const std::string& msg) { throw std::invalid_argument(checks.op() + ": " + msg); };
    const ag_fields f(geo, opt);
    const ag_exchanged& first = table.front();
    std::vector<int64_t> sizes;
    for (size_t r = 0; r < table.size(); ++r) {
      require_agreed(ctx, checks, table, r, f.agreed, f.agreed_name);
      sizes.push_back(table[r].*f.sharded);
    }
    ag_global g;
    g.full = geo;
    g.full.layout = shard_layout(sizes);
    const int64_t total = g.full.layout.total();
    g.full.x_rows = geo.shard_rows ? total : first.*f.agreed;
    g.full.x_cols = geo.shard_rows ? first.*f.agreed : total;
    for (size_t r = 0; r < table.size(); ++r) {
      const ag_exchanged& row = table[r];
      const std::string on = " on " + ctx.rank_name(static_cast<int>(r));
      if (row.*f.summed != total)
        fail(f.summed_name + " (" + std::to_string(row.*f.summed) + ")" + on + " must equal " + f.symbol +
             " = sum of " + f.sharded_name + " over ranks (" + std::to_string(total) + ")");
      if (row.has_out && (row.out_rows != g.full.stored_rows() || row.out_cols != g.full.stored_cols()))
        fail("gathered_out" + on + " is " + std::to_string(row.out_rows) + " x " + std::to_string(row.out_cols) +
             "; it must be the gathered operand's " + std::to_string(g.full.stored_rows()) + " x " +
             std::to_string(g.full.stored_cols()) + (geo.trans_x ? " (stored transposed)" : ""));
      g.any_out = g.any_out || row.has_out != 0;
      g.other.push_back(geo.lhs ? row.c_cols : row.c_rows);
      g.knee_units = std::max(g.knee_units, row.knee);
    }
    return g;
  }

  /// Step 4: the schedule, as asked or as the cost model chooses (the same on
  /// every rank: it depends on the exchanged table and one calibration).
  static schedule choose(context& ctx, const ag_args<T>& x, const ag_options& opt, const ag_global& g) {
    const int R = ctx.size();
    const ag_geometry& full = g.full;
    // Chunks split op(X)'s output dimension (rows of stored X when
    // stored_chunk_rows); the plan's choice depends on global sizes only.
    auto chunks_for = [&](int lanes) {
      const bool sr = full.stored_shard_rows(), cr = full.stored_chunk_rows();
      const int64_t chunk_extent = (cr ? full.stored_rows() : full.stored_cols()) / (sr == cr ? R : 1) / lanes;
      const int64_t bytes_per_unit =
          (cr ? full.stored_cols() : full.stored_rows()) / (sr == cr ? 1 : R) * static_cast<int64_t>(sizeof(T));
      chunk_request r;
      r.configured = ctx.config().ag_chunks, r.rule = ag_chunk_rule, r.ranks = R, r.lanes = lanes;
      r.piece_units = chunk_extent, r.bytes_per_unit = bytes_per_unit;
      r.one_node = ctx.one_node(), r.knee_units = g.knee_units;
      return plan_chunks(r);
    };
    // The other operands may travel only where no rank wants the gathered
    // operand itself (gathered_out needs it gathered anyway).
    schedule_request req = request_of<ag_op>(opt);
    req.others_allowed = req.others_allowed && !g.any_out;
    if (!full.contracting) {
      const int64_t widest = *std::max_element(g.other.begin(), g.other.end());
      req.others_pieces = others_piece_counts<ag_op>(ctx.config(), widest);
      req.others_rule = others_piece_rule(req.others_pieces, widest);
    }
    return choose_schedule(ctx, req, dtype_of<T>(), chunks_for,
                           [&](const schedule& s) { return priced<ag_op>(build_site::dry(ctx), x, opt, g, s); });
  }

  /// A plan of all_gather_matmul as the cost model prices it (`priced`,
  /// ops/pipeline.hpp): its ring steps, others plan, or collective and GEMM.
  static work work_of(const ag_plan<T>& p, const build_site& at) {
    if (p.algorithm == algorithm::others) return others_work(p.others, at.rank());
    if (p.strategy != strategy::bulk) return ring_plan_work(p, static_cast<int64_t>(sizeof(T)), false);
    work w;
    w.gemms.push_back({p.bulk_desc.m, p.bulk_desc.n, p.bulk_desc.k});
    w.allgather_block = double(*std::max_element(p.counts.begin(), p.counts.end())) * double(sizeof(T));
    return w;
  }

  // The plans.

  /// The bulk plan: one MPI_Allgatherv and one GEMM on the gathered operand.
  static void build_bulk(const build_site& at, ag_plan<T>& plan, const ag_args<T>& x, const ag_options& opt) {
    const ag_geometry& geo = plan.geo();
    const int R = at.size();
    const int64_t srows = geo.stored_rows(), scols = geo.stored_cols();
    const bool sr = geo.stored_shard_rows();
    const int64_t per_unit = sr ? scols : srows;  // elements per stored shard row / column
    plan.counts.resize(static_cast<size_t>(R));
    plan.displs.resize(static_cast<size_t>(R));
    for (int r = 0; r < R; ++r) {
      plan.counts[static_cast<size_t>(r)] = mpi::detail::to_count(geo.layout.size(r) * per_unit, "all-gather count");
      plan.displs[static_cast<size_t>(r)] =
          mpi::detail::to_count(geo.layout.offset(r) * per_unit, "all-gather displacement");
    }
    const auto elems = static_cast<size_t>(srows * scols);
    // Row shards land as contiguous row blocks of X: straight into gathered_out
    // when it is dense, else into gather_ws. Column shards land as blocks in
    // blocks_ws and are unpacked side by side into gathered_out or gather_ws.
    plan.gather_into_out = x.has_out && sr && x.out.ld == scols;
    if (!sr) plan.blocks_ws = at.buffer<T>(elems);
    if (!plan.gather_into_out && (sr || !x.has_out)) plan.gather_ws = at.buffer<T>(elems);
    const int64_t x_ld = x.has_out ? x.out.ld : scols;
    plan.bulk_desc = gemm(geo, x, opt, {geo.x_rows, geo.x_cols}, x_ld, {false, true});
    plan.bulk_kernel = at.kernel(plan.bulk_desc);
  }

  /// The GEMM of one piece of op(X) (lnr x lnc, stored with ld):
  /// lhs: C[lr0:+lnr, :] (+)= op(X piece) @ op(b)[lc0:+lnc, :];
  /// rhs: C[:, lc0:+lnc] (+)= op(a)[:, lr0:+lnr] @ op(X piece).
  static gemm_desc gemm(const ag_geometry& geo, const ag_args<T>& x, const ag_options& opt, dims2 piece, int64_t ld,
                        const ag_piece_output& how) {
    const int64_t lnr = piece.rows, lnc = piece.cols;
    gemm_desc d;
    if (geo.lhs) {
      d.m = lnr, d.n = op_dims(x.b, geo.trans_o).cols, d.k = lnc;
      d.lda = ld, d.ldb = x.b.ld, d.trans_a = geo.trans_x, d.trans_b = geo.trans_o;
    } else {
      d.m = op_dims(x.a, geo.trans_o).rows, d.n = lnc, d.k = lnr;
      d.lda = x.a.ld, d.ldb = ld, d.trans_a = geo.trans_o, d.trans_b = geo.trans_x;
    }
    d.ldc = x.c.ld;
    d.accumulate = how.accumulate;
    d.in = d.out = dtype_of<T>();
    if (how.into_acc) d.out = dtype::f32, d.ldc = x.c.cols;
    if (how.add_acc) d.addend = true, d.ld_addend = x.c.cols, d.addend_type = dtype::f32;
    if (how.last) {  // the epilogue runs once, with an output block's last contribution
      d.bias = static_cast<bool>(opt.epilogue.bias);
      d.act = opt.epilogue.activation;
    }
    return d;
  }

  /// bf16 with a contracting shard: partial sums stay in an fp32 accumulator.
  static bool uses_fp32_acc(const ag_geometry& geo, int R) {
    return dtype_of<T>() == dtype::bf16 && geo.contracting && R > 1;
  }

  /// The ring plan (positions on the context's ring: p + i is ring_at(i)).
  /// Lane 0 holds, at round i, the shard of p + i: it arrived
  /// from p + 1 and is forwarded to p - 1 unless it has gone all the way round.
  /// With two lanes (bidirectional), each shard is halved along op(X)'s output
  /// dimension: lane 0 carries the first halves that way, lane 1 the second
  /// halves the other way (the shard of p - i, from p - 1 to p + 1). Each half is
  /// split into `chunks` pieces; step t = i * chunks + j computes piece j of
  /// every lane. A piece is received `lead` = chunks steps before its step and
  /// forwarded in its step, and its send may stay in flight chunks - 1 steps
  /// more: 2 * chunks slots per lane are never rewritten while in use.
  static void build_ring(const build_site& at, ag_plan<T>& plan, const ag_args<T>& x, const ag_options& opt,
                         int chunks) {
    if (uses_fp32_acc(plan.geo(), at.size()))
      plan.acc = at.buffer<float>(static_cast<size_t>(x.c.rows * x.c.cols * plan.batch.count));
    const engine::ring_slots slots = build_flat_ring(
        at, plan, travels::input, chunks,
        [&](const ring_visit& v, engine::ring_slots& s) { return ring_step(at, plan, x, opt, v.shard, v.pos, s); });
    finish_ring(at, plan, slots);
  }

  /// The hierarchical plan: S ranks on each of N nodes, R = N * S; this rank
  /// is local rank j of node a (in the order by node). Step t = r * S + k
  /// computes the shard of local rank j + k of node a + r. Lane 0 runs
  /// between nodes (from rank j of node a + 1 to rank j of node a - 1): at
  /// the first step of round r it receives the shard of (a + r, j) and
  /// forwards it, so every shard crosses the network once per node, and a
  /// transfer has the S steps of a round to arrive. Lane 1 runs inside the
  /// node (from local rank j + 1 to j - 1) and carries, at the other steps,
  /// the shards that came in over lane 0 round the node. Only lane 0's entry
  /// of a step computes. Received S steps ahead, sends in flight S - 1 steps
  /// more: 2S slots are never rewritten while in use. One whole shard per
  /// step: chunks do not apply.
  static void build_hierarchical(const build_site& at, ag_plan<T>& plan, const ag_args<T>& x, const ag_options& opt,
                                 int /*chunks*/) {
    const int R = at.size(), S = at.node_slots(), N = R / S;
    if (uses_fp32_acc(plan.geo(), R))
      plan.acc = at.buffer<float>(static_cast<size_t>(x.c.rows * x.c.cols * plan.batch.count));
    // Whole shards (the ring's lanes halve them; here both lanes move one
    // piece, in one lane of slots).
    const engine::ring_slots slots = build_two_level_ring(
        at, plan, travels::input, 1, lane_slots::shared, [&](const node_visit& v, engine::ring_slots& s) {
          const int r = v.node, k = v.local;
          ag_step st = ring_step(at, plan, x, opt, v.shard, ring_position{v.step}, s);
          ag_step inside = st;
          const bool moves = st.nonempty();
          st.recv = moves && k == 0 && r > 0;      // from the next node
          st.send = moves && k == 0 && r < N - 1;  // to the previous node
          inside.recv = moves && k > 0;            // from the next rank of this node
          inside.send = moves && k < S - 1;        // to the previous rank of this node
          inside.compute = false;
          plan.steps.push_back(std::move(st));
          plan.steps.push_back(std::move(inside));
        });
    finish_ring(at, plan, slots);
  }

  /// The ring step at `at`: its piece of `shard`, the shard its lane holds
  /// at that round (docs in build_ring, build_hierarchical).
  static ag_step ring_step(const build_site& site, ag_plan<T>& plan, const ag_args<T>& x, const ag_options& opt,
                           int shard, const ring_position& at, engine::ring_slots& slots) {
    const ag_geometry& geo = plan.geo();
    const int R = site.size(), i = at.round;
    range rows{0, geo.stored_rows()}, cols{0, geo.stored_cols()};
    (geo.stored_shard_rows() ? rows : cols) = range{geo.layout.offset(shard), geo.layout.size(shard)};
    range& chunked = geo.stored_chunk_rows() ? rows : cols;
    chunked = chunked.chunk(at.lanes, at.lane).chunk(at.chunks, at.chunk);
    ag_step st;
    st.r0 = rows.begin, st.nr = rows.len, st.c0 = cols.begin, st.nc = cols.len;
    st.lr0 = geo.trans_x ? st.c0 : st.r0;
    st.lc0 = geo.trans_x ? st.r0 : st.c0;
    // Pieces are received only into one contiguous block: Open MPI 4.1's TCP
    // path corrupts large messages sent from contiguous memory into a strided
    // receive type (docs/design.md, "Transfers land in contiguous blocks").
    // A piece whose place in gathered_out is strided (or a batch's) is
    // received into a slot and copied there when it is computed.
    const bool out_block = x.has_out && plan.batch.count == 1 && (st.nr <= 1 || x.out.ld == st.nc);
    if (x.has_out && (i == 0 || out_block)) {
      st.home = piece_home::gathered_out;
      st.ld = x.out.ld;
    } else if (i == 0) {
      st.home = piece_home::local;
      st.ld = local_view(x, geo).ld;
    } else {
      st.home = piece_home::slot;
      st.ld = st.nc;
      st.slot_offset = at.slot(slots);  // scaled to elements later
      slots.elems = std::max(slots.elems, st.nr * st.nc);
      st.copy_out = x.has_out;
    }
    st.send = st.nonempty() && i < R - 1;
    st.recv = st.nonempty() && i > 0;
    const int64_t lnr = geo.trans_x ? st.nc : st.nr, lnc = geo.trans_x ? st.nr : st.nc;
    const bool last = !geo.contracting || i == R - 1;
    const bool fp32_acc = uses_fp32_acc(geo, R);
    st.into_acc = fp32_acc && !last;
    st.add_acc = fp32_acc && last;
    const bool accumulate = geo.contracting && i > 0 && !st.add_acc;
    st.desc = gemm(geo, x, opt, {lnr, lnc}, st.ld, {accumulate, last, st.into_acc, st.add_acc});
    // The pieces of lhs_rows read all of b (a batch's members read different b's).
    st.desc.pack_b = geo.lhs && geo.shard_rows && plan.batch.count == 1;
    st.kernel = site.step_kernel(st.desc);
    return st;
  }

  /// How far apart the batch members of a piece are where it lives: in a
  /// slot, one after the other (a slot holds every member's piece as one
  /// contiguous block).
  static int64_t member_stride(const ag_plan<T>& plan, const ag_step& st) {
    switch (st.home) {
      case piece_home::local: return plan.geo().lhs ? plan.batch.a : plan.batch.b;
      case piece_home::gathered_out: return plan.batch.out;
      case piece_home::slot: return st.nr * st.nc;
    }
    return 0;
  }

  /// Completes a ring plan (finish_ring): a slot holds every batch member's
  /// piece, one after the other.
  static void finish_ring(const build_site& at, ag_plan<T>& plan, const engine::ring_slots& slots) {
    detail::finish_ring(at, plan, slots, 1, [&](const ag_step& st) { return member_stride(plan, st); });
  }

  // The other operands' plans (algorithm::others).

  /// algorithm::others for all_gather_matmul. `g.other[q]` is rank q's
  /// extent of the other operand's free dimension (N_q for lhs_*, M_q for rhs_*).
  static void build_others(const build_site& at, ag_plan<T>& plan, const ag_args<T>& x, const ag_options& opt,
                           const ag_global& g, int pieces) {
    const std::vector<int64_t>& other = g.other;
    pieces = std::max(pieces, 1);
    const ag_geometry& geo = plan.geo();
    others_plan<T>& o = plan.others;
    const ag_others_ctx c{at.size(),
                          at.rank(),
                          dtype_of<T>(),
                          geo.trans_x,
                          geo.trans_o,
                          local_view(x, geo).ld,
                          geo.lhs ? others_src::caller_a : others_src::caller_b,
                          geo.lhs ? others_src::caller_b : others_src::caller_a,
                          other};
    const int64_t products =
        geo.contracting ? others_by_exchange(geo, o, x, opt, c) : others_by_gather(geo, o, x, opt, c, pieces);
    for (others_gemm& gm : o.gemms) gm.kernel = at.kernel(gm.desc);
    // This rank's own block first: its inputs are local, so it runs while the
    // input collective moves the others (others_by_gather orders its own).
    if (geo.contracting) std::rotate(o.gemms.begin(), o.gemms.begin() + c.p, o.gemms.end());
    others_allocate(at, o, products);
  }

  /// Not contracting (lhs_rows, rhs_cols): every rank's other operand is
  /// gathered, in `pieces` pieces of its free dimension (one all-gather each),
  /// this rank multiplies its shard of X by each piece as it arrives, and each
  /// output block goes to its owner once computed.
  /// lhs_rows: A_p (M_p x K) @ op(b_q)[:, piece] (K x N_qj) is rows p, columns
  /// piece j of rank q's c. rhs_cols: op(a_q)[piece, :] (M_qj x K) @ B_p
  /// (K x N_p) is rows piece j, columns p of rank q's c.
  /// Returns the elements of the products buffer.
  static int64_t others_by_gather(const ag_geometry& geo, others_plan<T>& o, const ag_args<T>& x, const ag_options& opt,
                                  const ag_others_ctx& c, int pieces) {
    const shard_layout& sh = geo.layout;
    auto piece = [&](int q, int j) { return others_piece(c.o(q), j, pieces); };
    gathers(geo, o, c, pieces);
    o.output = others_output::owners;
    // The block of this rank's output that rank `from` computes from piece
    // `pc` of this rank's other operand, at element `at`.
    auto block_of = [&](int from, range pc, int64_t at) {
      return geo.lhs ? others_block{others_src::caller_a, sh.offset(from), pc.begin, sh.size(from), pc.len, at}
                     : others_block{others_src::caller_a, pc.begin, sh.offset(from), pc.len, sh.size(from), at};
    };
    // This rank's own pieces first (local inputs: they run while the gathers
    // move data), then piece by piece the peers' in ring order.
    int64_t at = 0;
    auto add = [&](int q, int j) {
      const others_gather& ga = o.gathers[static_cast<size_t>(j)];
      others_gemm g = others_gather_gemm(geo, c, ga, q, piece(q, j));
      g.out = at;
      at += g.desc.m * g.desc.n;
      if (q == c.p)
        o.own.push_back(block_of(c.p, piece(c.p, j), g.out));
      else
        g.inputs = j,
        g.send = mpi::detail::to_count(g.desc.m * g.desc.n, "output block of the other-operands algorithm");
      o.gemms.push_back(std::move(g));
    };
    for (int j = 0; j < pieces; ++j) add(c.p, j);
    for (int j = 0; j < pieces; ++j)
      for (int i = 1; i < c.R; ++i) add((c.p + i) % c.R, j);
    // Received from each peer in the order it sends: piece by piece. lhs_rows
    // in one piece: the blocks are c's row blocks in order, received in place.
    o.recv_into_c = pieces == 1 && geo.lhs && x.c.ld == x.c.cols;
    int64_t got = 0;
    for (int j = 0; j < pieces; ++j)
      for (int q = 0; q < c.R; ++q) {
        if (q == c.p) continue;
        const int64_t n = sh.size(q) * piece(c.p, j).len;
        const int64_t where = o.recv_into_c ? sh.offset(q) * x.c.ld : got;
        o.recvs.push_back({q, where, mpi::detail::to_count(n, "output block of the other-operands algorithm")});
        if (!o.recv_into_c) o.place.push_back(block_of(q, piece(c.p, j), got));
        got += n;
      }
    others_finish(o, x.c, opt.epilogue, false, c.t);
    return at;
  }

  /// The all-gathers of others_by_gather: piece j of every rank's other
  /// operand (K x its piece).
  static void gathers(const ag_geometry& geo, others_plan<T>& o, const ag_others_ctx& c, int pieces) {
    const int64_t k = geo.lhs ? geo.x_cols : geo.x_rows;
    auto piece = [&](int q, int j) { return others_piece(c.o(q), j, pieces); };
    others_gathers(
        o, pieces,
        [&](int j) {
          std::vector<int64_t> counts(static_cast<size_t>(c.R));
          for (int q = 0; q < c.R; ++q) counts[static_cast<size_t>(q)] = k * piece(q, j).len;
          return others_counts(counts);
        },
        [&](int j, const others_gather& ga) {
          const int64_t to = ga.base + ga.at.displs[static_cast<size_t>(c.p)];
          const range mine = piece(c.p, j), all{0, k};
          return geo.lhs ? stored_block(c.o_src, c.to, all, mine, to) : stored_block(c.o_src, c.to, mine, all, to);
        });
  }

  /// The product of this rank's shard of X with piece `pc` of rank q's
  /// other operand (its columns for lhs, its rows for rhs), gathered by `ga`.
  static others_gemm others_gather_gemm(const ag_geometry& geo, const ag_others_ctx& c, const others_gather& ga, int q,
                                        range pc) {
    const shard_layout& sh = geo.layout;
    const int64_t oq = pc.len, k = geo.lhs ? geo.x_cols : geo.x_rows;
    const int64_t off = ga.base + ga.at.displs[static_cast<size_t>(q)];
    others_gemm g;
    g.peer = q;
    if (geo.lhs) {
      g.a = c.x_src, g.b = others_src::gathered, g.b_off = off;
      g.desc = gemm_desc::shape(sh.size(c.p), oq, k)
                   .strides(c.x_ld, packed_ld(c.to ? k : oq), oq)
                   .transposed(c.tx, c.to)
                   .types(c.t, c.t);
    } else {
      g.a = others_src::gathered, g.b = c.x_src, g.a_off = off;
      g.desc = gemm_desc::shape(oq, sh.size(c.p), k)
                   .strides(packed_ld(c.to ? oq : k), c.x_ld, sh.size(c.p))
                   .transposed(c.to, c.tx)
                   .types(c.t, c.t);
    }
    return g;
  }

  /// Contracting (lhs_cols, rhs_rows): each rank sends every peer the slice of
  /// its other operand that meets the peer's K shard, multiplies its shard of X
  /// by the slices it got, and the partial sums are reduced and scattered.
  /// lhs_cols: op(A_p) (M x K_p) @ op(b_q)[K_p rows] (K_p x N_q) is rank q's partial sum.
  /// rhs_rows: op(a_q)[:, K_p] (M_q x K_p) @ B_p (K_p x N) is rank q's partial sum.
  /// Returns the elements of the products buffer.
  static int64_t others_by_exchange(const ag_geometry& geo, others_plan<T>& o, const ag_args<T>& x,
                                    const ag_options& opt, const ag_others_ctx& c) {
    const shard_layout& sh = geo.layout;
    o.out = c.t == dtype::bf16 ? dtype::f32 : c.t;
    const int64_t free = geo.lhs ? geo.x_rows : geo.x_cols;  // M (lhs) or N (rhs), the same on every rank
    const int64_t kp = sh.size(c.p), own = c.o(c.p);
    others_traffic t;
    std::vector<int64_t> sums;
    for (int q = 0; q < c.R; ++q) t.sent.push_back(sh.size(q) * own), t.got.push_back(kp * c.o(q));
    others_exchange(o, t, 0, [&](int q, int64_t to) {
      const range kq{sh.offset(q), sh.size(q)}, all{0, own};
      return geo.lhs ? stored_block(c.o_src, c.to, kq, all, to) : stored_block(c.o_src, c.to, all, kq, to);
    });
    int64_t at = 0;
    for (int q = 0; q < c.R; ++q) {
      // This rank's own slice is read where it was packed to be sent: it is
      // there before the exchange completes.
      const bool own_slice = q == c.p;
      const others_src ex = own_slice ? others_src::sent : others_src::exchanged;
      const int64_t oq = c.o(q), off = (own_slice ? o.sent_at : o.exchanged_at).displs[static_cast<size_t>(q)];
      others_gemm g;
      g.peer = q;
      g.inputs = own_slice ? -1 : 0;
      if (geo.lhs) {
        g.a = c.x_src, g.b = ex, g.b_off = off;
        g.desc = gemm_desc::shape(free, oq, kp)
                     .strides(c.x_ld, packed_ld(c.to ? kp : oq), oq)
                     .transposed(c.tx, c.to)
                     .types(c.t, o.out);
      } else {
        g.a = ex, g.b = c.x_src, g.a_off = off;
        g.desc = gemm_desc::shape(oq, free, kp)
                     .strides(packed_ld(c.to ? oq : kp), c.x_ld, free)
                     .transposed(c.to, c.tx)
                     .types(c.t, o.out);
      }
      g.out = at;
      sums.push_back(g.desc.m * g.desc.n);
      at += sums.back();
      o.gemms.push_back(std::move(g));
    }
    others_reduce_into(o, sums, x.c, opt.epilogue);
    return at;
  }

  // Running.

  /// Member m of a batched call's operands.
  static ag_args<T> member(const ag_args<T>& x, const overlap::batch& b, int64_t m) {
    return {detail::member(x.a, b.a, m), detail::member(x.b, b.b, m), detail::member(x.c, b.c, m),
            detail::member(x.out, b.out, m), x.has_out};
  }

  /// The bulk run: the all-gather, then one GEMM.
  static void bulk(context& ctx, ag_plan<T>& plan, const ag_args<T>& x, const ag_options& /*opt*/, const T* bias) {
    const ag_geometry& geo = plan.geo();
    const bool sr = geo.stored_shard_rows();
    const int64_t srows = geo.stored_rows(), scols = geo.stored_cols();
    const matrix_view<const T>& local = local_view(x, geo);
    T* dst = !sr ? plan.blocks_ws.data() : (plan.gather_into_out ? x.out.data : plan.gather_ws.data());
    // The local shard is copied to its place and gathered MPI_IN_PLACE: Open MPI
    // 4.1's tuned MPI_Allgatherv hangs at odd rank counts when the send side is
    // a derived datatype (seen with doubles at 3 ranks), so none is used here.
    copy_block<T>(local, {dst + plan.displs[static_cast<size_t>(ctx.rank())], local.rows, local.cols});
    const MPI_Datatype type = mpi_type_of(dtype_of<T>());
    run_collective(
        ctx, plan, "MPI_Allgatherv",
        [&] {
          return MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, dst, plan.counts.data(), plan.displs.data(), type,
                                ctx.comm());
        },
        [&](MPI_Request* r) {
          return MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, dst, plan.counts.data(), plan.displs.data(), type,
                                 ctx.comm(), r);
        });
    const matrix_view<T> xv = x.has_out ? x.out : matrix_view<T>(plan.gather_ws.data(), srows, scols);
    if (sr) {
      if (x.has_out && !plan.gather_into_out) copy_block<T>({dst, srows, scols}, x.out);
    } else {
      for (int r = 0; r < ctx.size(); ++r) {
        const int64_t off = geo.layout.offset(r), len = geo.layout.size(r);
        copy_block<T>({dst + off * srows, srows, len}, xv.block(0, off, srows, len));
      }
    }
    run_local_step(ctx, plan, [&] {
      const gemm_operands io = gemm_operands().c(x.c.data).bias(bias);
      plan.bulk_kernel->run(geo.lhs ? gemm_operands(io).a(xv.data).b(x.b.data)
                                    : gemm_operands(io).a(x.a.data).b(xv.data));
    });
  }

  /// The local shards join the gathered by-product before a ring runs (a
  /// ring's own pieces are computed where they are, not copied there).
  static void before_ring(const context& ctx, const ag_plan<T>& plan, const ag_args<T>& x) {
    for (int64_t m = 0; m < plan.batch.count && x.has_out; ++m) {
      const ag_args<T> y = member(x, plan.batch, m);
      const ag_geometry& geo = plan.geo();
      const int64_t off = geo.layout.offset(ctx.rank());
      const auto& l = local_view(y, geo);
      copy_block<T>(
          l, geo.stored_shard_rows() ? y.out.block(off, 0, l.rows, l.cols) : y.out.block(0, off, l.rows, l.cols));
    }
  }
};

/// The ring pattern of all_gather_matmul, for engine::run_ring: a piece
/// is sent in the step that computes it.
template <class T>
class ag_ring_pattern : public ring_pattern<ag_ring_pattern<T>, ag_plan<T>> {
  using base = ring_pattern<ag_ring_pattern<T>, ag_plan<T>>;
  using base::plan_;

 public:
  ag_ring_pattern(ag_plan<T>& plan, const ag_args<T>& x, const ag_options& /*opt*/, const T* bias, int rank)
      : base(plan), x_(x), local_(local_view(x, plan.geo())), bias_(bias) {
    (plan.geo().stored_shard_rows() ? local_r0_ : local_c0_) = plan.geo().layout.offset(rank);
  }
  [[nodiscard]] engine::transfer send(int t, int lane) const {
    const auto& st = plan_.step(t, lane);
    return st.send ? this->transfer_of(st, st) : engine::transfer{};
  }
  void compute(int t) {
    for (int l = 0; l < plan_.lanes; ++l)
      if (plan_.step(t, l).compute)
        for (int64_t m = 0; m < plan_.batch.count; ++m) compute(plan_.step(t, l), m);
  }

  /// The piece of batch member 0 (a step's datatype reaches the others).
  [[nodiscard]] T* piece(const ag_step& st) const {
    switch (st.home) {
      case piece_home::local:
        // Local pieces are only read and sent; MPI_Isend takes a const buffer.
        return const_cast<T*>(local_.data + (st.r0 - local_r0_) * st.ld + (st.c0 - local_c0_));
      case piece_home::gathered_out: return x_.out.data + st.r0 * x_.out.ld + st.c0;
      case piece_home::slot: return plan_.slots.data() + st.slot_offset;
    }
    return nullptr;
  }

 private:
  /// Batch member m's product of the step's piece.
  void compute(const ag_step& st, int64_t m) {
    const ag_geometry& g = plan_.geo();
    const overlap::batch& nb = plan_.batch;
    // The output block starts at row lr0 (lhs) or column lc0 (rhs) of c, or
    // of the dense fp32 accumulator.
    const int64_t c_off = g.lhs ? st.lr0 * x_.c.ld : st.lc0;
    const int64_t acc_off = g.lhs ? st.lr0 * x_.c.cols : st.lc0;
    float* acc = plan_.acc.data() == nullptr ? nullptr : plan_.acc.data() + m * x_.c.rows * x_.c.cols + acc_off;
    void* dst = st.into_acc ? static_cast<void*>(acc) : static_cast<void*>(x_.c.data + m * nb.c + c_off);
    const void* addend = st.add_acc ? acc : nullptr;
    const T* x = piece(st) + m * ag_op<T>::member_stride(plan_, st);
    if (st.copy_out) {  // a received piece joins the gathered by-product
      const matrix_view<T> out = member(x_.out, nb.out, m);
      copy_block<T>({x, st.nr, st.nc, st.ld}, out.block(st.r0, st.c0, st.nr, st.nc));
    }
    gemm_operands io;
    io.c(dst).addend(addend);
    if (g.lhs) {  // rows lc0.. of op(b): columns of b when it is stored transposed
      const T* b = x_.b.data + m * nb.b + (g.trans_o ? st.lc0 : st.lc0 * x_.b.ld);
      io.a(x).b(st.desc.pack_b ? plan_.pack.b(b) : b).bias(bias_);
    } else {  // columns lr0.. of op(a): rows of a when it is stored transposed
      io.a(x_.a.data + m * nb.a + (g.trans_o ? st.lr0 * x_.a.ld : st.lr0)).b(x);
      io.bias(bias_ == nullptr ? nullptr : bias_ + st.lc0);
    }
    st.kernel->run(io);
  }

  const ag_args<T>& x_;
  matrix_view<const T> local_;
  const T* bias_;
  int64_t local_r0_ = 0, local_c0_ = 0;  ///< where this rank's stored shard starts in stored X
};

}  // namespace detail
}  // namespace overlap
