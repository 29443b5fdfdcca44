#pragma once
/// @file
/// The implementation of matmul_all_reduce: part of the header-only flavour,
/// compiled once into the library otherwise (flavour.hpp). The op is made of
/// matmul_reduce_scatter's rings (one per group of C's rows or columns)
/// and ring all-gathers paced over the next group's ring, so it has no ring
/// pattern of its own: its traits run their plans themselves (run_member,
/// ops/pipeline.hpp).

#include <mpi.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "overlap/core/matrix.hpp"
#include "overlap/engine/buffer.hpp"
#include "overlap/engine/paced_gather.hpp"
#include "overlap/engine/tags.hpp"
#include "overlap/mpi/datatype.hpp"
#include "overlap/mpi/timing_only.hpp"
#include "overlap/ops/call_agreement.hpp"
#include "overlap/ops/checks.hpp"
#include "overlap/ops/choose.hpp"
#include "overlap/ops/geometry.hpp"
#include "overlap/ops/matmul_all_reduce.hpp"
#include "overlap/ops/matmul_reduce_scatter-inl.hpp"
#include "overlap/ops/op_id.hpp"
#include "overlap/ops/options.hpp"
#include "overlap/ops/pipeline.hpp"
#include "overlap/ops/plan.hpp"
#include "overlap/ops/run.hpp"
#include "overlap/ops/site.hpp"
#include "overlap/runtime/context.hpp"
#include "overlap/runtime/watchdog.hpp"
#include "overlap/schedule/chunks.hpp"

namespace overlap::detail {

/// The most groups a ring schedule splits C into. A group's all-gather runs
/// while the next group's ring computes, so only the last group's is
/// exposed (1 / groups of the gather); each group's ring also exposes its
/// first piece's product and its last transfer, so more groups cost more.
/// 8 ran fastest of 4, 8, 12 and 16 (docs/results.md, "matmul_all_reduce").
inline constexpr int ar_max_groups = 8;

/// One group of C's rows (reduced = rows) or columns: its ring, and its
/// all-gather's blocks (rank q's block is counts[q] elements at displs[q]
/// of c, or of gather_ws where the blocks cannot land in c). With two lanes
/// each block travels half each way: lane l moves lane_counts[l][q]
/// elements at lane_displs[l][q].
struct ar_group {
  range span;           ///< the group's rows or columns of C
  shard_layout layout;  ///< its blocks over the ranks
  size_t ring = 0;      ///< its ring plan: groups of one length share one
  std::vector<int> counts, displs;
  std::array<std::vector<int>, 2> lane_counts, lane_displs;
};

/// What each rank contributes when the ranks exchange their calls (see
/// rs_exchanged: the same fields).
struct ar_exchanged : matmul_row {
  int64_t bf16_transfers, groups;

  static constexpr std::array<agreed_field<ar_exchanged>, 2> more_agreed{{
      {"bf16_transfers", &ar_exchanged::bf16_transfers},
      {"ar_groups", &ar_exchanged::groups, field_scope::setting},
  }};
};

/// What the exchanged table says about the whole problem.
struct ar_global {
  bool rows = true;
  int64_t m = 0, n = 0;
  std::vector<int64_t> ks;    ///< every rank's K_r
  int64_t knee_units = 0;     ///< the largest GEMM rate knee over ranks
  int configured_groups = 0;  ///< config::ar_groups (agreed)
};

/// A plan of matmul_all_reduce: bulk's GEMM, sum and finishing pass, or
/// the groups with their rings. Its own steps stay empty: the rings hold them.
template <class T>
struct ar_plan final : op_plan<T, rs_step, std::byte> {
  ar_global whole;         ///< the problem, as the exchanged table gives it
  dtype acc = dtype::f32;  ///< what partial sums are summed and sent in
  // bulk
  gemm_desc bulk_desc;
  std::shared_ptr<const gemm_kernel> bulk_kernel;
  int sum_count = 0;                 ///< elements of the all-reduce
  engine::buffer<std::byte> sum_ws;  ///< the product and its sum where c cannot hold them
  gemm_desc finish;                  ///< c = act(sum + bias), converting an fp32 sum
  // the rings
  std::vector<ar_group> groups;
  std::vector<std::unique_ptr<rs_plan<T>>> rings;
  engine::buffer<T> gather_ws;  ///< every group's blocks, where they cannot land in c
  // a call's state, kept so that a cached call allocates nothing
  /// The previous group's all-gather, a ring per lane, paced over this group's ring.
  std::array<engine::paced_gather, 2> gathers;
  std::vector<char> packed;  ///< whether a ring plan's B is packed this call
};

/// matmul_all_reduce's names and message tags (ops/op_id.hpp). Its rings
/// are matmul_reduce_scatter's plans, run with that op's tags; its
/// all-gathers' lanes use its own. Its chunks are its rings' (config.rs_chunks).
template <>
struct op_info<op_id::matmul_all_reduce> : owns_tags<op_id::matmul_all_reduce> {
  static constexpr entry_names names = OVERLAP_ENTRY_NAMES("matmul_all_reduce", "ar_options", "reduced", "rs_chunks");
};

/// matmul_all_reduce as an op of the shared pipeline (ops/pipeline.hpp).
template <class T>
struct ar_op : op_defaults,
               op_names<op_id::matmul_all_reduce, &ar_options::reduced, &config::rs_chunks>,
               op_types<T, ar_args<T>, ar_options, ar_plan<T>, ar_exchanged, ar_global, void> {
  /// Bulk, and groups of matmul_reduce_scatter's rings (flat or two-level)
  /// each followed by its all-gather; no other-operands algorithm
  /// (local_checks refuse it).
  static constexpr op_builders<ar_plan<T>, ar_args<T>, ar_options, ar_global> builders() {
    return {&ar_op::build_bulk, &ar_op::build_groups, &ar_op::build_groups, nullptr};
  }
  /// It runs each batch member's plan itself (run_member): its rings are
  /// matmul_reduce_scatter's, its pattern theirs.
  static constexpr bool runs_itself = true;
  static void describe(ar_plan<T>& p, const ar_options& o, const ar_global& g) {
    p.whole = g;
    p.acc = rs_op<T>::acc_type(dtype_of<T>(), ring_options(o), p.strategy);
  }
  static std::string summary(const ar_plan<T>& p, const ar_global& /*g*/) {
    return ", C " + std::to_string(p.whole.m) + " x " + std::to_string(p.whole.n) + " reduced by " +
           (p.whole.rows ? "rows" : "columns") + ", sums in " + to_string(p.acc);
  }
  static std::string plan_notes(const ar_plan<T>& p) {
    if (p.groups.empty()) return "";
    const rs_plan<T>& first = *p.rings.front();
    return ", " + std::to_string(p.groups.size()) + " groups, each reduce-scattered by a ring" +
           ring_summary(first.strategy, first, first.sched.chunks, false, first.slots.size()) +
           " and all-gathered during the next one's";
  }

  // The checks, the exchange and the choice (ops/pipeline.hpp, prepare).

  /// Step 1: the checks each rank makes alone.
  static int local_checks(const context& ctx, arg_checks& checks, const ar_args<T>& x, const ar_options& opt) {
    check_matmul_args<ar_op>(checks, opt, x);
    checks.require(opt.algorithm != algorithm::others,
                   "ar_options.algorithm: matmul_all_reduce has no other-operands algorithm (automatic or named)");
    const dims2 la = op_dims(x.a, opt.transpose_a), lb = op_dims(x.b, opt.transpose_b);
    const bool ta = opt.transpose_a, tb = opt.transpose_b;
    require_equal(checks, ta, tb, lb.rows, "b.rows", la.cols, "a.cols", ", this rank's K");
    require_equal(checks, ta, tb, x.c.rows, "c.rows", la.rows, "a.rows");
    require_equal(checks, ta, tb, x.c.cols, "c.cols", lb.cols, "b.cols");
    return checked_backend<T>(ctx, checks);
  }

  /// This rank's row of the exchange.
  static ar_exchanged row_of(const context& ctx, const ar_args<T>& x, const ar_options& opt) {
    // Pieces split the reduced dimension: their GEMMs' rate depends on the other one.
    const int64_t other = opt.reduced == reduced::rows ? x.c.cols : x.c.rows;
    return {matmul_row_of<ar_op>(ctx, opt, x, ctx.piece_knee(dtype_of<T>(), other)), opt.bf16_transfers,
            ctx.config().ar_groups};
  }

  /// Step 3: the rules that span ranks (c's shape follows from M and N).
  static ar_global global_checks(const context& ctx, const arg_checks& checks, const ar_options& opt,
                                 const std::vector<ar_exchanged>& table) {
    ar_global g;
    g.rows = opt.reduced == reduced::rows;
    for (size_t r = 0; r < table.size(); ++r) {
      require_agreed(ctx, checks, table, r, &ar_exchanged::a_rows, op_name("a", opt.transpose_a) + ".rows (M)");
      require_agreed(ctx, checks, table, r, &ar_exchanged::b_cols, op_name("b", opt.transpose_b) + ".cols (N)");
      g.ks.push_back(table[r].a_cols);
      g.knee_units = std::max(g.knee_units, table[r].knee);
    }
    g.m = table.front().a_rows, g.n = table.front().b_cols;
    g.configured_groups = static_cast<int>(table.front().groups);
    return g;
  }

  /// Step 4: the schedule. A ring's chunks are its groups' rings' chunks.
  static schedule choose(context& ctx, const ar_args<T>& x, const ar_options& opt, const ar_global& g) {
    const int R = ctx.size();
    const dtype t = dtype_of<T>();
    const int64_t extent = g.rows ? g.m : g.n;
    const dtype acc = rs_op<T>::acc_type(t, ring_options(opt), strategy::ring);
    auto chunks_for = [&](int lanes) {
      chunk_request r;
      r.configured = ctx.config().rs_chunks, r.rule = rs_chunk_rule, r.ranks = R, r.lanes = lanes;
      r.piece_units = extent / groups_of(g, R, lanes, 1, acc) / R / lanes;
      r.bytes_per_unit = (g.rows ? g.n : g.m) * static_cast<int64_t>(size_of(acc));
      r.one_node = ctx.one_node(), r.knee_units = g.knee_units;
      return plan_chunks(r);
    };
    schedule_request req = request_of<ar_op>(opt);
    req.hierarchical_chunks = ctx.config().rs_chunks > 0 ? ctx.config().rs_chunks : 2;
    return choose_schedule(ctx, req, t, chunks_for,
                           [&](const schedule& s) { return priced<ar_op>(build_site::dry(ctx), x, opt, g, s); });
  }

  /// The groups a ring splits C into (its rings with `chunks` pieces per
  /// shard and lane, partial sums of type acc): config::ar_groups when set,
  /// else ar_max_groups, fewer while a piece would fall below the hard
  /// floors of plan_chunks (schedule/chunks.hpp: its product
  /// hard_floor_units or the GEMM rate's knee wide, its message
  /// hard_floor_bytes). Every piece reads all of the other operand, so
  /// thinner ones cost more than they hide. At most one per row or column.
  static int groups_of(const ar_global& g, int R, int lanes, int chunks, dtype acc) {
    const int64_t extent = std::max<int64_t>(g.rows ? g.m : g.n, 1);
    const int64_t unit_bytes = (g.rows ? g.n : g.m) * static_cast<int64_t>(size_of(acc));
    if (g.configured_groups > 0) return static_cast<int>(std::min<int64_t>(g.configured_groups, extent));
    const int64_t per_group = int64_t{R} * lanes * chunks;
    auto thin = [&](int groups) {
      const int64_t units = extent / (per_group * groups);
      return units < std::max(hard_floor_units, g.knee_units) || units * unit_bytes < hard_floor_bytes;
    };
    int groups = ar_max_groups;
    while (groups > 1 && thin(groups)) --groups;
    return groups;
  }

  /// A plan of matmul_all_reduce as the cost model prices it (`priced`,
  /// ops/pipeline.hpp). Bulk: one GEMM and MPI_Allreduce (a reduce-scatter
  /// and an all-gather of blocks of 1/R of C). The groups: their rings one
  /// after the other, each group's all-gather spread over the next group's
  /// transfers (it runs while that ring does), the last group's after them.
  static work work_of(const ar_plan<T>& p, const build_site& at) {
    const int R = at.size(), me = at.rank();
    const auto elem = static_cast<double>(sizeof(T));
    if (p.strategy == strategy::bulk) {
      const int64_t extent = p.whole.rows ? p.whole.m : p.whole.n, width = p.whole.rows ? p.whole.n : p.whole.m;
      const double block = double(ceil_div(extent, R) * width);
      work w;
      w.gemms.push_back({p.bulk_desc.m, p.bulk_desc.n, p.bulk_desc.k});
      w.reduce_scatter_block = block * double(size_of(p.acc));
      w.allgather_block = block * elem;
      return w;
    }
    work w;
    w.ring = true, w.lanes = p.lanes, w.output_moves = true;
    double gathering = 0;  // bytes of the previous group's all-gather this rank receives
    for (const ar_group& gr : p.groups) {
      work ring = ring_plan_work(*p.rings[gr.ring], static_cast<int64_t>(size_of(p.acc)), true);
      const auto transfers = std::count_if(ring.ring_steps.begin(), ring.ring_steps.end(),
                                           [](const ring_step_work& s) { return s.recv > 0; });
      for (ring_step_work& s : ring.ring_steps)
        if (s.recv > 0) s.recv += gathering / double(transfers * p.lanes), s.moved += 2 * gathering / double(transfers);
      w.ring_steps.insert(w.ring_steps.end(), ring.ring_steps.begin(), ring.ring_steps.end());
      gathering = 0;
      for (int q = 0; q < R; ++q)
        if (q != me) gathering += double(gr.counts[static_cast<size_t>(q)]) * elem;
    }
    if (!p.groups.empty()) {
      const std::vector<int>& last = p.groups.back().counts;
      w.tail_allgather_block = double(*std::max_element(last.begin(), last.end())) * elem;
    }
    return w;
  }

  // The plans.

  /// The options of a group's ring (a column group's ring reads its own
  /// block of the bias: run_member moves the pointer).
  static rs_options ring_options(const ar_options& o) {
    rs_options r;
    r.scattered = o.reduced == reduced::rows ? scattered::rows : scattered::cols;
    r.strategy = o.strategy, r.transpose_a = o.transpose_a, r.transpose_b = o.transpose_b;
    r.epilogue = o.epilogue;
    r.bf16_transfers = o.bf16_transfers;
    return r;
  }

  /// Group `gr`'s operands for its ring: its rows of op(a) (or columns of
  /// op(b)), and this rank's block of them in c.
  static rs_args<T> group_args(const ar_plan<T>& plan, const ar_group& gr, const ar_args<T>& x, const ar_options& opt,
                               int rank) {
    const range mine{gr.span.begin + gr.layout.offset(rank), gr.layout.size(rank)};
    const int64_t s = gr.span.begin, len = gr.span.len;
    if (plan.whole.rows) {
      const matrix_view<const T> a = opt.transpose_a ? x.a.block(0, s, x.a.rows, len) : x.a.block(s, 0, len, x.a.cols);
      return {a, x.b, x.c.block(mine.begin, 0, mine.len, x.c.cols)};
    }
    const matrix_view<const T> b = opt.transpose_b ? x.b.block(s, 0, len, x.b.cols) : x.b.block(0, s, x.b.rows, len);
    return {x.a, b, x.c.block(0, mine.begin, x.c.rows, mine.len)};
  }

  /// The bulk plan: one GEMM into c (or, for an fp32 sum or a strided c,
  /// into sum_ws), MPI_Allreduce in place, and a pass that writes c.
  static void build_bulk(const build_site& at, ar_plan<T>& plan, const ar_args<T>& x, const ar_options& opt) {
    const dtype t = dtype_of<T>();
    const bool via_ws = x.c.ld != x.c.cols || plan.acc != t;
    if (via_ws)
      plan.sum_ws = at.buffer<std::byte>(static_cast<size_t>(plan.whole.m * plan.whole.n) * size_of(plan.acc));
    plan.sum_count = mpi::detail::to_count(plan.whole.m * plan.whole.n, "all-reduce count");
    const int64_t k = op_dims(x.a, opt.transpose_a).cols;
    plan.bulk_desc = gemm_desc::shape(plan.whole.m, plan.whole.n, k)
                         .strides(x.a.ld, x.b.ld, via_ws ? plan.whole.n : x.c.ld)
                         .transposed(opt.transpose_a, opt.transpose_b)
                         .types(t, plan.acc);
    plan.bulk_kernel = at.kernel(plan.bulk_desc);
    plan.finish = finishing_pass(plan.whole.m, plan.whole.n, x.c.ld, t, static_cast<bool>(opt.epilogue.bias),
                                 opt.epilogue.activation, via_ws, plan.whole.n, plan.acc);
  }

  /// The ring plans: C split into groups, each with its ring (a plan of
  /// matmul_reduce_scatter over the group, `chunks` pieces per shard) and
  /// its all-gather. Row groups land in c itself where c is dense; column
  /// groups and a strided c go through gather_ws, each group's blocks one
  /// after the other in rank order.
  static void build_groups(const build_site& at, ar_plan<T>& plan, const ar_args<T>& x, const ar_options& opt,
                           int chunks) {
    const int R = at.size();
    const int64_t extent = plan.whole.rows ? plan.whole.m : plan.whole.n,
                  width = plan.whole.rows ? plan.whole.n : plan.whole.m;
    const bool in_c = plan.whole.rows && x.c.ld == x.c.cols;
    const int groups = groups_of(plan.whole, R, plan.lanes, chunks, plan.acc);
    for (int i = 0; i < groups; ++i) {
      ar_group gr;
      gr.span = range{0, extent}.chunk(groups, i);
      gr.layout = shard_layout::balanced(gr.span.len, R);
      for (int q = 0; q < R; ++q) {
        gr.counts.push_back(mpi::detail::to_count(gr.layout.size(q) * width, "all-gather count"));
        gr.displs.push_back(
            mpi::detail::to_count((gr.span.begin + gr.layout.offset(q)) * width, "all-gather displacement"));
      }
      split_lanes(gr, plan.lanes);
      auto same = [&](const std::unique_ptr<rs_plan<T>>& r) { return r->whole.layout.sizes() == gr.layout.sizes(); };
      gr.ring = static_cast<size_t>(std::find_if(plan.rings.begin(), plan.rings.end(), same) - plan.rings.begin());
      if (gr.ring == plan.rings.size()) plan.rings.push_back(build_group_ring(at, plan, gr, x, opt, chunks));
      plan.groups.push_back(std::move(gr));
    }
    if (!in_c) plan.gather_ws = at.buffer<T>(static_cast<size_t>(extent * width));
    plan.packed.assign(plan.rings.size(), 0);
  }

  /// A group's blocks split between the lanes' gathers: with two lanes, the
  /// first half of each block goes one way round the ring and the rest the
  /// other, as the cost model spreads the gather over both lanes' links.
  static void split_lanes(ar_group& gr, int lanes) {
    for (size_t q = 0; q < gr.counts.size(); ++q) {
      const int first = lanes == 2 ? gr.counts[q] / 2 : gr.counts[q];
      gr.lane_counts[0].push_back(first), gr.lane_displs[0].push_back(gr.displs[q]);
      gr.lane_counts[1].push_back(gr.counts[q] - first), gr.lane_displs[1].push_back(gr.displs[q] + first);
    }
  }

  /// A group's ring: a plan of matmul_reduce_scatter, described as the
  /// pipeline's make_plan would for the group alone (one batch member: the
  /// members run one after the other).
  static std::unique_ptr<rs_plan<T>> build_group_ring(const build_site& at, const ar_plan<T>& plan, const ar_group& gr,
                                                      const ar_args<T>& x, const ar_options& opt, int chunks) {
    auto ring = std::make_unique<rs_plan<T>>();
    ring->sched = plan.sched, ring->strategy = plan.strategy, ring->algorithm = algorithm::named;
    ring->lanes = plan.lanes, ring->fingerprint = plan.fingerprint;
    ring->summary = plan.summary + ", a group of " + std::to_string(gr.span.len);
    rs_global g;
    g.rows = plan.whole.rows, g.m = plan.whole.rows ? gr.span.len : plan.whole.m,
    g.n = plan.whole.rows ? plan.whole.n : gr.span.len;
    g.layout = gr.layout, g.ks = plan.whole.ks;
    const rs_options ro = ring_options(opt);
    rs_op<T>::describe(*ring, ro, g);
    const rs_args<T> y = group_args(plan, gr, x, opt, at.rank());
    if (plan.strategy == strategy::hierarchical)
      rs_op<T>::build_hierarchical(at, *ring, y, ro, chunks);
    else
      rs_op<T>::build_ring(at, *ring, y, ro, chunks);
    return ring;
  }

  // Running.

  static ar_args<T> member(const ar_args<T>& x, const overlap::batch& b, int64_t m) {
    return {detail::member(x.a, b.a, m), detail::member(x.b, b.b, m), detail::member(x.c, b.c, m)};
  }

  /// Runs one batch member's plan (the pipeline's run calls it for every
  /// strategy, member by member).
  static void run_member(context& ctx, ar_plan<T>& plan, const ar_args<T>& x, const ar_options& opt, const T* bias) {
    if (plan.strategy == strategy::bulk) return bulk(ctx, plan, x, bias);
    const int p = ctx.rank();
    T* dst = plan.gather_ws.data() != nullptr ? plan.gather_ws.data() : x.c.data;
    std::fill(plan.packed.begin(), plan.packed.end(), 0);  // row groups read the same b: packed once per ring plan
    configure_gathers(ctx, plan);
    // A failure is fatal (the peers are in the gathers too): what is in
    // flight is forgotten, as the ring's requests are (engine::run_ring).
    struct leak_on_throw {
      ar_plan<T>& plan;
      int unwinding = std::uncaught_exceptions();
      ~leak_on_throw() {
        if (std::uncaught_exceptions() > unwinding)
          for (engine::paced_gather& g : plan.gathers) g.leak();
      }
    } guard{plan};
    for (size_t i = 0; i < plan.groups.size(); ++i) {
      const ar_group& gr = plan.groups[i];
      rs_plan<T>& ring = *plan.rings[gr.ring];
      const rs_args<T> y = group_args(plan, gr, x, opt, p);
      const bool pack = plan.packed[gr.ring] == 0 || !plan.whole.rows;
      plan.packed[gr.ring] = 1;
      // The bias has one value per column of C; a column group's ring reads its block's.
      const T* own_bias = bias == nullptr || plan.whole.rows ? bias : bias + gr.span.begin + gr.layout.offset(p);
      // The previous group's gather advances by even shares of this ring's
      // steps, before each step's sends: the spread the cost model prices.
      run_ring<rs_op<T>>(ctx, ring, y, ring_options(opt), own_bias, pack, [&plan](int t, int steps) {
        for (engine::paced_gather& g : plan.gathers) g.advance_to(1 + t * g.steps() / steps);
      });
      finish_gathers(ctx, plan);
      if (x.c.data != dst) copy_block<T>(y.c, block_at(plan, gr, dst, p));
      start_gathers(ctx, plan, gr, dst);
    }
    finish_gathers(ctx, plan);
    if (x.c.data == dst) return;
    run_local_step(ctx, plan, [&] {
      for (const ar_group& gr : plan.groups)
        for (int q = 0; q < ctx.size(); ++q)
          if (q != p) copy_block<T>(block_at(plan, gr, dst, q), group_args(plan, gr, x, opt, q).c);
    });
  }

  /// Rank q's block of group gr where the all-gather moves it: dense, at
  /// its displacement from `base`.
  static matrix_view<T> block_at(const ar_plan<T>& plan, const ar_group& gr, T* base, int q) {
    const int64_t len = gr.layout.size(q);
    T* at = base + gr.displs[static_cast<size_t>(q)];
    return plan.whole.rows ? matrix_view<T>(at, len, plan.whole.n, plan.whole.n)
                           : matrix_view<T>(at, plan.whole.m, len, std::max<int64_t>(len, 1));
  }

  /// The gathers' rings (the context's, lane 1 the other way round) and
  /// tags (this op's), once per plan.
  static void configure_gathers(const context& ctx, ar_plan<T>& plan) {
    if (plan.gathers[0].configured()) return;
    for (int l = 0; l < 2; ++l) {
      std::vector<int> ring(static_cast<size_t>(ctx.size()));
      for (int s = 0; s < ctx.size(); ++s) ring[static_cast<size_t>(s)] = ctx.ring_at(l == 0 ? s : -s);
      engine::paced_gather& g = plan.gathers[static_cast<size_t>(l)];
      g.configure(std::move(ring), ar_op::tags.lanes[l]);
      g.set_timeout(ctx.config().timeout_s);
    }
  }

  /// Starts group gr's all-gather in place, a ring per lane (not at all
  /// under ring_phases::compute_only, where benchmarks time the computing
  /// alone).
  static void start_gathers(context& ctx, ar_plan<T>& plan, const ar_group& gr, T* base) {
    if (ctx.config().phases == ring_phases::compute_only) return;
    fatal_on_failure(
        ctx, plan, "all-gather", [&] { return plan.summary + ", starting a group's all-gather"; },
        [&] {
          for (int l = 0; l < plan.lanes; ++l) {
            const auto lane = static_cast<size_t>(l);
            plan.gathers[lane].start(
                {base, gr.lane_counts[lane].data(), gr.lane_displs[lane].data(), mpi_type_of(dtype_of<T>())},
                ctx.comm());
          }
        });
  }

  /// Completes the gathers in flight (blocking): their steps the pacing left.
  static void finish_gathers(context& ctx, ar_plan<T>& plan) {
    fatal_on_failure(
        ctx, plan, "all-gather", [&] { return plan.summary + ", a group's all-gather"; },
        [&] {
          for (engine::paced_gather& g : plan.gathers) g.finish();
        });
  }

  /// The bulk run: the GEMM, MPI_Allreduce in place, and the pass over c.
  static void bulk(context& ctx, ar_plan<T>& plan, const ar_args<T>& x, const T* bias) {
    void* sum = plan.sum_ws.data() != nullptr ? static_cast<void*>(plan.sum_ws.data()) : static_cast<void*>(x.c.data);
    run_local_step(ctx, plan, [&] { plan.bulk_kernel->run(gemm_operands().a(x.a.data).b(x.b.data).c(sum)); });
    const int count = plan.sum_count;
    const MPI_Datatype type = mpi_type_of(plan.acc);
    // Timing only under SMPI (shared workspaces of garbage): the ring
    // all-reduce's pattern, its sums charged, not SimGrid's MPI_Allreduce,
    // which allocates and sums the whole buffer on every rank
    // (mpi/timing_only.hpp).
    const bool pattern_only = mpi::timing_only_buffers();
    const int tag = engine::tag_value(engine::message_tag::timing_ring);
    run_collective(
        ctx, plan, "MPI_Allreduce",
        [&] {
          return pattern_only ? mpi::timing_all_reduce(sum, count, type, tag, ctx.comm())
                              : MPI_Allreduce(MPI_IN_PLACE, sum, count, type, MPI_SUM, ctx.comm());
        },
        [&](MPI_Request* r) {
          if (!pattern_only) return MPI_Iallreduce(MPI_IN_PLACE, sum, count, type, MPI_SUM, ctx.comm(), r);
          *r = MPI_REQUEST_NULL;  // done before the watchdog waits
          return mpi::timing_all_reduce(sum, count, type, tag, ctx.comm());
        });
    // c = act(sum + bias) (the pass also converts an fp32 sum to bf16).
    run_local_step(ctx, plan, [&] {
      run_degenerate(plan.finish, gemm_operands().c(x.c.data).bias(bias).addend(plan.sum_ws.data()));
    });
  }
};

}  // namespace overlap::detail
