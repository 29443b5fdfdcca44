#pragma once
// ScaLAPACK PSGEMM as a peer in benchmarks (only when overlap-bench was built
// with Debian's libscalapack-openmpi-dev): the same global C = A @ B on a
// P x Q BLACS grid in block-cyclic blocks (ScaLAPACK's own, column-major
// layout); overlap-bench searches the grid shape and block size. Timed is
// PSGEMM alone, on data already distributed.
#include <mpi.h>

#include <algorithm>
#include <cmath>
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
void descinit_(int* desc, const int* m, const int* n, const int* mb, const int* nb, const int* irsrc, const int* icsrc,
               const int* ictxt, const int* lld, int* info);
void psgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const float* alpha,
             const float* a, const int* ia, const int* ja, const int* desca, const float* b, const int* ib,
             const int* jb, const int* descb, const float* beta, float* c, const int* ic, const int* jc,
             const int* descc);
}

namespace overlap::apps {

/// A P x Q process grid with mb x nb blocks (block-cyclic, ScaLAPACK's layout).
struct scalapack_layout {
  int p = 1, q = 1, mb = 64, nb = 64;
  [[nodiscard]] std::string text() const {
    return std::to_string(p) + "x" + std::to_string(q) + " grid, " + std::to_string(mb) + "x" + std::to_string(nb) +
           " blocks";
  }
};

struct scalapack_peer {
  std::string name = "scalapack_psgemm";
  scalapack_layout layout;
  std::function<void()> body;
  /// max |c - ref| / max |ref| over this rank's elements of C; ref(rows, cols)
  /// gives the exact product of the given global rows and columns (row-major).
  std::function<double(
      const std::function<std::vector<double>(const std::vector<int64_t>&, const std::vector<int64_t>&)>&)>
      error;
};

/// The global indices a rank holds of a dimension of extent n in blocks of nb
/// over `procs` processes (block-cyclic from process 0).
inline std::vector<int64_t> cyclic_indices(int n, int nb, int me, int procs) {
  std::vector<int64_t> out;
  for (int b = me * nb; b < n; b += procs * nb)
    for (int i = b; i < std::min(n, b + nb); ++i) out.push_back(i);
  return out;
}

/// PSGEMM of the global C = A @ B (value(i, j, salt): A with salt 1, B with
/// salt 2) on `lay`, or nothing when the layout does not fit the ranks.
inline std::optional<scalapack_peer> make_scalapack_peer(
    int m, int n, int k, scalapack_layout lay, const std::function<float(int64_t, int64_t, uint32_t)>& value) {
  struct state {
    int ctxt = -1;
    int desca[9], descb[9], descc[9];
    std::vector<float> a, b, c;
    std::vector<int64_t> rows_m, cols_k, rows_k, cols_n;
    int m, n, k;
    ~state() {
      if (ctxt >= 0) Cblacs_gridexit(ctxt);
    }
  };
  int R = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &R);
  if (lay.p * lay.q != R) return std::nullopt;
  auto s = std::make_shared<state>();
  s->m = m, s->n = n, s->k = k;
  Cblacs_get(-1, 0, &s->ctxt);
  Cblacs_gridinit(&s->ctxt, "Row", lay.p, lay.q);
  int prow = 0, pcol = 0, nprow = 0, npcol = 0;
  Cblacs_gridinfo(s->ctxt, &nprow, &npcol, &prow, &pcol);
  const int zero = 0, mb = lay.mb, nb = lay.nb;
  // A is m x k in mb x nb blocks, B k x n, C m x n: rows over grid rows, columns over grid columns.
  s->rows_m = cyclic_indices(m, mb, prow, nprow);
  s->cols_k = cyclic_indices(k, nb, pcol, npcol);
  s->rows_k = cyclic_indices(k, mb, prow, nprow);
  s->cols_n = cyclic_indices(n, nb, pcol, npcol);
  const int lld_a = std::max<int>(1, static_cast<int>(s->rows_m.size()));
  const int lld_b = std::max<int>(1, static_cast<int>(s->rows_k.size()));
  int info = 0, bad = 0;
  descinit_(s->desca, &m, &k, &mb, &nb, &zero, &zero, &s->ctxt, &lld_a, &info);
  bad |= info;
  descinit_(s->descb, &k, &n, &mb, &nb, &zero, &zero, &s->ctxt, &lld_b, &info);
  bad |= info;
  descinit_(s->descc, &m, &n, &mb, &nb, &zero, &zero, &s->ctxt, &lld_a, &info);
  bad |= info;
  int any = 0;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_BOR, MPI_COMM_WORLD);
  if (any != 0) return std::nullopt;
  const size_t la = s->rows_m.size(), lb = s->rows_k.size();
  s->a.resize(std::max<size_t>(1, la * s->cols_k.size()));
  s->b.resize(std::max<size_t>(1, lb * s->cols_n.size()));
  s->c.resize(std::max<size_t>(1, la * s->cols_n.size()));
  for (size_t j = 0; j < s->cols_k.size(); ++j)
    for (size_t i = 0; i < la; ++i) s->a[j * la + i] = value(s->rows_m[i], s->cols_k[j], 1);
  for (size_t j = 0; j < s->cols_n.size(); ++j)
    for (size_t i = 0; i < lb; ++i) s->b[j * lb + i] = value(s->rows_k[i], s->cols_n[j], 2);
  scalapack_peer peer;
  peer.layout = lay;
  peer.body = [s] {
    const float alpha = 1.0f, beta = 0.0f;
    const int one_ = 1;
    psgemm_("N", "N", &s->m, &s->n, &s->k, &alpha, s->a.data(), &one_, &one_, s->desca, s->b.data(), &one_, &one_,
            s->descb, &beta, s->c.data(), &one_, &one_, s->descc);
  };
  peer.error = [s](const auto& reference) {
    const std::vector<double> ref = reference(s->rows_m, s->cols_n);
    const size_t nr = s->rows_m.size(), nc = s->cols_n.size();
    double num = 0, den = 0;
    for (size_t i = 0; i < nr; ++i)
      for (size_t j = 0; j < nc; ++j) {
        num = std::max(num, std::abs(double(s->c[j * nr + i]) - ref[i * nc + j]));
        den = std::max(den, std::abs(ref[i * nc + j]));
      }
    return den > 0 ? num / den : num;
  };
  return peer;
}

}  // namespace overlap::apps
