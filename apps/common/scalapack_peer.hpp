#pragma once
// ScaLAPACK PSGEMM as a peer in benchmarks (only when overlap-bench was built
// with Debian's libscalapack-openmpi-dev): the same global C = A @ B on a
// 1 x R BLACS grid, column blocks of A, B and C per rank (ScaLAPACK's own,
// column-major layout). Timed is PSGEMM alone, on data already distributed.
#include <mpi.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

extern "C" {
void Cblacs_get(int ctxt, int what, int* val);
void Cblacs_gridinit(int* ctxt, const char* order, int rows, int cols);
void Cblacs_gridinfo(int ctxt, int* rows, int* cols, int* row, int* col);
void Cblacs_gridexit(int ctxt);
int numroc_(const int* n, const int* nb, const int* iproc, const int* isrcproc, const int* nprocs);
void descinit_(int* desc, const int* m, const int* n, const int* mb, const int* nb, const int* irsrc,
               const int* icsrc, const int* ictxt, const int* lld, int* info);
void psgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const float* alpha,
             const float* a, const int* ia, const int* ja, const int* desca, const float* b, const int* ib,
             const int* jb, const int* descb, const float* beta, float* c, const int* ic, const int* jc,
             const int* descc);
}

namespace overlap::apps {

struct scalapack_peer {
  std::string name = "scalapack_psgemm";
  std::function<void()> body;
  /// This rank's block of C as (first column, columns), row-major, for checking.
  std::function<std::vector<float>()> c_block;
  int64_t c0 = 0, nc = 0;
};

/// value(i, j, salt) gives the global A (salt 1) and B (salt 2).
inline std::optional<scalapack_peer> make_scalapack_peer(int m, int n, int k,
                                                         const std::function<float(int64_t, int64_t, uint32_t)>& value) {
  struct state {
    int ctxt = -1;
    int desca[9], descb[9], descc[9];
    std::vector<float> a, b, c;
    int m, n, k, nloc;
    ~state() {
      if (ctxt >= 0) Cblacs_gridexit(ctxt);
    }
  };
  int R = 1, p = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &R);
  MPI_Comm_rank(MPI_COMM_WORLD, &p);
  auto s = std::make_shared<state>();
  s->m = m, s->n = n, s->k = k;
  Cblacs_get(-1, 0, &s->ctxt);
  Cblacs_gridinit(&s->ctxt, "Row", 1, R);
  int prow = 0, pcol = 0, nprow = 0, npcol = 0;
  Cblacs_gridinfo(s->ctxt, &nprow, &npcol, &prow, &pcol);
  const int zero = 0;
  const int nb_k = (k + R - 1) / R, nb_n = (n + R - 1) / R;
  const int kloc = numroc_(&k, &nb_k, &pcol, &zero, &npcol);
  s->nloc = numroc_(&n, &nb_n, &pcol, &zero, &npcol);
  const int lld_m = std::max(1, m), lld_k = std::max(1, k);
  int info = 0;
  descinit_(s->desca, &m, &k, &m, &nb_k, &zero, &zero, &s->ctxt, &lld_m, &info);
  descinit_(s->descb, &k, &n, &k, &nb_n, &zero, &zero, &s->ctxt, &lld_k, &info);
  descinit_(s->descc, &m, &n, &m, &nb_n, &zero, &zero, &s->ctxt, &lld_m, &info);
  if (info != 0) return std::nullopt;
  // One block per rank on a 1 x R grid: rank p holds columns [p * nb, ...).
  s->a.resize(static_cast<size_t>(m) * std::max(1, kloc));
  s->b.resize(static_cast<size_t>(k) * std::max(1, s->nloc));
  s->c.resize(static_cast<size_t>(m) * std::max(1, s->nloc));
  for (int j = 0; j < kloc; ++j)
    for (int i = 0; i < m; ++i) s->a[static_cast<size_t>(j) * m + i] = value(i, pcol * nb_k + j, 1);
  for (int j = 0; j < s->nloc; ++j)
    for (int i = 0; i < k; ++i) s->b[static_cast<size_t>(j) * k + i] = value(i, pcol * nb_n + j, 2);
  scalapack_peer peer;
  peer.c0 = static_cast<int64_t>(pcol) * nb_n;
  peer.nc = s->nloc;
  peer.body = [s] {
    const float alpha = 1.0f, beta = 0.0f;
    const int one_ = 1;
    psgemm_("N", "N", &s->m, &s->n, &s->k, &alpha, s->a.data(), &one_, &one_, s->desca, s->b.data(), &one_, &one_,
            s->descb, &beta, s->c.data(), &one_, &one_, s->descc);
  };
  peer.c_block = [s] {
    std::vector<float> rm(static_cast<size_t>(s->m) * s->nloc);
    for (int i = 0; i < s->m; ++i)
      for (int j = 0; j < s->nloc; ++j) rm[static_cast<size_t>(i) * s->nloc + j] = s->c[static_cast<size_t>(j) * s->m + i];
    return rm;
  };
  return peer;
}

}  // namespace overlap::apps
