// A downstream program: uneven row shards of A gathered and multiplied, then
// the product reduce-scattered back by rows, checked against plain loops.
// Built three ways by consume.sh: find_package(overlap) against an installed
// prefix, add_subdirectory of the source tree, and a plain compile with -I.
#include <overlap/overlap.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  overlap::mpi::environment env(argc, argv);
  int bad = 0;
  {
    overlap::context ctx(MPI_COMM_WORLD);
    const int R = ctx.size(), p = ctx.rank();
    const int64_t k = 6, n = 4;
    std::vector<int64_t> rows(static_cast<size_t>(R));
    for (int r = 0; r < R; ++r) rows[r] = 1 + r;  // uneven shards
    const overlap::shard_layout layout(rows);
    const int64_t m = layout.total(), m_r = layout.size(p);
    auto A = [](int64_t i, int64_t j) { return float((i + 2 * j) % 5) - 2.0f; };
    auto B = [](int64_t i, int64_t j) { return float((3 * i + j) % 4) - 1.5f; };
    std::vector<float> a(static_cast<size_t>(m_r * k)), b(static_cast<size_t>(k * n)), c(static_cast<size_t>(m * n));
    for (int64_t i = 0; i < m_r; ++i)
      for (int64_t j = 0; j < k; ++j) a[i * k + j] = A(layout.offset(p) + i, j);
    for (int64_t i = 0; i < k; ++i)
      for (int64_t j = 0; j < n; ++j) b[i * n + j] = B(i, j);
    overlap::all_gather_matmul<float>(ctx, {a.data(), m_r, k}, {b.data(), k, n}, {c.data(), m, n});
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        float want = 0;
        for (int64_t q = 0; q < k; ++q) want += A(i, q) * B(q, j);
        if (std::fabs(c[i * n + j] - want) > 1e-4f) ++bad;
      }
    // Every rank contributes C @ I; the sum, R * C, comes back scattered by rows.
    std::vector<float> eye(static_cast<size_t>(n * n), 0.0f), z(static_cast<size_t>(m_r * n));
    for (int64_t j = 0; j < n; ++j) eye[j * n + j] = 1.0f;
    overlap::rs_options rs;
    rs.scattered = overlap::scattered::rows;
    overlap::matmul_reduce_scatter<float>(ctx, {c.data(), m, n}, {eye.data(), n, n}, {z.data(), m_r, n}, rs);
    for (int64_t i = 0; i < m_r; ++i)
      for (int64_t j = 0; j < n; ++j)
        if (std::fabs(z[i * n + j] - float(R) * c[(layout.offset(p) + i) * n + j]) > 1e-4f) ++bad;
    std::printf("rank %d: consumer %s\n", p, bad ? "WRONG" : "ok");
  }
  return bad ? 1 : 0;
}
