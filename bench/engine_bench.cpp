// Google Benchmark suite for engine pieces on one machine:
//   gemm/pieces/M/N/K/P/packed
//                      M x N x K as P row-block GEMMs, the way a ring step
//                      schedule splits a product (P = 1: one GEMM; counter
//                      plan_choice = 1: the plans' own P for that shape), reading
//                      B as stored (packed = 0) or packed once per iteration
//                      (1: what the plans do where oneDNN has a packed layout)
//   gemm_bf16/pieces/...  the same in bf16 (native or widened, as a context
//                      would choose on this CPU)
// Every GEMM benchmark is labelled with the kernel oneDNN runs. Run it
// under `mpirun -np <cores>` to measure with every core computing at once.
//   gemm/ring_steps_progress_thread
//                      the same pieces while a progress thread tests a pending
//                      request, sleeping 100 / 1000 us or yielding (its cost)
//   plan/lookup        per-call overhead of an op whose plan is cached (tiny shape)
//   ag/{bulk,ring}     all_gather_matmul on MPI_COMM_WORLD, timed as the
//                      slowest rank (run under mpirun; fixed iteration counts
//                      so every rank runs the same number of calls)
// Run: mpirun -np 2 build/bench/overlap-engine-bench
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <cstddef>
#include <string>
#include <vector>

#include "overlap/backend/onednn.hpp"
#include "overlap/overlap.hpp"
#include "overlap/schedule/chunks.hpp"

namespace {

overlap::backend::onednn_backend& backend() {
  static overlap::backend::onednn_backend be;
  return be;
}

/// M x N x K as `pieces` row-block GEMMs, the way ring steps split a product
/// (one piece: one GEMM), in f32 or bf16 (fp32 output), B read as stored or
/// packed once per run.
struct row_pieces {
  int64_t m, n, k;
  overlap::dtype in;
  std::vector<std::byte> a, b, packed;
  std::vector<float> c;
  std::vector<std::shared_ptr<const overlap::gemm_kernel>> kernels;
  std::vector<int64_t> rows;
  bool pack = false;
  row_pieces(int64_t m_, int64_t n_, int64_t k_, int64_t pieces, overlap::dtype t = overlap::dtype::f32,
             bool pack_b = false)
      : m(m_),
        n(n_),
        k(k_),
        in(t),
        a(static_cast<size_t>(m * k) * size_of(t)),
        b(static_cast<size_t>(k * n) * size_of(t)),
        c(static_cast<size_t>(m * n)) {
    for (int64_t i = 0; i < m * k; ++i) overlap::store(t, a.data(), i, 1.0);
    for (int64_t i = 0; i < k * n; ++i) overlap::store(t, b.data(), i, 1.0);
    const bool widen = t == overlap::dtype::bf16 && !overlap::backend::detail::native_bf16();
    for (int64_t q = 0; q < pieces; ++q) {
      rows.push_back(m / pieces + (q < m % pieces ? 1 : 0));
      overlap::gemm_desc d{rows.back(), n, k, k, n, n};
      d.in = t;
      d.pack_b = pack_b;
      kernels.push_back(backend().make(d, widen));
    }
    pack = pack_b && kernels.front()->packed_b_bytes() > 0;
    if (pack) packed.resize(kernels.front()->packed_b_bytes());
  }
  void run() {
    if (pack) kernels.front()->pack_b(b.data(), packed.data());
    int64_t r0 = 0;
    const auto es = static_cast<int64_t>(size_of(in));
    for (size_t q = 0; q < kernels.size(); ++q) {
      kernels[q]->run(
          overlap::gemm_operands().a(a.data() + r0 * k * es).b(pack ? packed.data() : b.data()).c(c.data() + r0 * n));
      r0 += rows[q];
    }
  }
  [[nodiscard]] std::string label() const {
    return kernels.front()->name() +
           (pack && kernels.front()->name().find("once") == std::string::npos ? ", B packed once" : "");
  }
  [[nodiscard]] benchmark::Counter rate() const {
    return benchmark::Counter(2.0 * double(m * n * k), benchmark::Counter::kIsIterationInvariantRate,
                              benchmark::Counter::kIs1000);
  }
};

// 12 pieces of the all-gather shape of gemm/pieces while a progress thread tests a
// pending request (a receive on MPI_COMM_SELF, matched after the loop), as it
// does during a ring step: what the thread costs the GEMMs on this machine.
// range(4): the thread's sleep in microseconds (0: yield).
void gemm_steps_with_progress(benchmark::State& st) {
  row_pieces work(st.range(0), st.range(1), st.range(2), st.range(3));
  overlap::engine::progress_thread progress{std::chrono::microseconds(st.range(4))};
  overlap::mpi::request_group group;
  int in = 0, out = 1;
  OVERLAP_MPI(MPI_Irecv, &in, 1, MPI_INT, 0, 99, MPI_COMM_SELF, group.add());
  for (auto _ : st) {
    overlap::engine::progress_scope scope(&progress, group);
    work.run();
    scope.finish();
  }
  OVERLAP_MPI(MPI_Send, &out, 1, MPI_INT, 0, 99, MPI_COMM_SELF);
  group.wait_all();
  st.counters["GFLOP/s"] = work.rate();
}

void plan_lookup(benchmark::State& st) {
  overlap::context ctx(MPI_COMM_WORLD);
  const int R = ctx.size();
  std::vector<float> a(1, 1.0f), b(1, 1.0f), c(static_cast<size_t>(R));
  for (auto _ : st) overlap::all_gather_matmul<float>(ctx, {a.data(), 1, 1}, {b.data(), 1, 1}, {c.data(), R, 1});
}

void ag(benchmark::State& st, overlap::strategy s) {
  overlap::context ctx(MPI_COMM_WORLD);
  const int R = ctx.size();
  const int64_t m = st.range(0), n = st.range(1), k = st.range(2), m_r = m / R;
  std::vector<float> a(static_cast<size_t>(m_r * k), 1.0f), b(static_cast<size_t>(k * n), 1.0f),
      c(static_cast<size_t>(m_r * R * n));
  overlap::ag_options opt;
  opt.strategy = s;
  for (auto _ : st) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    overlap::all_gather_matmul<float>(ctx, {a.data(), m_r, k}, {b.data(), k, n}, {c.data(), m_r * R, n}, opt);
    double mine = MPI_Wtime() - t0, slowest = 0;
    MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    st.SetIterationTime(slowest);
  }
  st.counters["GFLOP/s/rank"] = benchmark::Counter(
      2.0 * double(m_r * R * n * k), benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

// The pieces of the balanced plans `make bench` reports at 2 ranks on a
// cluster, as each rank computes them: all-gather lhs_rows M = N = K = 2048
// (B and C column-sharded: 2048 gathered rows x N_r = 1024 x K = 2048) and
// reduce-scatter rows M = N = K = 2048 (2048 rows x N = 2048 x K_r = 1024),
// each as P row pieces with P = 2 x the chunks per shard the op's plan
// chooses (schedule/chunks.hpp plan_chunks, with this CPU's rate knee).
struct plan_shape {
  int64_t m, n, k;
  bool reduce_scatter;
};
constexpr plan_shape ag_shape{2048, 1024, 2048, false}, rs_shape{2048, 2048, 1024, true};

int64_t plan_pieces(const plan_shape& s, bool f32_gemm) {
  const int64_t knee = overlap::backend::detail::gemm_jit_knee(f32_gemm, s.n);
  const int64_t shard = s.m / 2, row_bytes = (s.reduce_scatter ? s.n : s.k) * 4;
  overlap::detail::chunk_request r;  // 2 ranks on a cluster, one lane
  r.rule = s.reduce_scatter ? overlap::detail::rs_chunk_rule : overlap::detail::ag_chunk_rule;
  r.ranks = 2, r.piece_units = shard, r.bytes_per_unit = row_bytes, r.knee_units = knee;
  const int chunks = overlap::detail::plan_chunks(r);
  return 2 * int64_t{chunks};
}

bool f32_gemm(overlap::dtype t) { return t == overlap::dtype::f32 || !overlap::backend::detail::native_bf16(); }

/// range(3) pieces (1: one GEMM); range(4): B packed once per run. Counter
/// plan_choice: 1 where P is what the plan of that shape uses on this CPU.
void gemm_pieces(benchmark::State& st, overlap::dtype t) {
  row_pieces work(st.range(0), st.range(1), st.range(2), st.range(3), t, st.range(4) != 0);
  for (auto _ : st) work.run();
  st.counters["GFLOP/s"] = work.rate();
  const plan_shape& shape = st.range(1) == ag_shape.n && st.range(2) == ag_shape.k ? ag_shape : rs_shape;
  st.counters["plan_choice"] = st.range(3) == plan_pieces(shape, f32_gemm(t)) ? 1 : 0;
  st.SetLabel(work.label());
}

// Per shape: one GEMM; the plan's pieces and 12 pieces (the plans' count
// where no knee applies), as stored and packed. On the all-gather shape also
// 4 / 6 / 8 / 16 pieces: the rate as a function of the piece's rows.
void gemm_args(benchmark::internal::Benchmark* b, overlap::dtype t) {
  for (const plan_shape& s : {ag_shape, rs_shape}) {
    b->Args({s.m, s.n, s.k, 1, 0});
    const int64_t plan = plan_pieces(s, f32_gemm(t));
    std::vector<int64_t> counts{12};
    if (plan != 12) counts.push_back(plan);
    for (int64_t pieces : counts)
      for (int64_t pack : {0, 1}) b->Args({s.m, s.n, s.k, pieces, pack});
  }
  for (int64_t pieces : {4, 6, 8, 16})
    if (pieces != plan_pieces(ag_shape, f32_gemm(t))) b->Args({ag_shape.m, ag_shape.n, ag_shape.k, pieces, 0});
  b->Unit(benchmark::kMillisecond);
}

}  // namespace

BENCHMARK_CAPTURE(gemm_pieces, f32, overlap::dtype::f32)->Name("gemm/pieces")->Apply([](auto* b) {
  gemm_args(b, overlap::dtype::f32);
});
BENCHMARK_CAPTURE(gemm_pieces, bf16, overlap::dtype::bf16)->Name("gemm_bf16/pieces")->Apply([](auto* b) {
  gemm_args(b, overlap::dtype::bf16);
});
BENCHMARK(gemm_steps_with_progress)
    ->Name("gemm/ring_steps_progress_thread")
    ->Args({2048, 1024, 2048, 12, 100})
    ->Args({2048, 1024, 2048, 12, 1000})
    ->Args({2048, 1024, 2048, 12, 0})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(plan_lookup)->Name("plan/lookup")->Iterations(2000)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(ag, bulk, overlap::strategy::bulk)
    ->Name("ag/bulk")
    ->Args({2048, 1024, 2048})
    ->Iterations(10)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(ag, ring, overlap::strategy::ring)
    ->Name("ag/ring")
    ->Args({2048, 1024, 2048})
    ->Iterations(10)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

int main(int argc, char** argv) {
  overlap::mpi::environment env(argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  benchmark::Initialize(&argc, argv);
  // Every rank runs every benchmark (the MPI ones are collective); rank 0 reports.
  benchmark::ConsoleReporter console;
  benchmark::BenchmarkReporter* quiet = nullptr;
  struct null_reporter : benchmark::BenchmarkReporter {
    bool ReportContext(const Context&) override { return true; }
    void ReportRuns(const std::vector<Run>&) override {}
  } null;
  quiet = &null;
  benchmark::RunSpecifiedBenchmarks(rank == 0 ? static_cast<benchmark::BenchmarkReporter*>(&console) : quiet);
  benchmark::Shutdown();
  return 0;
}
