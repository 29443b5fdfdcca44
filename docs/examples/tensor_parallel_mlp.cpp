// A tensor-parallel MLP block with overlap (Megatron-style, sequence-parallel):
//
//   H = gelu(AG_rows(X) @ W1_r + b1_r)     all_gather_matmul, gathered = lhs_rows
//   Z_r = rows r of sum_r H_r @ W2_r       matmul_reduce_scatter, scattered = rows
//
// Each rank holds its rows of X (tokens), a column block of W1 and the
// matching row block of W2. Run: mpirun -np 2 ./tensor_parallel_mlp
// It checks Z against the same block computed on one rank from gathered data.
#include <overlap/overlap.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

namespace {
// Deterministic weights/activations, the same on every rank.
float value(int64_t i, int64_t j, int salt) { return float((i * 7 + j * 3 + salt) % 11) / 11.0f - 0.5f; }
float gelu(float x) { return 0.5f * x * (1.0f + std::erf(x / std::sqrt(2.0f))); }
}  // namespace

int main(int argc, char** argv) {
  overlap::mpi::environment env(argc, argv);  // MPI_Init_thread(MPI_THREAD_MULTIPLE)
  int failures = 0;
  try {
    overlap::context ctx(MPI_COMM_WORLD);  // collective: dups the communicator
    const int R = ctx.size(), p = ctx.rank();
    const int64_t tokens = 37, d_model = 16, hidden = 24;          // global sizes
    const auto rows = overlap::shard_layout::balanced(tokens, R);  // uneven when R does not divide 37
    const auto cols = overlap::shard_layout::balanced(hidden, R);
    const int64_t m_r = rows.size(p), h_r = cols.size(p);

    // This rank's shards.
    std::vector<float> x(m_r * d_model), w1(d_model * h_r), b1(h_r), w2(h_r * d_model);
    for (int64_t i = 0; i < m_r; ++i)
      for (int64_t j = 0; j < d_model; ++j) x[i * d_model + j] = value(rows.offset(p) + i, j, 1);
    for (int64_t i = 0; i < d_model; ++i)
      for (int64_t j = 0; j < h_r; ++j) w1[i * h_r + j] = value(i, cols.offset(p) + j, 2);
    for (int64_t j = 0; j < h_r; ++j) b1[j] = value(0, cols.offset(p) + j, 3);
    for (int64_t i = 0; i < h_r; ++i)
      for (int64_t j = 0; j < d_model; ++j) w2[i * d_model + j] = value(cols.offset(p) + i, j, 4);

    // 1. H = gelu(AG_rows(X) @ W1_r + b1_r): the all-gather of X hides behind the GEMMs.
    std::vector<float> h(tokens * h_r);
    overlap::ag_options ag;
    ag.gathered = overlap::gathered::lhs_rows;
    ag.epilogue = {overlap::activation::gelu, b1.data()};
    overlap::all_gather_matmul<float>(ctx, {x.data(), m_r, d_model}, {w1.data(), d_model, h_r}, {h.data(), tokens, h_r},
                                      ag);

    // 2. Z_r = this rank's rows of sum over ranks of H_r @ W2_r: the accumulators travel.
    std::vector<float> z(m_r * d_model);
    overlap::rs_options rs;
    rs.scattered = overlap::scattered::rows;
    overlap::matmul_reduce_scatter<float>(ctx, {h.data(), tokens, h_r}, {w2.data(), h_r, d_model},
                                          {z.data(), m_r, d_model}, rs);

    // Check against the unsharded computation of this rank's rows.
    double worst = 0;
    for (int64_t i = 0; i < m_r; ++i)
      for (int64_t j = 0; j < d_model; ++j) {
        double want = 0;
        for (int64_t q = 0; q < hidden; ++q) {
          double pre = value(0, q, 3);
          for (int64_t k = 0; k < d_model; ++k) pre += double(value(rows.offset(p) + i, k, 1)) * value(k, q, 2);
          want += double(gelu(float(pre))) * value(q, j, 4);
        }
        worst = std::fmax(worst, std::fabs(z[i * d_model + j] - want));
      }
    failures = worst > 1e-4 ? 1 : 0;
    std::printf("rank %d: %lld token rows, max |error| %.2e %s\n", p, static_cast<long long>(m_r), worst,
                failures ? "WRONG" : "ok");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tensor_parallel_mlp: %s\n", e.what());
    failures = 1;
  }
  return failures;
}
