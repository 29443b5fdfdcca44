#pragma once
/// @file
/// The GEMM concept the engine is written against.
///
/// A backend turns a gemm_desc (shapes, strides, transposes, element types,
/// beta, epilogue) into a kernel once, when a plan is built; the ring loop then
/// only calls kernel.run(gemm_operands().a(pa).b(pb).c(pc)) with this step's
/// pointers. Backends:
/// onednn (default; f32 and bf16) and eigen (header-only fallback; f32, f64).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "overlap/core/dtype.hpp"
#include "overlap/core/epilogue.hpp"

namespace overlap {

/// C (m x n, ldc) = act(op(A) (m x k) * op(B) (k x n) [+ C] [+ D] [+ bias]).
/// op(A) = A stored m x k with lda, or, with trans_a, A^T of a k x m matrix.
/// A and B hold `in` values, C holds `out` values. "+ C" is beta = 1
/// (accumulate); D is an m x n addend of type addend_type with ld_addend (the
/// fp32 accumulator of a bf16 product); bias has n values of type out.
struct gemm_desc {
  ///@{
  /// The extents: C is m x n, the contracted dimension k.
  int64_t m = 0, n = 0, k = 0;
  ///@}
  ///@{
  /// The leading dimensions (elements between rows) of A, B and C as stored.
  int64_t lda = 0, ldb = 0, ldc = 0;
  ///@}
  bool trans_a = false;                                 ///< A is stored transposed (k x m)
  bool trans_b = false;                                 ///< B is stored transposed (n x k)
  bool accumulate = false;                              ///< C += the product (beta = 1)
  bool bias = false;                                    ///< a per-column bias of n values is added
  overlap::activation act = overlap::activation::none;  ///< applied last, after bias and accumulation
  overlap::dtype in = overlap::dtype::f32;              ///< the element type of A and B
  overlap::dtype out = overlap::dtype::f32;             ///< the element type of C (and of bias)
  bool addend = false;                                  ///< an m x n addend D is added
  int64_t ld_addend = 0;                                ///< D's leading dimension
  overlap::dtype addend_type = overlap::dtype::f32;     ///< D's element type
  /// B may be read from a packed copy (the layout the backend's kernel wants,
  /// made once by pack_b() and shared by every piece of a plan) instead of
  /// being repacked by every call; see gemm_kernel::packed_b_bytes().
  bool pack_b = false;

  /// Construction by named steps, for call sites that set more than the
  /// shape: gemm_desc::shape(m, n, k).strides(lda, ldb, ldc).transposed(ta, tb)
  /// .types(in, out).accumulating(beta_one).
  [[nodiscard]] static gemm_desc shape(int64_t m, int64_t n, int64_t k) {
    gemm_desc d;
    d.m = m, d.n = n, d.k = k;
    return d;
  }
  /// Sets lda, ldb and ldc.
  gemm_desc& strides(int64_t lda_, int64_t ldb_, int64_t ldc_) {
    lda = lda_, ldb = ldb_, ldc = ldc_;
    return *this;
  }
  /// Sets trans_a and trans_b.
  gemm_desc& transposed(bool a, bool b) {
    trans_a = a, trans_b = b;
    return *this;
  }
  /// Sets the element types of A and B (in) and of C (out).
  gemm_desc& types(overlap::dtype in_, overlap::dtype out_) {
    in = in_, out = out_;
    return *this;
  }
  /// Sets accumulate: C += the product.
  gemm_desc& accumulating(bool beta_one) {
    accumulate = beta_one;
    return *this;
  }

  /// Whether a bias or an activation follows the product.
  [[nodiscard]] bool has_epilogue() const noexcept { return bias || act != overlap::activation::none; }
  /// Every field, for comparing descriptions (kernels are cached by them).
  [[nodiscard]] auto tie() const {
    return std::tie(m, n, k, lda, ldb, ldc, trans_a, trans_b, accumulate, bias, act, in, out, addend, ld_addend,
                    addend_type, pack_b);
  }
  ///@{
  /// Orders and compares by every field (tie()).
  bool operator<(const gemm_desc& o) const { return tie() < o.tie(); }
  bool operator==(const gemm_desc& o) const { return tie() == o.tie(); }
  ///@}
};

/// The buffers of one GEMM run, set by name (five pointers in a row are
/// easily swapped): gemm_operands().a(pa).b(pb).c(pc).bias(pbias). `a` and
/// `b` are read, `c` is written; `bias` (n values of the desc's output type)
/// and `addend` only when the desc has them.
class gemm_operands {
 public:
  ///@{
  /// Sets one buffer; returns *this, so that the calls chain.
  gemm_operands& a(const void* p) noexcept { return a_ = p, *this; }
  gemm_operands& b(const void* p) noexcept { return b_ = p, *this; }
  gemm_operands& c(void* p) noexcept { return c_ = p, *this; }
  gemm_operands& bias(const void* p) noexcept { return bias_ = p, *this; }
  gemm_operands& addend(const void* p) noexcept { return addend_ = p, *this; }
  ///@}
  ///@{
  /// One buffer as set (nullptr when not set).
  [[nodiscard]] const void* a() const noexcept { return a_; }
  [[nodiscard]] const void* b() const noexcept { return b_; }
  [[nodiscard]] void* c() const noexcept { return c_; }
  [[nodiscard]] const void* bias() const noexcept { return bias_; }
  [[nodiscard]] const void* addend() const noexcept { return addend_; }
  ///@}

 private:
  const void* a_ = nullptr;
  const void* b_ = nullptr;
  void* c_ = nullptr;
  const void* bias_ = nullptr;
  const void* addend_ = nullptr;
};

/// A GEMM of one fixed gemm_desc, ready to run on any pointers of the desc's
/// types. Not thread-safe.
class gemm_kernel {
 public:
  virtual ~gemm_kernel() = default;
  /// b is the packed copy when packed_b_bytes() > 0.
  virtual void run(const gemm_operands& io) const = 0;
  /// Bytes of the packed copy of B this kernel reads, or 0 when it reads B as
  /// stored (the desc did not ask for packing, or the backend has no packed
  /// layout on this CPU: oneDNN 2.6 has one from AVX512_CORE on).
  [[nodiscard]] virtual size_t packed_b_bytes() const { return 0; }
  /// Identifies the packed layout: kernels with equal ids share one packed B.
  [[nodiscard]] virtual uint64_t packed_b_layout() const { return 0; }
  /// Writes the packed copy of B (stored as the desc says) to dst.
  virtual void pack_b(const void* /*b*/, void* /*dst*/) const {}
  /// The implementation that runs, e.g. oneDNN's "brg:avx512_core".
  [[nodiscard]] virtual std::string name() const { return "?"; }
};

/// A GEMM run as row bands of C, one kernel per band, with a hook called
/// between two bands (the poll progress policy tests outstanding requests
/// there: Open MPI moves data only inside MPI calls).
class banded_kernel final : public gemm_kernel {
 public:
  using hook = void (*)(void*);  ///< called between two bands with its argument
  /// One row band of C.
  struct band {
    int64_t r0 = 0;                             ///< its first row of C
    std::shared_ptr<const gemm_kernel> kernel;  ///< its GEMM
  };
  /// bands: row bands of d in order, non-empty; when they read a packed B
  /// they must share its layout (shares_packed_b), since run() hands every
  /// band the one copy.
  banded_kernel(const gemm_desc& d, std::vector<band> bands, hook between, void* arg)
      : d_(d), bands_(std::move(bands)), between_(between), arg_(arg) {}
  /// Whether kernels made for bands of one product can read one packed B.
  [[nodiscard]] static bool shares_packed_b(const std::vector<band>& bands) {
    for (const band& b : bands)
      if (b.kernel->packed_b_layout() != bands.front().kernel->packed_b_layout() ||
          b.kernel->packed_b_bytes() != bands.front().kernel->packed_b_bytes())
        return false;
    return true;
  }
  // B packed once per plan call serves every band, as it serves every piece.
  [[nodiscard]] size_t packed_b_bytes() const override { return bands_.front().kernel->packed_b_bytes(); }
  [[nodiscard]] uint64_t packed_b_layout() const override { return bands_.front().kernel->packed_b_layout(); }
  void pack_b(const void* b, void* dst) const override { bands_.front().kernel->pack_b(b, dst); }
  void run(const gemm_operands& io) const override {
    const auto* pa = static_cast<const std::byte*>(io.a());
    auto* pc = static_cast<std::byte*>(io.c());
    const auto* pd = static_cast<const std::byte*>(io.addend());
    for (size_t i = 0; i < bands_.size(); ++i) {
      if (i > 0) between_(arg_);
      const int64_t r0 = bands_[i].r0;
      // Rows r0.. of op(A): columns of A when it is stored transposed.
      const int64_t a_off = (d_.trans_a ? r0 : r0 * d_.lda) * static_cast<int64_t>(size_of(d_.in));
      const int64_t c_off = r0 * d_.ldc * static_cast<int64_t>(size_of(d_.out));
      const int64_t d_off = r0 * d_.ld_addend * static_cast<int64_t>(size_of(d_.addend_type));
      gemm_operands rows = io;
      rows.a(pa + a_off).c(pc + c_off).addend(pd == nullptr ? nullptr : pd + d_off);
      bands_[i].kernel->run(rows);
    }
  }

 private:
  gemm_desc d_;
  std::vector<band> bands_;
  hook between_;
  void* arg_;
};

namespace detail {
inline double activate(double x, activation a) {
  switch (a) {
    case activation::none: return x;
    case activation::relu: return x > 0 ? x : 0;
    case activation::gelu: return 0.5 * x * (1.0 + std::erf(x * 0.70710678118654752440));
  }
  return x;
}

/// C = act(C [+ D] [+ bias]) as a pass over C, for backends without fused
/// post-ops and for shapes that need no library call.
inline void apply_epilogue(const gemm_desc& d, const gemm_operands& io) {
  if (!d.has_epilogue() && !d.addend) return;
  void* c = io.c();
  const void *bias = io.bias(), *addend = io.addend();
  for (int64_t i = 0; i < d.m; ++i)
    for (int64_t j = 0; j < d.n; ++j) {
      double v = load(d.out, c, i * d.ldc + j);
      if (d.addend) v += load(d.addend_type, addend, i * d.ld_addend + j);
      if (d.bias) v += load(d.out, bias, j);
      store(d.out, c, i * d.ldc + j, activate(v, d.act));
    }
}

/// The pass that finishes an m x n C (type t, rows ldc apart) after a
/// collective summed the products, run by run_degenerate (k = 0): C =
/// act(C + bias) where the sums landed in C, or, `from_sums`, C = act(sums
/// + bias) from a workspace of sums of type `acc`, rows `ld_sums` apart (the
/// addend). Bias and activation as the call's epilogue has them.
inline gemm_desc finishing_pass(int64_t m, int64_t n, int64_t ldc, overlap::dtype t, bool bias, overlap::activation act,
                                bool from_sums, int64_t ld_sums, overlap::dtype acc) {
  gemm_desc d = gemm_desc::shape(m, n, 0).strides(0, 0, ldc).types(t, t);
  d.accumulate = !from_sums;
  d.bias = bias, d.act = act;
  if (from_sums) d.addend = true, d.ld_addend = ld_sums, d.addend_type = acc;
  return d;
}

/// The shapes every backend handles the same way without calling the library:
/// an empty output, or an empty contraction (C = 0 or C unchanged, then the
/// addend and epilogue). Returns true when it handled the call.
inline bool run_degenerate(const gemm_desc& d, const gemm_operands& io) {
  if (d.m == 0 || d.n == 0) return true;
  if (d.k != 0) return false;
  if (!d.accumulate)
    for (int64_t i = 0; i < d.m; ++i)
      for (int64_t j = 0; j < d.n; ++j) store(d.out, io.c(), i * d.ldc + j, 0.0);
  apply_epilogue(d, io);
  return true;
}
}  // namespace detail

}  // namespace overlap
