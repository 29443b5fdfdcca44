// A consumer that uses overlap header-only: compiled with just the include
// path and the dependencies (MPI, oneDNN, Eigen, OpenMP), no overlap library.
// It gathers A's rows over the ranks, multiplies, and checks against a loop.
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
    const int64_t k = 8, n = 5, m_local = 3 + p;  // uneven row shards
    int64_t m = 0, off = 0;
    for (int r = 0; r < R; ++r) {
      if (r == p) off = m;
      m += 3 + r;
    }
    auto a_val = [](int64_t i, int64_t j) { return float((i * 3 + j) % 7) - 3.0f; };
    auto b_val = [](int64_t i, int64_t j) { return float((i + 2 * j) % 5) - 2.0f; };
    std::vector<float> a(static_cast<size_t>(m_local * k)), b(static_cast<size_t>(k * n)), c(static_cast<size_t>(m * n));
    for (int64_t i = 0; i < m_local; ++i)
      for (int64_t j = 0; j < k; ++j) a[i * k + j] = a_val(off + i, j);
    for (int64_t i = 0; i < k; ++i)
      for (int64_t j = 0; j < n; ++j) b[i * n + j] = b_val(i, j);
    overlap::all_gather_matmul<float>(ctx, {a.data(), m_local, k}, {b.data(), k, n}, {c.data(), m, n});
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        float want = 0;
        for (int64_t q = 0; q < k; ++q) want += a_val(i, q) * b_val(q, j);
        if (std::fabs(c[i * n + j] - want) > 1e-4f) ++bad;
      }
    std::printf("rank %d: header-only all_gather_matmul %s\n", p, bad ? "WRONG" : "ok");
  }
  return bad ? 1 : 0;
}
