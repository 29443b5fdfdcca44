#pragma once
// The obvious hand-written alternative to the ring, as a peer in benchmarks:
// split the collective into chunks with MPI's non-blocking collectives and
// compute one chunk while the next one's collective is in flight.
//   ag lhs_rows: MPI_Iallgatherv of chunk q + 1 of every rank's rows while
//                the GEMMs of chunk q run;
//   rs rows:     the GEMMs of chunk q + 1 while chunk q's MPI_Ireduce_scatter
//                runs.
// Nothing but these MPI calls progresses the transfers (no helper thread):
// that is what a user gets without a library like this one.
#include <mpi.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "overlap/backend/onednn.hpp"
#include "overlap/core/matrix.hpp"

namespace overlap::apps {

struct peer {
  std::string name;
  std::function<void()> body;
};

/// rows of shard r in chunk q of `chunks`.
inline std::pair<int64_t, int64_t> chunk_rows(const shard_layout& l, int r, int chunks, int q) {
  const int64_t n = l.size(r);
  const int64_t b = n / chunks * q + std::min<int64_t>(q, n % chunks);
  const int64_t e = n / chunks * (q + 1) + std::min<int64_t>(q + 1, n % chunks);
  return {l.offset(r) + b, e - b};
}

/// {size, rank} of MPI_COMM_WORLD.
inline std::pair<int, int> world() {
  int R = 1, p = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &R);
  MPI_Comm_rank(MPI_COMM_WORLD, &p);
  return {R, p};
}

/// ag lhs_rows: a = A[M_p, :] (dense), b = K x N_p, c = M x N_p.
inline std::optional<peer> ag_rows_pipeline(int chunks, int64_t m, matrix_view<const float> a,
                                            matrix_view<const float> b, matrix_view<float> c) {
  struct state {
    backend::onednn_backend be;
    shard_layout layout;
    std::vector<float> buf[2];
    std::vector<int> counts[2], displs[2];  // per buffer: MPI reads them until the gather completes
    MPI_Request req = MPI_REQUEST_NULL;
  };
  const auto [R, p] = world();
  auto s = std::make_shared<state>();
  s->layout = shard_layout::balanced(m, R);
  const int64_t K = a.cols;
  for (auto& v : s->buf) v.resize(static_cast<size_t>((m / chunks + R) * K + 1));
  for (int i = 0; i < 2; ++i) {
    s->counts[i].resize(static_cast<size_t>(R));
    s->displs[i].resize(static_cast<size_t>(R));
  }
  auto post = [s, R = R, p = p, chunks, K, a](int q) {
    auto& counts = s->counts[q % 2];
    auto& displs = s->displs[q % 2];
    int off = 0;
    for (int r = 0; r < R; ++r) {
      counts[r] = static_cast<int>(chunk_rows(s->layout, r, chunks, q).second * K);
      displs[r] = off;
      off += counts[r];
    }
    const auto mine = chunk_rows(s->layout, p, chunks, q);
    MPI_Iallgatherv(a.data + (mine.first - s->layout.offset(p)) * a.ld, counts[p], MPI_FLOAT, s->buf[q % 2].data(),
                    counts.data(), displs.data(), MPI_FLOAT, MPI_COMM_WORLD, &s->req);
  };
  auto body = [s, R = R, chunks, K, b, c, post] {
    post(0);
    for (int q = 0; q < chunks; ++q) {
      MPI_Wait(&s->req, MPI_STATUS_IGNORE);
      const auto& displs = s->displs[q % 2];
      if (q + 1 < chunks) post(q + 1);
      for (int r = 0; r < R; ++r) {
        const auto [row0, rows] = chunk_rows(s->layout, r, chunks, q);
        if (rows == 0) continue;
        const gemm_desc d{rows, b.cols, K, K, b.ld, c.ld};
        s->be.make(d)->run(gemm_operands().a(s->buf[q % 2].data() + displs[r]).b(b.data).c(c.data + row0 * c.ld));
      }
    }
  };
  return peer{"iallgatherv_pipeline", body};
}

/// rs rows: a = M x K_p, b = K_p x N (dense), c = M_p x N.
inline std::optional<peer> rs_rows_pipeline(int chunks, int64_t m, matrix_view<const float> a,
                                            matrix_view<const float> b, matrix_view<float> c) {
  struct state {
    backend::onednn_backend be;
    shard_layout layout;
    std::vector<float> buf[2];
    std::vector<int> counts[2];
    MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  };
  const auto [R, p] = world();
  auto s = std::make_shared<state>();
  s->layout = shard_layout::balanced(m, R);
  const int64_t N = b.cols;
  for (auto& v : s->buf) v.resize(static_cast<size_t>((m / chunks + R) * N + 1));
  for (auto& v : s->counts) v.resize(static_cast<size_t>(R));
  auto body = [s, R = R, p = p, chunks, N, a, b, c] {
    for (int q = 0; q < chunks; ++q) {
      const int slot = q % 2;
      MPI_Wait(&s->req[slot], MPI_STATUS_IGNORE);  // chunk q - 2 no longer reads this buffer
      int64_t off = 0;
      for (int r = 0; r < R; ++r) {  // P_q: rank r's chunk-q rows, stacked in rank order
        const auto [row0, rows] = chunk_rows(s->layout, r, chunks, q);
        s->counts[slot][r] = static_cast<int>(rows * N);
        if (rows > 0) {
          const gemm_desc d{rows, N, a.cols, a.ld, b.ld, N};
          s->be.make(d)->run(gemm_operands().a(a.data + row0 * a.ld).b(b.data).c(s->buf[slot].data() + off));
        }
        off += rows * N;
      }
      const auto mine = chunk_rows(s->layout, p, chunks, q);
      MPI_Ireduce_scatter(s->buf[slot].data(), c.data + (mine.first - s->layout.offset(p)) * c.ld,
                          s->counts[slot].data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &s->req[slot]);
    }
    MPI_Waitall(2, s->req, MPI_STATUSES_IGNORE);
  };
  return peer{"ireduce_scatter_pipeline", body};
}

}  // namespace overlap::apps
