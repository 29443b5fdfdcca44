#pragma once
// Test helpers: deterministic data, dense matrices, and the independent
// reference (a naive triple loop in double).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "overlap/backend/gemm.hpp"
#include "overlap/core/bfloat16.hpp"
#include "overlap/core/matrix.hpp"
#include "overlap/ops/options.hpp"

namespace testing_support {

/// A dense-or-strided row-major matrix that owns its storage.
template <class T>
struct matrix {
  int64_t rows = 0, cols = 0, ld = 0;
  std::vector<T> data;
  matrix() = default;
  matrix(int64_t r, int64_t c, int64_t pad = 0)
      : rows(r), cols(c), ld(c + pad), data(static_cast<size_t>(r * (c + pad)) + 1, T(0)) {}
  T& operator()(int64_t i, int64_t j) { return data[static_cast<size_t>(i * ld + j)]; }
  T operator()(int64_t i, int64_t j) const { return data[static_cast<size_t>(i * ld + j)]; }
  overlap::matrix_view<T> view() { return {data.data(), rows, cols, ld}; }
  overlap::matrix_view<const T> cview() const { return {data.data(), rows, cols, ld}; }
};

/// The same pseudo-random matrix on every rank for a given seed; values are
/// small integers / 8 so sums are exact in double.
template <class T>
matrix<T> random_matrix(int64_t rows, int64_t cols, uint32_t seed, int64_t pad = 0) {
  matrix<T> m(rows, cols, pad);
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> dist(-8, 8);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) m(i, j) = static_cast<T>(static_cast<float>(dist(gen)) / 8.0f);
  return m;
}

/// Copy of the block (r0, c0, nr, nc) of m, with optional padding.
template <class T>
matrix<T> slice(const matrix<T>& m, int64_t r0, int64_t c0, int64_t nr, int64_t nc, int64_t pad = 0) {
  matrix<T> s(nr, nc, pad);
  for (int64_t i = 0; i < nr; ++i)
    for (int64_t j = 0; j < nc; ++j) s(i, j) = m(r0 + i, c0 + j);
  return s;
}

/// C = A @ B and |A| @ |B| in double (naive loops).
struct reference {
  matrix<double> value, magnitude;
};
/// The accumulate option: c starts with this rank's own values (seeded,
/// padding untouched), returned in double for the reference.
template <class T>
matrix<double> fill_before(matrix<T>& c, uint32_t seed) {
  const matrix<T> before = random_matrix<T>(c.rows, c.cols, seed);
  matrix<double> out(c.rows, c.cols);
  for (int64_t i = 0; i < c.rows; ++i)
    for (int64_t j = 0; j < c.cols; ++j) c(i, j) = before(i, j), out(i, j) = double(before(i, j));
  return out;
}
/// ref (this rank's block, epilogue applied) + what c held before the call.
inline void add_before(reference& ref, const matrix<double>& before) {
  for (int64_t i = 0; i < before.rows; ++i)
    for (int64_t j = 0; j < before.cols; ++j) {
      ref.value(i, j) += before(i, j);
      ref.magnitude(i, j) += std::abs(before(i, j));
    }
}
/// The extra rounding of C + result in T (bf16: one more rounding to 8 bits).
template <class T>
double accumulate_rounding() {
  return std::is_same_v<T, overlap::bfloat16> ? std::ldexp(1.0, -8) : 0.0;
}

template <class T>
reference naive_matmul(const matrix<T>& a, const matrix<T>& b) {
  reference r{matrix<double>(a.rows, b.cols), matrix<double>(a.rows, b.cols)};
  for (int64_t i = 0; i < a.rows; ++i)
    for (int64_t j = 0; j < b.cols; ++j) {
      double s = 0, m = 0;
      for (int64_t k = 0; k < a.cols; ++k) {
        s += double(a(i, k)) * double(b(k, j));
        m += std::abs(double(a(i, k)) * double(b(k, j)));
      }
      r.value(i, j) = s;
      r.magnitude(i, j) = m;
    }
  return r;
}

/// Applies act(value + bias[j]) to a reference (bias may be empty), widening
/// the magnitude bound by |bias| (GELU's slope is below 1.13: bound x 1.2).
inline void reference_epilogue(reference& r, const std::vector<double>& bias, overlap::activation act) {
  for (int64_t i = 0; i < r.value.rows; ++i)
    for (int64_t j = 0; j < r.value.cols; ++j) {
      double v = r.value(i, j) + (bias.empty() ? 0.0 : bias[static_cast<size_t>(j)]);
      if (!bias.empty()) r.magnitude(i, j) += std::abs(bias[static_cast<size_t>(j)]);
      if (act == overlap::activation::relu) v = v > 0 ? v : 0;
      if (act == overlap::activation::gelu) {
        v = 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
        r.magnitude(i, j) = 1.2 * r.magnitude(i, j) + 1e-6;
      }
      r.value(i, j) = v;
    }
}

/// A per-column bias of `cols` values for rank p, and its double copy for the
/// reference (empty when the case has no bias).
template <class T>
std::vector<T> make_bias(int64_t cols, int p, bool enabled, std::vector<double>& ref) {
  std::vector<T> bias(static_cast<size_t>(cols));
  ref.clear();
  for (int64_t j = 0; j < cols; ++j) {
    bias[static_cast<size_t>(j)] = static_cast<T>(0.25f * float((j + p) % 5) - 0.5f);
    if (enabled) ref.push_back(double(bias[static_cast<size_t>(j)]));
  }
  return bias;
}

/// A strategy and an algorithm an op test runs (the valid pairs).
struct plan_choice {
  overlap::strategy strategy;
  overlap::algorithm algorithm;
};
inline const plan_choice plan_choices[] = {
    {overlap::strategy::bulk, overlap::algorithm::named},
    {overlap::strategy::ring, overlap::algorithm::named},
    {overlap::strategy::bidirectional, overlap::algorithm::named},
    {overlap::strategy::automatic, overlap::algorithm::automatic},
    {overlap::strategy::bulk, overlap::algorithm::others},
    {overlap::strategy::automatic, overlap::algorithm::others},
};
inline std::string to_string(const plan_choice& c) {
  return std::string(overlap::to_string(c.strategy)) + "_" + overlap::to_string(c.algorithm);
}

/// The option fields both ops share, from a test case (ag_case or rs_case).
template <class Options, class Case, class T>
void set_common_options(Options& opt, const Case& cs, const std::vector<T>& bias) {
  opt.strategy = cs.strategy;
  opt.algorithm = cs.algorithm;
  opt.transpose_a = cs.transpose_a;
  opt.transpose_b = cs.transpose_b;
  opt.epilogue.activation = cs.act;
  opt.epilogue.bias = cs.bias ? bias.data() : nullptr;
}

/// The transpose of m (with optional padding).
template <class T>
matrix<T> transposed(const matrix<T>& m, int64_t pad = 0) {
  matrix<T> t(m.cols, m.rows, pad);
  for (int64_t i = 0; i < m.rows; ++i)
    for (int64_t j = 0; j < m.cols; ++j) t(j, i) = m(i, j);
  return t;
}

/// Rounding bound of a K-term dot product: |fl - exact| <= gamma * sum|a_k b_k|
/// with gamma ~ K * unit roundoff for any summation order; 2x margin.
template <class T>
double dot_tolerance(int64_t k) {
  if constexpr (std::is_same_v<T, overlap::bfloat16>) {
    // Exact bf16 inputs, fp32 accumulation, one rounding of the result to
    // bf16 (unit roundoff 2^-8).
    return dot_tolerance<float>(k) + std::ldexp(1.0, -8);
  } else {
    return 2.0 * double(k + 2) * double(std::numeric_limits<T>::epsilon());
  }
}

/// Expects got == ref block (r0, c0) within the rounding bound; returns the
/// largest relative error seen.
/// extra: added to the relative bound (e.g. per-hop bf16 rounding).
template <class T>
double expect_near_block(const matrix<T>& got, const reference& ref, int64_t r0, int64_t c0, int64_t k,
                         const std::string& what, double extra = 0) {
  const double tol = dot_tolerance<T>(k) + extra;
  double worst = 0;
  int reported = 0;
  for (int64_t i = 0; i < got.rows; ++i)
    for (int64_t j = 0; j < got.cols; ++j) {
      const double want = ref.value(r0 + i, c0 + j);
      const double bound = tol * ref.magnitude(r0 + i, c0 + j) + 1e-300;
      const double err = std::abs(double(got(i, j)) - want);
      if (ref.magnitude(r0 + i, c0 + j) > 0) worst = std::max(worst, err / ref.magnitude(r0 + i, c0 + j));
      if (err > bound && reported++ < 5)
        ADD_FAILURE() << what << ": C(" << i << "," << j << ") = " << double(got(i, j)) << ", expected " << want
                      << " (bound " << bound << ")";
    }
  return worst;
}

inline int world_rank(MPI_Comm c = MPI_COMM_WORLD) {
  int r = 0;
  MPI_Comm_rank(c, &r);
  return r;
}
inline int world_size(MPI_Comm c = MPI_COMM_WORLD) {
  int s = 0;
  MPI_Comm_size(c, &s);
  return s;
}

/// Shard sizes a test chooses for `total` over `parts` ranks.
enum class split { balanced, skewed, first_empty, last_takes_all };
inline const char* to_string(split s) {
  switch (s) {
    case split::balanced: return "balanced";
    case split::skewed: return "skewed";
    case split::first_empty: return "first_empty";
    case split::last_takes_all: return "last_takes_all";
  }
  return "?";
}
inline std::vector<int64_t> shard_sizes(int64_t total, int parts, split how) {
  std::vector<int64_t> s(static_cast<size_t>(parts), 0);
  switch (how) {
    case split::balanced:
      for (int r = 0; r < parts; ++r) s[r] = total / parts + (r < total % parts ? 1 : 0);
      break;
    case split::skewed: {  // weights 1, 2, 4, ...: uneven, remainder to rank 0
      int64_t wsum = 0;
      for (int r = 0; r < parts; ++r) wsum += int64_t(1) << r;
      int64_t used = 0;
      for (int r = 0; r < parts; ++r) {
        s[r] = total * (int64_t(1) << r) / wsum;
        used += s[r];
      }
      s[0] += total - used;
      break;
    }
    case split::first_empty:
      if (parts == 1) {
        s[0] = total;
      } else {
        for (int r = 1; r < parts; ++r) s[r] = total / (parts - 1) + (r - 1 < total % (parts - 1) ? 1 : 0);
      }
      break;
    case split::last_takes_all: s[parts - 1] = total; break;
  }
  return s;
}
inline int64_t offset_of(const std::vector<int64_t>& sizes, int r) {
  int64_t o = 0;
  for (int i = 0; i < r; ++i) o += sizes[i];
  return o;
}

}  // namespace testing_support
