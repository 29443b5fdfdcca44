// The GEMM backends against the naive reference: strides, transposes,
// beta = 1 accumulation and empty shapes. Local (no communication).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "overlap/backend/eigen.hpp"
#include "overlap/backend/onednn.hpp"
#include "overlap/backend/sampled_work.hpp"
#include "overlap/backend/simulated.hpp"
#include "overlap/core/matrix.hpp"
#include "overlap/kernels/local_gemm.hpp"
#include "overlap/mpi/simulator.hpp"
#include "overlap/mpi/workspace_allocator.hpp"
#include "reference.hpp"

using namespace testing_support;

namespace {

template <class T, class Backend>
void check_backend(Backend& be) {
  uint32_t seed = 1;
  const int64_t dims[][3] = {{1, 1, 1}, {5, 7, 3}, {33, 17, 64}, {4, 6, 0}, {0, 3, 2}};
  for (const auto& d : dims)
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (bool acc : {false, true}) {
          const int64_t m = d[0], n = d[1], k = d[2], pad = 2;
          auto A = random_matrix<T>(m, k, seed++);
          auto B = random_matrix<T>(k, n, seed++);
          // Stored forms: transposed operands are kept as their transpose.
          matrix<T> as = ta ? matrix<T>(k, m, pad) : slice(A, 0, 0, m, k, pad);
          matrix<T> bs = tb ? matrix<T>(n, k, pad) : slice(B, 0, 0, k, n, pad);
          if (ta)
            for (int64_t i = 0; i < m; ++i)
              for (int64_t j = 0; j < k; ++j) as(j, i) = A(i, j);
          if (tb)
            for (int64_t i = 0; i < k; ++i)
              for (int64_t j = 0; j < n; ++j) bs(j, i) = B(i, j);
          auto C0 = random_matrix<T>(m, n, seed++, pad);
          auto C = C0;
          overlap::gemm_desc desc{m, n, k, as.ld, bs.ld, C.ld, ta, tb, acc};
          desc.in = desc.out = overlap::dtype_of<T>();
          be.make(desc)->run(overlap::gemm_operands().a(as.data.data()).b(bs.data.data()).c(C.data.data()));
          auto ref = naive_matmul(A, B);
          if (acc)
            for (int64_t i = 0; i < m; ++i)
              for (int64_t j = 0; j < n; ++j) {
                ref.value(i, j) += C0(i, j);
                ref.magnitude(i, j) += std::abs(double(C0(i, j)));
              }
          expect_near_block(C, ref, 0, 0, k + 1,
                            "m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) + " ta=" +
                                std::to_string(ta) + " tb=" + std::to_string(tb) + " acc=" + std::to_string(acc));
        }
}

TEST(backend, onednn_float) {
  overlap::backend::onednn_backend be;
  check_backend<float>(be);
}
TEST(backend, eigen_float) {
  overlap::backend::eigen_backend be;
  check_backend<float>(be);
}
TEST(backend, eigen_double) {
  overlap::backend::eigen_backend be;
  check_backend<double>(be);
}

TEST(backend, onednn_caches_kernels_by_shape) {
  overlap::backend::onednn_backend be;
  const overlap::gemm_desc d{8, 8, 8, 8, 8, 8, false, false, false};
  EXPECT_EQ(be.make(d).get(), be.make(d).get());
  overlap::gemm_desc other = d;
  other.in = overlap::dtype::bf16;
  const bool widen = !overlap::backend::detail::native_bf16();
  EXPECT_NE(be.make(d).get(), be.make(other, widen).get());
}

// The cache does not keep kernels alive: a plan's kernels go when the plan goes.
TEST(backend, onednn_cache_holds_no_unused_kernel) {
  overlap::backend::onednn_backend be;
  {
    auto k1 = be.make({8, 8, 8, 8, 8, 8});
    auto k2 = be.make({4, 8, 8, 8, 8, 8});
    EXPECT_EQ(be.live_kernels(), 2u);
  }
  EXPECT_EQ(be.live_kernels(), 0u);
}

// bf16 operands with fp32 accumulation, through a kernel made with `widen`:
// into an fp32 C, and into a bf16 C (optionally accumulating) with an addend
// (fp32, or bf16 as with bf16 transfers), bias and activation fused (the last
// ring step), plain and transposed.
void check_bf16(bool widen) {
  overlap::backend::onednn_backend be;
  using overlap::bfloat16;
  const int64_t m = 9, n = 13, k = 70;
  std::vector<bfloat16> bias(static_cast<size_t>(n));
  std::vector<double> bias_ref;
  for (int64_t j = 0; j < n; ++j) bias_ref.push_back(double(float(bias[j] = bfloat16(0.5f - 0.125f * float(j % 4)))));
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (int mode = 0; mode < 4; ++mode) {  // f32 out; bf16 out + f32 addend; + accumulate; bf16 addend
        const auto LA = random_matrix<bfloat16>(m, k, 1), LB = random_matrix<bfloat16>(k, n, 2);
        const auto A = ta ? transposed(LA) : LA;  // as stored
        const auto B = tb ? transposed(LB) : LB;
        auto ref = naive_matmul(LA, LB);
        overlap::gemm_desc d{m, n, k, A.ld, B.ld, n, ta, tb};
        d.in = overlap::dtype::bf16;
        const std::string what = std::string(widen ? "widened" : "native") + " mode " + std::to_string(mode) +
                                 " ta=" + std::to_string(ta) + " tb=" + std::to_string(tb);
        if (mode == 0) {
          d.out = overlap::dtype::f32;
          matrix<float> C(m, n);
          be.make(d, widen)->run(overlap::gemm_operands().a(A.data.data()).b(B.data.data()).c(C.data.data()));
          expect_near_block(C, ref, 0, 0, k, what);
          continue;
        }
        d.out = overlap::dtype::bf16;
        d.accumulate = mode == 2;
        const auto Df = random_matrix<float>(m, n, 3, 1);
        const auto Db = random_matrix<bfloat16>(m, n, 4, 1);
        d.addend = true, d.ld_addend = Df.ld;  // Db has the same padding
        d.addend_type = mode == 3 ? overlap::dtype::bf16 : overlap::dtype::f32;
        d.bias = true, d.act = overlap::activation::gelu;
        matrix<bfloat16> C = random_matrix<bfloat16>(m, n, 5);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            const double add = mode == 3 ? double(float(Db(i, j))) : double(Df(i, j));
            ref.value(i, j) += add + (d.accumulate ? double(float(C(i, j))) : 0.0);
            ref.magnitude(i, j) += std::abs(add) + (d.accumulate ? std::abs(double(float(C(i, j)))) : 0.0);
          }
        reference_epilogue(ref, bias_ref, d.act);
        const void* addend = mode == 3 ? static_cast<const void*>(Db.data.data()) : Df.data.data();
        be.make(d, widen)->run(overlap::gemm_operands()
                                   .a(A.data.data())
                                   .b(B.data.data())
                                   .c(C.data.data())
                                   .bias(bias.data())
                                   .addend(addend));
        expect_near_block(C, ref, 0, 0, k + 2, what);
      }
}

TEST(backend, onednn_bf16_native) {
  if (!overlap::backend::detail::native_bf16())
    GTEST_SKIP() << "oneDNN has no bf16 matmul at ISA " << overlap::backend::detail::effective_isa()
                 << " (2.6 needs AVX512_CORE); the widened path is tested below";
  check_bf16(false);
}
TEST(backend, onednn_bf16_widened) { check_bf16(true); }

// A kernel made with pack_b reads B from the copy its pack_b() makes (where the
// backend has a packed layout here; otherwise B as stored): same results.
TEST(backend, packed_b_gives_the_same_product) {
  overlap::backend::onednn_backend be;
  using overlap::bfloat16;
  const int64_t m = 37, n = 70, k = 45;
  for (bool widen : {false, true})
    for (bool tb : {false, true}) {
      const auto LA = random_matrix<bfloat16>(m, k, 7), LB = random_matrix<bfloat16>(k, n, 8);
      const auto B = tb ? transposed(LB) : LB;
      const auto Af = random_matrix<float>(m, k, 7), LBf = random_matrix<float>(k, n, 8);
      const auto Bf = tb ? transposed(LBf) : LBf;
      overlap::gemm_desc d{m, n, k, k, B.ld, n, false, tb};
      d.pack_b = true;
      d.in = widen ? overlap::dtype::bf16 : overlap::dtype::f32;
      if (widen || overlap::backend::detail::native_bf16() || d.in == overlap::dtype::f32) {
        auto kernel = be.make(d, widen);
        const void* b = widen ? static_cast<const void*>(B.data.data()) : Bf.data.data();
        std::vector<std::byte> packed(kernel->packed_b_bytes());
        if (!packed.empty()) kernel->pack_b(b, packed.data());
        matrix<float> C(m, n);
        kernel->run(overlap::gemm_operands()
                        .a(widen ? static_cast<const void*>(LA.data.data()) : Af.data.data())
                        .b(packed.empty() ? b : packed.data())
                        .c(C.data.data()));
        const auto ref = widen ? naive_matmul(LA, LB) : naive_matmul(Af, LBf);
        expect_near_block(C, ref, 0, 0, k + 1,
                          std::string(widen ? "widened bf16" : "f32") + (tb ? " b^T" : "") + " via " + kernel->name() +
                              (packed.empty() ? " (B as stored)" : " (B packed)"));
      }
    }
}

// oneDNN 2.6 has no optimised matmul for a bias or an addend (binary
// post-ops) beside a strided C or addend: its reference kernel, about 1000
// times slower, unless the kernel runs on dense copies. Every combination
// of bias, addend, beta = 1 and activation on strided C and addend, checked
// against plain loops, none on the reference kernel.
TEST(backend, epilogues_on_strided_outputs_run_an_optimised_kernel) {
  overlap::backend::onednn_backend be;
  const int64_t m = 40, n = 48, k = 64;
  const auto A = random_matrix<float>(m, k, 11), B = random_matrix<float>(k, n, 12);
  const auto D = random_matrix<float>(m, n, 13, 8), C0 = random_matrix<float>(m, n, 14, 16);
  const auto bias = random_matrix<float>(1, n, 15);
  const auto AB = naive_matmul(A, B);
  for (bool with_bias : {false, true})
    for (bool addend : {false, true})
      for (bool acc : {false, true})
        for (bool relu : {false, true}) {
          if (!with_bias && !addend) continue;
          overlap::gemm_desc d = overlap::gemm_desc::shape(m, n, k).strides(A.ld, B.ld, C0.ld).accumulating(acc);
          d.bias = with_bias, d.addend = addend, d.ld_addend = D.ld;
          d.act = relu ? overlap::activation::relu : overlap::activation::none;
          auto kernel = be.make(d);
          const std::string what = kernel->name() + (with_bias ? " bias" : "") + (addend ? " addend" : "") +
                                   (acc ? " acc" : "") + (relu ? " relu" : "");
          EXPECT_NE(kernel->name().rfind("ref", 0), 0u) << what;
          auto C = C0;
          kernel->run(overlap::gemm_operands()
                          .a(A.data.data())
                          .b(B.data.data())
                          .c(C.data.data())
                          .bias(bias.data.data())
                          .addend(D.data.data()));
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
              double want =
                  AB.value(i, j) + (acc ? C0(i, j) : 0.0) + (addend ? D(i, j) : 0.0) + (with_bias ? bias(0, j) : 0.0);
              if (relu) want = std::max(want, 0.0);
              ASSERT_NEAR(C(i, j), want, 1e-4 * (1 + AB.magnitude(i, j))) << what << " at " << i << "," << j;
            }
          for (int64_t i = 0; i < m; ++i)  // the padding between rows stays untouched
            for (int64_t j = n; j < C.ld; ++j)
              ASSERT_EQ(C.data[static_cast<size_t>(i * C.ld + j)], C0.data[static_cast<size_t>(i * C.ld + j)]) << what;
        }
}

// A mixture-of-experts layer's local GEMMs take a new shape with every
// routing: past its bound of cached shapes, local_gemm drops them and goes
// on computing right.
TEST(backend, local_gemm_computes_past_its_bound_of_shapes) {
  overlap::layers::local_gemm<float> gemm;
  const int64_t k = 3, n = 2;
  const auto b = testing_support::random_matrix<float>(k, n, 7);
  for (int64_t m = 1; m <= 300; ++m) {
    const auto a = testing_support::random_matrix<float>(m, k, uint32_t(m));
    testing_support::matrix<float> c(m, n);
    gemm.run(overlap::layers::product::ab, m, n, k, {a.data.data(), k, b.data.data(), n, c.data.data(), n});
    const testing_support::reference ref = testing_support::naive_matmul(a, b);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) ASSERT_EQ(double(c(i, j)), ref.value(i, j)) << "m = " << m;
  }
}

TEST(backend, unsupported_types_are_rejected) {
  overlap::backend::onednn_backend onednn;
  overlap::backend::eigen_backend eigen;
  overlap::gemm_desc d{2, 2, 2, 2, 2, 2};
  d.in = d.out = overlap::dtype::f64;
  EXPECT_THROW((void)onednn.make(d), std::invalid_argument);
  d.in = d.out = overlap::dtype::bf16;
  EXPECT_THROW((void)eigen.make(d), std::invalid_argument);
}

TEST(shard_layout, offsets_and_balanced) {
  const overlap::shard_layout l({3, 0, 5});
  EXPECT_EQ(l.parts(), 3);
  EXPECT_EQ(l.offset(0), 0);
  EXPECT_EQ(l.offset(1), 3);
  EXPECT_EQ(l.offset(2), 3);
  EXPECT_EQ(l.total(), 8);
  EXPECT_EQ(l.max_size(), 5);
  const auto b = overlap::shard_layout::balanced(10, 4);
  EXPECT_EQ(b.sizes(), (std::vector<int64_t>{3, 3, 2, 2}));
}

}  // namespace

// The simulated-time decorator (SimGrid SMPI): a GEMM that overwrites c
// takes all its samples on its first call, so that shapes run once per op
// call are charged warm runs; one that adds to c, or writes an operand, is
// run once per call and sampled call by call, so its result stays right.
// (Its charges go to simulated time under SMPI; elsewhere they do nothing,
// and the sampling is the same.)
namespace {
class counting_kernel final : public overlap::gemm_kernel {
 public:
  mutable int runs = 0;
  void run(const overlap::gemm_operands& /*io*/) const override { ++runs; }
};

struct sampled {
  int runs_first_call, runs_after_three_calls, samples_taken;
  double charge;
};

sampled sample(bool accumulate, bool c_is_operand) {
  auto timings = std::make_shared<overlap::backend::sim_timings>(overlap::sim_compute::steady, 5);
  overlap::gemm_desc d = overlap::gemm_desc::shape(8, 8, 8);
  d.accumulate = accumulate;
  auto inner = std::make_shared<counting_kernel>();
  overlap::backend::simulated_kernel k(inner, timings, d);
  float a = 0, b = 0, c = 0;
  k.run(overlap::gemm_operands().a(&a).b(c_is_operand ? &c : &b).c(&c));
  const int first = inner->runs;
  k.run(overlap::gemm_operands().a(&a).b(c_is_operand ? &c : &b).c(&c));
  k.run(overlap::gemm_operands().a(&a).b(c_is_operand ? &c : &b).c(&c));
  const overlap::backend::sim_timings::entry& e = timings->of(d, inner->name());
  return {first, inner->runs, static_cast<int>(e.runs.size()), e.charge};
}
}  // namespace

TEST(simulated_kernel, overwriting_gemm_takes_its_samples_on_the_first_call) {
  const sampled s = sample(false, false);
  EXPECT_EQ(s.runs_first_call, 5);
  EXPECT_EQ(s.samples_taken, 5);
  EXPECT_GT(s.charge, 0);
  EXPECT_EQ(s.runs_after_three_calls, 7);  // steady mode: every later call still computes, once
}

TEST(simulated_kernel, accumulating_or_aliased_gemm_runs_once_per_call) {
  for (const sampled& s : {sample(true, false), sample(false, true)}) {
    EXPECT_EQ(s.runs_first_call, 1);
    EXPECT_EQ(s.runs_after_three_calls, 3);
    EXPECT_EQ(s.samples_taken, 3);
    EXPECT_EQ(s.charge, 0);  // not sampled enough yet
  }
}

// Under SMPI, the contexts of steady and skipped runs share their samples
// across the simulated ranks (and contexts): a shape is sampled once per
// simulation. Timings made unshared, and every timings on a real MPI, keep
// their own.
TEST(simulated_kernel, shared_timings_sample_a_kernel_shape_once_per_simulation) {
  class named_kernel final : public overlap::gemm_kernel {
   public:
    mutable int runs = 0;
    void run(const overlap::gemm_operands& /*io*/) const override { ++runs; }
    [[nodiscard]] std::string name() const override { return "test_backend's shared-sampling kernel"; }
  };
  const overlap::gemm_desc d = overlap::gemm_desc::shape(7, 5, 3);  // a shape no other test samples
  auto first = std::make_shared<overlap::backend::sim_timings>(overlap::sim_compute::steady, 3, true);
  auto second = std::make_shared<overlap::backend::sim_timings>(overlap::sim_compute::steady, 3, true);
  auto alone = std::make_shared<overlap::backend::sim_timings>(overlap::sim_compute::steady, 3, false);
  auto inner1 = std::make_shared<named_kernel>(), inner2 = std::make_shared<named_kernel>(),
       inner3 = std::make_shared<named_kernel>();
  float a = 0, b = 0, c = 0;
  overlap::backend::simulated_kernel(inner1, first, d).run(overlap::gemm_operands().a(&a).b(&b).c(&c));
  overlap::backend::simulated_kernel(inner2, second, d).run(overlap::gemm_operands().a(&a).b(&b).c(&c));
  overlap::backend::simulated_kernel(inner3, alone, d).run(overlap::gemm_operands().a(&a).b(&b).c(&c));
  EXPECT_EQ(inner1->runs, 3);                                // its samples, back to back
  EXPECT_EQ(inner2->runs, overlap::mpi::simulated ? 1 : 3);  // sampled already, or its own
  EXPECT_EQ(inner3->runs, 3);                                // never shared
  EXPECT_EQ(&first->of(d, inner1->name()) == &second->of(d, inner1->name()), overlap::mpi::simulated);
  EXPECT_NE(&first->of(d, inner1->name()), &alone->of(d, inner1->name()));
  EXPECT_NE(&first->of(d, inner1->name()), &first->of(d, "another kernel"));
}

// OVERLAP_SIM_COMPUTE=calibrated: the GEMM never runs, and every call is
// charged its flops over the calibration's rate for the shape (here a
// one-point grid of 2 MFLOP/s: 2 * 64 * 32 * 16 flops take 32.768 ms, so
// that a charge dwarfs the real time SMPI adds for the loop, even on a loaded
// machine: at 2 GFLOP/s, 16.5 us of it once failed the bound below). Under
// SMPI the charge is simulated time; a type without rates is refused.
TEST(simulated_kernel, calibrated_mode_charges_flops_over_the_calibrated_rate) {
  auto timings = std::make_shared<overlap::backend::sim_timings>(overlap::sim_compute::calibrated, 5);
  overlap::gemm_rates f32;
  f32.sizes = {64};
  f32.flops_per_s = {2e6};
  timings->set_rates({{overlap::dtype::f32, f32}}, "a test's grid");
  const overlap::gemm_desc d = overlap::gemm_desc::shape(64, 32, 16);
  auto inner = std::make_shared<counting_kernel>();
  overlap::backend::simulated_kernel k(inner, timings, d);
  float a = 0, b = 0, c = 0;
  const double t0 = overlap::mpi::simulated ? MPI_Wtime() : 0;
  for (int i = 0; i < 3; ++i) k.run(overlap::gemm_operands().a(&a).b(&b).c(&c));
  const double t1 = overlap::mpi::simulated ? MPI_Wtime() : 0;
  EXPECT_EQ(inner->runs, 0);
  EXPECT_NEAR(timings->of(d, inner->name()).charge, 32.768e-3, 1e-12);  // the grid interpolates in log space
  if (overlap::mpi::simulated) {
    // Three charges, plus what SMPI injects for the real time the loop took
    // between the two MPI calls (host-speed accounting): microseconds, more
    // on a loaded machine. Half a charge of slack still catches a fourth
    // charge or a missing one.
    EXPECT_GE(t1 - t0, 3 * 32.768e-3 - 1e-9);
    EXPECT_LT(t1 - t0, 3.5 * 32.768e-3);
  }

  overlap::gemm_desc f64 = d;
  f64.in = f64.out = overlap::dtype::f64;
  try {
    overlap::backend::simulated_kernel refused(inner, timings, f64);
    ADD_FAILURE() << "a type without calibrated rates was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("no GEMM rates for f64"), std::string::npos) << e.what();
  }
}

// A host speed that charges this machine's computation as next to nothing
// (SimGrid's default smpi/host-speed, 20 kflop/s, against a 100 Gflop/s
// host: a 50 ms GEMM charged 10 ns) is named, with the figures and the fix;
// tools/smpi/run's 100Gf on its mirrors, and a fat tree's node of 32 cores
// (3.2 Tflop/s) against it, are not. Under SMPI the running simulation's own
// speeds are checked against tools/smpi/run's flag, which the tests pass.
TEST(simulated, a_host_speed_that_charges_nothing_is_named) {
  const std::string p = overlap::mpi::compute_charge_problem(20000, 100e9);
  EXPECT_NE(p.find("smpi/host-speed is 2e+04 flop/s"), std::string::npos) << p;
  EXPECT_NE(p.find("1e+11"), std::string::npos) << p;
  EXPECT_NE(p.find("--cfg=smpi/host-speed"), std::string::npos) << p;
  EXPECT_EQ(overlap::mpi::compute_charge_problem(100e9, 100e9), "");
  EXPECT_EQ(overlap::mpi::compute_charge_problem(100e9, 3.2e12), "");
  EXPECT_EQ(overlap::mpi::compute_charge_problem(0, 0), "") << "a real MPI: nothing to say";
  if (overlap::mpi::simulated) {
    EXPECT_DOUBLE_EQ(overlap::mpi::host_speed(), 100e9);
    EXPECT_GT(overlap::mpi::platform_speed(), 0);
  } else {
    EXPECT_EQ(overlap::mpi::host_speed(), 0);
    EXPECT_EQ(overlap::mpi::platform_speed(), 0);
  }
}

// A simulation that does not time its host code (tools/smpi/run's
// SMPI_HOST_TIMING=off) is named: as an error where the GEMMs are timed by
// SMPI (measured) and so cost nothing, and as a note of what goes uncharged
// where the library charges them. tools/smpi/run keeps host timing on for
// the test suite, and a real MPI has nothing to say.
TEST(simulated, host_code_that_is_not_timed_is_named) {
  EXPECT_EQ(overlap::mpi::host_timing_problem(true, true), "");
  EXPECT_EQ(overlap::mpi::host_timing_problem(true, false), "");
  const std::string measured = overlap::mpi::host_timing_problem(false, false);
  EXPECT_NE(measured.find("OVERLAP_SIM_COMPUTE=measured"), std::string::npos) << measured;
  EXPECT_NE(measured.find("SMPI_HOST_TIMING=on"), std::string::npos) << measured;
  const std::string charged = overlap::mpi::host_timing_problem(false, true);
  EXPECT_NE(charged.find("element-wise passes, costs nothing"), std::string::npos) << charged;
  EXPECT_NE(charged, measured);
  EXPECT_TRUE(overlap::mpi::host_code_timed()) << "tools/smpi/run times the tests' host code";
}

// A layer's local work (attention, layer norms, GELU, weight gradients)
// under SMPI: each kind and shape runs for its samples, then is charged
// their median; in the timing-only modes it then no longer runs. It always
// runs under measured and steady, and on a real MPI.
TEST(work_sampler, timing_only_modes_run_a_shape_only_for_its_samples) {
  using overlap::sim_compute;
  for (sim_compute mode : {sim_compute::measured, sim_compute::steady, sim_compute::skipped, sim_compute::calibrated}) {
    const overlap::backend::work_sampler sample(mode, 2);
    const bool skips = overlap::mpi::simulated && (mode == sim_compute::skipped || mode == sim_compute::calibrated);
    const std::string kind = std::string("test_backend's work, ") + overlap::to_string(mode);  // a key of its own
    int runs = 0;
    auto work = [&runs] {
      ++runs;
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(300);
      while (std::chrono::steady_clock::now() < until) {
      }
    };
    for (int call = 0; call < 2; ++call) sample(kind.c_str(), {64, 32, 0, 0}, work);
    EXPECT_EQ(runs, 2) << overlap::to_string(mode);  // the samples
    const double t0 = MPI_Wtime();
    for (int call = 0; call < 3; ++call) sample(kind.c_str(), {64, 32, 0, 0}, work);
    const double charged = MPI_Wtime() - t0;
    EXPECT_EQ(runs, skips ? 2 : 5) << overlap::to_string(mode);
    if (overlap::mpi::simulated) {
      EXPECT_GT(charged, 0) << overlap::to_string(mode);  // charged though not run
    }
    sample(kind.c_str(), {64, 33, 0, 0}, work);  // another shape: sampled again
    EXPECT_EQ(runs, skips ? 3 : 6) << overlap::to_string(mode);
  }
}

// A layer's buffers: ordinary aligned vectors, except in SMPI's timing-only
// runs (mpi::shared_workspaces), where every simulated rank's i-th buffer is
// the same shared block, a rank's live buffers never overlap, and a freed
// block is lent again.
TEST(workspace_allocator, shares_blocks_only_where_workspaces_are_shared) {
  bool& shared = overlap::mpi::shared_workspaces();
  const bool before = shared;
  shared = false;
  {
    overlap::workspace_vector<float> v(1000, 2.0f);
    v.push_back(3.0f);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % 64, 0u);
    EXPECT_EQ(v[999], 2.0f);
    EXPECT_EQ(v.back(), 3.0f);
  }
  shared = overlap::mpi::simulated;
  {
    const double *first = nullptr, *second = nullptr;
    {
      overlap::workspace_vector<double> a(4096), b(4096);
      EXPECT_NE(a.data(), b.data());
      first = a.data(), second = b.data();
      EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 64, 0u);
    }
    const overlap::workspace_vector<double> c(4096);
    if (overlap::mpi::simulated) {
      EXPECT_TRUE(c.data() == first || c.data() == second) << "a freed block is lent again";
    }
  }
  shared = before;
}
