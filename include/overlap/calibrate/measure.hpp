#pragma once
/// @file
/// Measuring a calibration on the ranks of a context (collective): the ring
/// links, the collectives over them, the GEMM rate grid and the GEMM
/// slowdown while transfers run. Every rank measures at the same time (every
/// core busy, as users run), and the ranks agree on the slowest values, so
/// they all hold one model.

#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "overlap/core/error.hpp"
#include "overlap/engine/buffer.hpp"
#include "overlap/engine/progress.hpp"
#include "overlap/engine/tags.hpp"
#include "overlap/mpi/simulator.hpp"
#include "overlap/runtime/agreement.hpp"
#include "overlap/runtime/context.hpp"
#include "overlap/runtime/failure.hpp"
#include "overlap/schedule/calibration.hpp"
#include "overlap/schedule/model.hpp"

namespace overlap::detail {

/// Median of a small sample.
inline double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

/// Where a timed exchange sends from and receives into: a second direction
/// uses the `bytes` after the first's.
struct exchange_buffers {
  std::byte* out = nullptr;
  std::byte* in = nullptr;
};
/// The directions a timed exchange moves data in.
enum class directions { one_way, both_ways };

/// Seconds of one ring exchange of `bytes` with the ring neighbours: to
/// ring_at(-1) and from ring_at(1), and with both_ways also the other way.
/// Median of `reps`, slowest rank.
inline double time_exchange(context& ctx, exchange_buffers buf, int bytes, directions d, int reps) {
  std::byte *out = buf.out, *in = buf.in;
  const bool both = d == directions::both_ways;
  const int to = ctx.ring_at(-1), from = ctx.ring_at(1);
  constexpr int fwd = engine::tag_value(engine::message_tag::exchange_forward),
                back = engine::tag_value(engine::message_tag::exchange_backward);
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    OVERLAP_MPI(MPI_Barrier, ctx.comm());
    const double t0 = MPI_Wtime();
    MPI_Request r[4];
    int n = 0;
    OVERLAP_MPI(MPI_Irecv, in, bytes, MPI_BYTE, from, fwd, ctx.comm(), &r[n++]);
    OVERLAP_MPI(MPI_Isend, out, bytes, MPI_BYTE, to, fwd, ctx.comm(), &r[n++]);
    if (both) {
      OVERLAP_MPI(MPI_Irecv, in + bytes, bytes, MPI_BYTE, to, back, ctx.comm(), &r[n++]);
      OVERLAP_MPI(MPI_Isend, out + bytes, bytes, MPI_BYTE, from, back, ctx.comm(), &r[n++]);
    }
    OVERLAP_MPI(MPI_Waitall, n, r, MPI_STATUSES_IGNORE);
    double mine = MPI_Wtime() - t0, worst = 0;
    OVERLAP_MPI(MPI_Allreduce, &mine, &worst, 1, MPI_DOUBLE, MPI_MAX, ctx.comm());
    t.push_back(worst);
  }
  return median_of(t);
}

/// Bytes of each message when latency is timed.
inline constexpr int latency_message_bytes = 8;

/// Seconds per message of a ring of small messages in a chain: every rank
/// sends latency_message_bytes to ring_at(-1) and waits for ring_at(1)'s, over and over, as
/// a ring's steps do. The ranks leave a barrier at different times (under
/// SMPI at 64 ranks up to 12 us apart on links of 2-4 us), and a single
/// exchange timed from the barrier, slowest rank, read that skew as latency.
/// Here the first R exchanges let the chain absorb it (a rank's exchange
/// ends after its neighbour's earlier one); each rank then times `reps`
/// more, one at a time, and the median of the slowest rank's is the latency.
inline double time_latency(context& ctx, exchange_buffers buf, int reps) {
  std::byte *out = buf.out, *in = buf.in;
  constexpr int bytes = latency_message_bytes;
  const int to = ctx.ring_at(-1), from = ctx.ring_at(1);
  constexpr int tag = engine::tag_value(engine::message_tag::latency_chain);
  auto exchange = [&] {
    MPI_Request r[2];
    OVERLAP_MPI(MPI_Irecv, in, bytes, MPI_BYTE, from, tag, ctx.comm(), &r[0]);
    OVERLAP_MPI(MPI_Isend, out, bytes, MPI_BYTE, to, tag, ctx.comm(), &r[1]);
    OVERLAP_MPI(MPI_Waitall, 2, r, MPI_STATUSES_IGNORE);
  };
  OVERLAP_MPI(MPI_Barrier, ctx.comm());
  for (int i = 0; i < ctx.size(); ++i) exchange();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const double t0 = MPI_Wtime();
    exchange();
    t.push_back(MPI_Wtime() - t0);
  }
  double mine = median_of(t), worst = 0;
  OVERLAP_MPI(MPI_Allreduce, &mine, &worst, 1, MPI_DOUBLE, MPI_MAX, ctx.comm());
  return worst;
}

/// The ring links of ctx (needs >= 2 ranks).
inline link_rates measure_links(context& ctx) {
  const mpi::shared_workspaces_scope payload;  // under SMPI: one copy for every rank, never copied
  constexpr int big = 4 << 20;
  constexpr size_t two_big = size_t{2} * big;
  engine::buffer<std::byte> out(two_big), in(two_big);
  std::memset(out.data(), 1, out.size());
  link_rates l;
  const exchange_buffers buf{out.data(), in.data()};
  time_exchange(ctx, buf, big, directions::both_ways, 1);  // connections up, pages touched
  l.latency_s = time_latency(ctx, buf, 21);
  // Medians of 7: on 10 Gbit/s links the cores run TCP, and single
  // exchanges vary by 20% where ranks share cores.
  const double one = time_exchange(ctx, buf, big, directions::one_way, 7);
  const double both = time_exchange(ctx, buf, big, directions::both_ways, 7);
  l.bytes_per_s = big / std::max(one - l.latency_s, 1e-9);
  l.bytes_per_s_both = big / std::max(both - l.latency_s, 1e-9);
  return l;
}

/// Seconds per GEMM of `k` on zeroed operands, on this rank: after one
/// warm-up run, as many runs as fill about 50 ms (at least 2), total time over
/// runs. A throughput, not the median of single runs: where ranks share cores
/// (more ranks than cores), single short runs often get a core to themselves
/// and would report a rate the ranks cannot all have at once.
///
/// Under SimGrid SMPI, `settle` runs first: the samples after which a
/// simulated kernel charges every run its steady figure (backend/simulated.hpp).
/// Then two runs measure that figure; filling 50 ms of simulated time would
/// cost 32 times as many real runs on a node 32 times this core.
inline double time_gemm(const gemm_kernel& k, const gemm_operands& io, int settle = 0) {
  for (int i = 0; i < settle; ++i) k.run(io);
  // MPI_Wtime: under SimGrid SMPI the simulated clock, which is what the
  // model predicts there (a real clock would miss the platform's speed).
  const double w0 = MPI_Wtime();
  k.run(io);
  const double first = MPI_Wtime() - w0;
  const int runs = settle > 0 ? 2 : std::clamp(static_cast<int>(0.05 / std::max(first, 1e-6)), 2, 5000);
  const double t0 = MPI_Wtime();
  for (int i = 0; i < runs; ++i) k.run(io);
  return (MPI_Wtime() - t0) / runs;
}

/// The runs a simulated kernel of ctx samples before its time is steady
/// (0 on a real MPI, or where every run is timed: sim_compute::measured).
inline int settling_runs(const context& ctx) {
  return mpi::simulated && ctx.config().sim != sim_compute::measured ? ctx.config().sim_samples : 0;
}

/// The GEMM rates of t on the grid sizes^3, every rank at once; the slowest
/// rank's rate per shape.
inline gemm_rates measure_gemm(context& ctx, dtype t, const std::vector<int64_t>& sizes) {
  const int64_t top = sizes.back();
  const size_t bytes = static_cast<size_t>(top * top) * size_of(t);
  const mpi::shared_workspaces_scope zeros;  // under SMPI: one copy for every rank
  // Buffers and primitives may fail on one rank only: agreed before measuring.
  engine::buffer<std::byte> a, b, c;
  std::vector<std::shared_ptr<const gemm_kernel>> kernels;
  failure local;
  try {
    a = engine::buffer<std::byte>(bytes), b = engine::buffer<std::byte>(bytes), c = engine::buffer<std::byte>(bytes);
    std::memset(a.data(), 0, bytes), std::memset(b.data(), 0, bytes), std::memset(c.data(), 0, bytes);
    for (int64_t m : sizes)
      for (int64_t n : sizes)
        for (int64_t k : sizes) {
          gemm_desc d;
          d.m = m, d.n = n, d.k = k, d.lda = k, d.ldb = n, d.ldc = n, d.in = d.out = t;
          kernels.push_back(ctx.make_kernel(d));
        }
  } catch (...) {
    local = failure::capture(std::current_exception());
  }
  agree_on(ctx, local, "overlap: calibrating GEMM rates");
  gemm_rates g;
  g.sizes = sizes;
  size_t i = 0;
  for (int64_t m : sizes)
    for (int64_t n : sizes)
      for (int64_t k : sizes) {
        OVERLAP_MPI(MPI_Barrier, ctx.comm());
        const double s =
            time_gemm(*kernels[i++], gemm_operands().a(a.data()).b(b.data()).c(c.data()), settling_runs(ctx));
        double rate = 2.0 * double(m) * double(n) * double(k) / std::max(s, 1e-9), low = 0;
        OVERLAP_MPI(MPI_Allreduce, &rate, &low, 1, MPI_DOUBLE, MPI_MIN, ctx.comm());
        g.flops_per_s.push_back(low);
      }
  return g;
}

/// How much longer a GEMM of t and transfers on the ring links both ways
/// (progressed as the ring engine does), run at once, take than the GEMM
/// alone, when the transfers carry half of what the links move in that time:
/// the cores' cost of moving data (TCP stacks, shared-memory copies), in the
/// form seconds_per_byte reads. The largest over ranks.
inline double measure_slowdown(context& ctx, dtype t, const link_rates& l) {
  constexpr int64_t n = 1024;
  const size_t bytes = static_cast<size_t>(n * n) * size_of(t);
  const mpi::shared_workspaces_scope payload;  // under SMPI: one copy for every rank, never copied
  engine::buffer<std::byte> a(bytes), b(bytes), c(bytes);
  std::memset(a.data(), 0, bytes), std::memset(b.data(), 0, bytes), std::memset(c.data(), 0, bytes);
  gemm_desc d;
  d.m = d.n = d.k = n, d.lda = d.ldb = d.ldc = n, d.in = d.out = t;
  std::shared_ptr<const gemm_kernel> kernel;
  failure local;
  try {
    kernel = ctx.make_kernel(d);
  } catch (...) {
    local = failure::capture(std::current_exception());
  }
  agree_on(ctx, local, "overlap: calibrating the GEMM slowdown");
  const double alone = time_gemm(*kernel, gemm_operands().a(a.data()).b(b.data()).c(c.data()), settling_runs(ctx));
  // Half the slowest rank's GEMM time's worth of data each way, 64 KiB to
  // 64 MiB; the same size on every rank (the messages must match).
  double slowest = 0;
  OVERLAP_MPI(MPI_Allreduce, &alone, &slowest, 1, MPI_DOUBLE, MPI_MAX, ctx.comm());
  const auto msg =
      static_cast<int>(std::clamp(slowdown_link_share * l.bytes_per_s_both * slowest, 65536.0, double(64 << 20)));
  engine::buffer<std::byte> out(2 * static_cast<size_t>(msg)), in(2 * static_cast<size_t>(msg));
  std::memset(out.data(), 1, out.size());
  const int to = ctx.ring_at(-1), from = ctx.ring_at(1);
  constexpr int fwd = engine::tag_value(engine::message_tag::slowdown_forward),
                back = engine::tag_value(engine::message_tag::slowdown_backward);
  std::vector<double> per_byte;
  for (int rep = 0; rep < 5; ++rep) {  // median of 5: where ranks share cores, single runs vary by 20%
    OVERLAP_MPI(MPI_Barrier, ctx.comm());
    mpi::request_group& g = ctx.requests();
    OVERLAP_MPI(MPI_Irecv, in.data(), msg, MPI_BYTE, from, fwd, ctx.comm(), g.add());
    OVERLAP_MPI(MPI_Irecv, in.data() + msg, msg, MPI_BYTE, to, back, ctx.comm(), g.add());
    OVERLAP_MPI(MPI_Isend, out.data(), msg, MPI_BYTE, to, fwd, ctx.comm(), g.add());
    OVERLAP_MPI(MPI_Isend, out.data() + msg, msg, MPI_BYTE, from, back, ctx.comm(), g.add());
    const double t0 = MPI_Wtime();
    {
      engine::progress_scope progress(ctx.progress(), g);
      kernel->run(gemm_operands().a(a.data()).b(b.data()).c(c.data()));
      progress.finish();
    }
    g.wait_all();
    const double both = MPI_Wtime() - t0;
    per_byte.push_back(std::max(0.0, both - alone) / (4.0 * msg));
  }
  double mine = median_of(per_byte), worst = 0;
  OVERLAP_MPI(MPI_Allreduce, &mine, &worst, 1, MPI_DOUBLE, MPI_MAX, ctx.comm());
  return slowdown_from_seconds_per_byte(worst, l.bytes_per_s_both);
}

/// Seconds of a collective `run` runs, median of 5 after a warm-up, slowest
/// rank. Before each, `settle` (untimed).
template <class F, class S>
double time_collective(context& ctx, F&& run, S&& settle) {
  std::vector<double> t;
  for (int i = 0; i < 6; ++i) {
    settle();
    OVERLAP_MPI(MPI_Barrier, ctx.comm());
    const double t0 = MPI_Wtime();
    run();
    double mine = MPI_Wtime() - t0, worst = 0;
    OVERLAP_MPI(MPI_Allreduce, &mine, &worst, 1, MPI_DOUBLE, MPI_MAX, ctx.comm());
    if (i > 0) t.push_back(worst);
  }
  return median_of(t);
}

/// The blocks a calibration measures collectives at (bytes of one rank's
/// block): a thin operand's shard up to a square one's.
inline const std::vector<double>& collective_blocks() {
  static const std::vector<double> b{256 << 10, 4 << 20};
  return b;
}

/// The blocks measure_collectives measures at on R ranks: collective_blocks(),
/// except under SimGrid SMPI, where a rank's R blocks are capped at 64 MiB.
/// SMPI's collective algorithms allocate temporaries of that size for every
/// simulated rank, all in this one process: at 64 ranks the 4 MiB block took
/// 24 GiB and was killed for memory. Larger blocks are then priced at the
/// largest rate measured.
inline std::vector<double> measured_collective_blocks(int R) {
  std::vector<double> b = collective_blocks();
  if (!mpi::simulated) return b;
  constexpr double cap = double(64 << 20);
  for (double& x : b) x = std::min(x, cap / R);
  b.erase(std::unique(b.begin(), b.end()), b.end());
  return b;
}

/// Seconds of each collective measure_collectives times, at one block size.
struct collective_seconds {
  double allgather = 0, iallgather = 0, reduce_scatter = 0, alltoall = 0;
  double alltoall_bytes = 0;  ///< what one rank sent in the all-to-all
};

/// The collectives as the schedules call them, `block` bytes per rank (f32),
/// on buffers of R blocks each. Collective.
template <class S>
collective_seconds time_collectives(context& ctx, double block, std::byte* send, std::byte* recv, S&& settle) {
  const int R = ctx.size();
  collective_seconds c;
  const int floats = static_cast<int>(block) / 4;
  std::vector<int> counts(static_cast<size_t>(R), floats), displs(static_cast<size_t>(R));
  for (int p = 0; p < R; ++p) displs[static_cast<size_t>(p)] = p * floats;
  c.allgather = time_collective(
      ctx,
      [&] {
        OVERLAP_MPI(MPI_Allgatherv, MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, counts.data(), displs.data(), MPI_FLOAT,
                    ctx.comm());
      },
      settle);
  c.iallgather = time_collective(
      ctx,
      [&] {
        MPI_Request r = MPI_REQUEST_NULL;
        OVERLAP_MPI(MPI_Iallgatherv, MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, counts.data(), displs.data(), MPI_FLOAT,
                    ctx.comm(), &r);
        OVERLAP_MPI(MPI_Wait, &r, MPI_STATUS_IGNORE);
      },
      settle);
  c.reduce_scatter = time_collective(
      ctx, [&] { OVERLAP_MPI(MPI_Reduce_scatter, send, recv, counts.data(), MPI_FLOAT, MPI_SUM, ctx.comm()); }, settle);
  // All-to-all: `block` bytes out of each rank in all, split over the others.
  const int each = floats / (R - 1);
  std::vector<int> a2a(static_cast<size_t>(R), each), a2a_displs(static_cast<size_t>(R));
  a2a[static_cast<size_t>(ctx.rank())] = 0;
  for (int p = 0; p < R; ++p) a2a_displs[static_cast<size_t>(p)] = p * each;
  c.alltoall = time_collective(
      ctx,
      [&] {
        MPI_Request r = MPI_REQUEST_NULL;
        OVERLAP_MPI(MPI_Ialltoallv, send, a2a.data(), a2a_displs.data(), MPI_FLOAT, recv, a2a.data(), a2a_displs.data(),
                    MPI_FLOAT, ctx.comm(), &r);
        OVERLAP_MPI(MPI_Wait, &r, MPI_STATUS_IGNORE);
      },
      settle);
  c.alltoall_bytes = 4.0 * each * (R - 1);
  return c;
}

/// Open MPI's collectives on ctx as the bulk and the other-operands schedules
/// call them (needs >= 2 ranks; the ring links `l` measured first), each
/// converted to the rate the model prices it with. Collective.
inline collective_rates measure_collectives(context& ctx, const link_rates& l) {
  const int R = ctx.size();
  const double hops = R - 1;
  const std::vector<double> blocks = measured_collective_blocks(R);
  const auto top = static_cast<size_t>(blocks.back());
  // Each collective starts from links that just carried a ring exchange, as
  // a call among others does: timed back to back after other collectives,
  // MPI_Allgatherv of 4 MiB blocks on the emulated 4-node ring at 1 Gbit/s
  // ran at 0.57-0.65 Gbit/s in the model's terms, settled at 0.82, and the
  // same call in overlap-bench at 0.84.
  constexpr int settle_bytes = 512 << 10;
  // Under SMPI one copy for every rank, never copied: R blocks of 4 MiB per
  // rank would not fit at 64 ranks.
  const mpi::shared_workspaces_scope payload;
  // Every rank allocates the same: a failure is agreed before measuring.
  engine::buffer<std::byte> send, recv, s_out, s_in;
  failure local;
  try {
    send = engine::buffer<std::byte>(top * size_t(R)), recv = engine::buffer<std::byte>(top * size_t(R));
    s_out = engine::buffer<std::byte>(2 * size_t{settle_bytes}),
    s_in = engine::buffer<std::byte>(2 * size_t{settle_bytes});
    std::memset(send.data(), 0, send.size()), std::memset(recv.data(), 0, recv.size());
    std::memset(s_out.data(), 1, s_out.size());
  } catch (...) {
    local = failure::capture(std::current_exception());
  }
  agree_on(ctx, local, "overlap: calibrating collectives");
  // The model's forms: hops x (latency + block / rate), or (all-to-all)
  // hops x latency + bytes / rate; each solved for the rate.
  auto per_hop = [&](double block, double s) { return block / std::max(s / hops - l.latency_s, 1e-9); };
  auto total = [&](double bytes, double s) { return bytes / std::max(s - hops * l.latency_s, 1e-9); };
  auto settle = [&] { time_exchange(ctx, {s_out.data(), s_in.data()}, settle_bytes, directions::both_ways, 1); };
  collective_rates c;
  c.ranks = R;
  for (double block : blocks) {
    const collective_seconds s = time_collectives(ctx, block, send.data(), recv.data(), settle);
    for (collective_rate* r : {&c.allgather, &c.iallgather, &c.reduce_scatter, &c.alltoall})
      r->block_bytes.push_back(block);
    c.allgather.bytes_per_s.push_back(per_hop(block, s.allgather));
    c.iallgather.bytes_per_s.push_back(per_hop(block, s.iallgather));
    c.reduce_scatter.bytes_per_s.push_back(per_hop(block, s.reduce_scatter));
    c.alltoall.bytes_per_s.push_back(total(s.alltoall_bytes, s.alltoall));
  }
  return c;
}

/// The grid a calibration measures GEMM rates on: thin pieces of a few
/// dozen rows (their GEMMs reread the other operand per piece) up to whole
/// products of a few thousand (log-interpolated between).
inline const std::vector<int64_t>& calibration_sizes() {
  static const std::vector<int64_t> s{32, 128, 512, 2048};
  return s;
}

/// The ring links of ctx with the slowdown of a GEMM of t while they carry
/// data, and the collectives over them (needs >= 2 ranks). Collective.
inline link_rates measure_link_class(context& ctx, dtype t) {
  link_rates l = measure_links(ctx);
  l.gemm_slowdown = measure_slowdown(ctx, t, l);
  l.collectives = measure_collectives(ctx, l);
  return l;
}

/// Measures what `into` lacks for a context of this link class and element
/// type: the ring links (with >= 2 ranks) and the GEMM grid. Collective.
inline void measure_missing(context& ctx, calibration& into, link_class lc, dtype t) {
  if (!into.has(t)) into.gemm[t] = measure_gemm(ctx, t, calibration_sizes());
  if (ctx.size() >= 2 && !into.has(lc)) into.links[lc] = measure_link_class(ctx, t);
}

}  // namespace overlap::detail
