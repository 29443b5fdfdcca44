#pragma once
/// @file
/// oneDNN backend (2.x API): one matmul primitive per gemm_desc, created when
/// a plan is built and cached here, so equal shapes share a primitive.

#include <oneapi/dnnl/dnnl.hpp>

#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <utility>
#include <vector>

#include "overlap/backend/gemm.hpp"
#include "overlap/core/error.hpp"
#include "overlap/core/matrix.hpp"

namespace overlap::backend {

namespace detail {
inline dnnl::memory::data_type onednn_type(dtype t) {
  if (t == dtype::f64)
    throw std::invalid_argument("overlap: the onednn backend has no f64 matmul; use backend_kind::eigen");
  return t == dtype::bf16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
}

/// Runs a oneDNN C++ call and turns dnnl::error into overlap::error.
template <class F>
auto onednn_call(const char* call, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const dnnl::error& e) {
    throw overlap::error(error_source::backend, static_cast<int>(e.status), call, e.what());
  }
}

/// Strides of a logical rows x cols operand stored row-major with ld,
/// or stored as its transpose (cols x rows) with ld.
inline dnnl::memory::dims strides(int64_t ld, bool transposed) {
  return transposed ? dnnl::memory::dims{1, ld} : dnnl::memory::dims{ld, 1};
}

/// A hash of a memory descriptor's bytes: equal layouts, equal hashes.
inline uint64_t hash_desc(const dnnl::memory::desc& md) {
  const auto* p = reinterpret_cast<const unsigned char*>(&md.data);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < sizeof md.data; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h | 1u;  // never 0 (0: not packed)
}

/// The instruction set oneDNN uses on this CPU (after ONEDNN_MAX_CPU_ISA).
inline const char* effective_isa() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_mic: return "avx512_mic";
    case dnnl::cpu_isa::avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return "unknown";
  }
}

/// The smallest extent a piece's output may have along the dimension a ring
/// splits, given its other output extent `other`, for the GEMM to keep the
/// rate of one GEMM of the same work; 0 when nothing is known (no knee).
///
/// Below AVX-512, oneDNN 2.6 runs f32 matmuls as its gemm:jit sgemm, which
/// switches to its "no-copy" kernels (B read in place, no packing) when
/// 1/m + 1/n >= 0.0038 (src/cpu/gemm/gemm_driver.cpp, nocopy_checker_avx2;
/// symmetric in m and n). Pieces on the no-copy side lose much of one GEMM's
/// rate, unreliably (measurements: docs/design.md, "Pieces: shapes from
/// measured rates"), so pieces stay on the copy-based side:
/// extent > 1 / (0.0038 - 1/other). When `other` is so small that no extent
/// qualifies, or at AVX-512 (brgemm kernels, no such switch) and SSE4.1
/// (copy-based only), there is no knee. `f32_gemm`: the pieces multiply in
/// f32 (f32 operands, or bf16 widened to f32).
inline int64_t gemm_jit_knee(bool f32_gemm, int64_t other) noexcept {
  // Asked once per process: the ops ask on every call, cached plans too.
  static const bool sgemm_switches = [] {
    const auto isa = dnnl::get_effective_cpu_isa();
    return isa == dnnl::cpu_isa::avx || isa == dnnl::cpu_isa::avx2 || isa == dnnl::cpu_isa::avx2_vnni;
  }();
  constexpr double nocopy_threshold = 0.0038;
  if (!sgemm_switches || !f32_gemm || other <= 0 || 1.0 / double(other) >= nocopy_threshold) return 0;
  return static_cast<int64_t>(1.0 / (nocopy_threshold - 1.0 / double(other))) + 1;
}

/// Whether oneDNN can create a bf16 matmul here (2.6 has none below
/// AVX512_CORE). Probed once per process by creating a tiny primitive.
inline bool native_bf16() {
  static const bool ok = [] {
    try {
      const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
      const dnnl::memory::desc md({2, 2}, dnnl::memory::data_type::bf16, dnnl::memory::format_tag::ab);
      const dnnl::memory::desc out({2, 2}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::ab);
      (void)dnnl::matmul::primitive_desc(dnnl::matmul::desc(md, md, out), eng);
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return ok;
}

/// dst = src converted element by element (src's rows x cols): widens a
/// bf16 block to f32, or rounds an f32 block to bf16.
template <class S, class D>
void convert_block(matrix_view<const S> src, matrix_view<D> dst) {
  for (int64_t i = 0; i < src.rows; ++i)
    for (int64_t j = 0; j < src.cols; ++j) dst(i, j) = static_cast<D>(src(i, j));
}
}  // namespace detail

/// The instruction set oneDNN runs on here ("avx512_core_bf16", "avx2", ...),
/// after ONEDNN_MAX_CPU_ISA: what a measured figure should name. Local.
inline const char* cpu_isa() { return detail::effective_isa(); }

/// The oneDNN CPU engine and stream a context's kernels share.
struct onednn_handles {
  dnnl::engine engine;  ///< the CPU engine
  dnnl::stream stream;  ///< the in-order stream every kernel runs on
};

/// A GEMM as one oneDNN matmul primitive, epilogue fused as post-ops.
class onednn_gemm final : public gemm_kernel {
 public:
  /// Creates the primitive for `d` (none for an empty product); oneDNN errors become overlap::error.
  onednn_gemm(std::shared_ptr<onednn_handles> h, const gemm_desc& d) : h_(std::move(h)), d_(d) {
    if (d.m == 0 || d.n == 0 || d.k == 0) return;  // handled by run_degenerate
    detail::onednn_call("dnnl::matmul::primitive_desc", [&] {
      using dims = dnnl::memory::dims;
      const auto dt = detail::onednn_type(d.in), dt_out = detail::onednn_type(d.out);
      const dnnl::memory::desc a_md(dims{d.m, d.k}, dt, detail::strides(d.lda, d.trans_a));
      const dnnl::memory::desc b_stored(dims{d.k, d.n}, dt, detail::strides(d.ldb, d.trans_b));
      // pack_b: let oneDNN choose B's layout (`any`); where it picks a blocked
      // one (brgemm kernels), B is reordered once per plan call, not per piece.
      const dnnl::memory::desc b_md =
          d.pack_b ? dnnl::memory::desc(dims{d.k, d.n}, dt, dnnl::memory::format_tag::any) : b_stored;
      dnnl::memory::desc c_md(dims{d.m, d.n}, dt_out, dims{d.ldc, 1});
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), post_ops(dt_out, d.ld_addend), h_->engine);
      name_ = pd.impl_info_str();
      // oneDNN 2.6 has no optimised matmul for a binary post-op (bias,
      // addend) beside a strided C or addend: it falls back to its reference
      // kernel, about 1000 times slower (a 256 x 256 x 896 product took 2 s).
      // Then the product goes through dense copies of C (and of the addend):
      // two passes over m x n beside a GEMM's k of them.
      const bool strided = d.ldc != d.n || (d.addend && d.ld_addend != d.n);
      if (name_.rfind("ref", 0) == 0 && (d.bias || d.addend) && strided) {
        const dnnl::memory::desc dense(dims{d.m, d.n}, dt_out, dims{d.n, 1});
        dnnl::matmul::primitive_desc staged(dnnl::matmul::desc(a_md, b_md, dense), post_ops(dt_out, d.n), h_->engine);
        if (std::string(staged.impl_info_str()).rfind("ref", 0) != 0) {
          make_stages(c_md, dense);
          pd = staged, c_md = dense;
          name_ = std::string(pd.impl_info_str()) + " on dense copies";
        } else {
          post_ops(dt_out, d.ld_addend);  // the descriptors of the primitive kept
        }
      }
      prim_ = dnnl::matmul(pd);
      const dnnl::memory::desc b_used = pd.weights_desc();
      if (d.pack_b && b_used != b_stored) make_packer(b_stored, b_used);
      bind(a_md, b_used, c_md);
      return 0;
    });
  }

  void run(const gemm_operands& io) const override {
    if (overlap::detail::run_degenerate(d_, io)) return;
    detail::onednn_call("dnnl::matmul::execute", [&] {
      a_mem_.set_data_handle(const_cast<void*>(io.a()));
      b_mem_.set_data_handle(const_cast<void*>(io.b()));
      if (d_.bias) bias_mem_.set_data_handle(const_cast<void*>(io.bias()));
      if (staged_) {
        c_stage_.strided.set_data_handle(io.c());
        if (d_.accumulate) execute(c_stage_.in, c_stage_.in_args);  // C += : the dense copy starts from C
        if (d_.addend) {
          addend_stage_.strided.set_data_handle(const_cast<void*>(io.addend()));
          execute(addend_stage_.in, addend_stage_.in_args);
        }
      } else {
        c_mem_.set_data_handle(io.c());
        if (d_.addend) addend_mem_.set_data_handle(const_cast<void*>(io.addend()));
      }
      execute(prim_, args_);  // args_ holds handles to the memories above
      if (staged_) execute(c_stage_.out, c_stage_.out_args);
      h_->stream.wait();
      return 0;
    });
  }
  [[nodiscard]] size_t packed_b_bytes() const override { return packed_bytes_; }
  [[nodiscard]] uint64_t packed_b_layout() const override { return packed_layout_; }
  void pack_b(const void* b, void* dst) const override {
    if (packed_bytes_ == 0) return;
    detail::onednn_call("dnnl::reorder::execute", [&] {
      pack_src_.set_data_handle(const_cast<void*>(b));
      pack_dst_.set_data_handle(dst);
      execute(pack_, pack_args_);
      h_->stream.wait();
      return 0;
    });
  }
  [[nodiscard]] std::string name() const override { return name_; }

 private:
  /// Post-ops run in this order on the fp32 result: + C (beta = 1), + D,
  /// + bias, activation; then one rounding to the output type. The addend
  /// is read with leading dimension ld_addend.
  dnnl::primitive_attr post_ops(dnnl::memory::data_type dt_out, int64_t ld_addend) {
    using dims = dnnl::memory::dims;
    const gemm_desc& d = d_;
    dnnl::primitive_attr attr;
    dnnl::post_ops ops;
    if (d.accumulate) ops.append_sum(1.0f);
    if (d.addend) {
      addend_md_ = dnnl::memory::desc(dims{d.m, d.n}, detail::onednn_type(d.addend_type), dims{ld_addend, 1});
      addend_arg_ = DNNL_ARG_ATTR_MULTIPLE_POST_OP(ops.len()) | DNNL_ARG_SRC_1;
      ops.append_binary(dnnl::algorithm::binary_add, addend_md_);
    }
    if (d.bias) {
      bias_md_ = dnnl::memory::desc(dims{1, d.n}, dt_out, dims{d.n, 1});
      bias_arg_ = DNNL_ARG_ATTR_MULTIPLE_POST_OP(ops.len()) | DNNL_ARG_SRC_1;
      ops.append_binary(dnnl::algorithm::binary_add, bias_md_);
    }
    if (d.act == activation::relu) ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    if (d.act == activation::gelu) ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_gelu_erf, 0.0f, 0.0f);
    attr.set_post_ops(ops);
    return attr;
  }
  /// B as the primitive reads it differs from B as stored: one reorder per call packs it.
  void make_packer(const dnnl::memory::desc& b_stored, const dnnl::memory::desc& b_used) {
    packed_bytes_ = b_used.get_size();
    packed_layout_ = detail::hash_desc(b_used);
    pack_ = dnnl::reorder(dnnl::reorder::primitive_desc(h_->engine, b_stored, h_->engine, b_used));
    pack_src_ = dnnl::memory(b_stored, h_->engine, DNNL_MEMORY_NONE);
    pack_dst_ = dnnl::memory(b_used, h_->engine, DNNL_MEMORY_NONE);
    pack_args_ = {{DNNL_ARG_FROM, pack_src_.get()}, {DNNL_ARG_TO, pack_dst_.get()}};
  }
  /// A strided matrix and its dense copy (owned), with the reorders between them.
  struct stage {
    dnnl::memory dense;
    mutable dnnl::memory strided;
    dnnl::reorder in, out;
    std::vector<dnnl_exec_arg_t> in_args, out_args;
    stage() = default;
    stage(const dnnl::engine& e, const dnnl::memory::desc& strided_md, const dnnl::memory::desc& dense_md)
        : dense(dense_md, e), strided(strided_md, e, DNNL_MEMORY_NONE) {
      in = dnnl::reorder(dnnl::reorder::primitive_desc(e, strided_md, e, dense_md));
      out = dnnl::reorder(dnnl::reorder::primitive_desc(e, dense_md, e, strided_md));
      in_args = {{DNNL_ARG_FROM, strided.get()}, {DNNL_ARG_TO, dense.get()}};
      out_args = {{DNNL_ARG_FROM, dense.get()}, {DNNL_ARG_TO, strided.get()}};
    }
  };
  /// The product runs on dense copies of C (and of the addend, which the
  /// post-ops then read from its copy): see the constructor.
  void make_stages(const dnnl::memory::desc& c_strided, const dnnl::memory::desc& c_dense) {
    using dims = dnnl::memory::dims;
    staged_ = true;
    c_stage_ = stage(h_->engine, c_strided, c_dense);
    if (d_.addend) {
      const auto t = detail::onednn_type(d_.addend_type);
      addend_stage_ = stage(h_->engine, dnnl::memory::desc(dims{d_.m, d_.n}, t, dims{d_.ld_addend, 1}),
                            dnnl::memory::desc(dims{d_.m, d_.n}, t, dims{d_.n, 1}));
    }
  }
  /// The memory objects run() points at each call's buffers.
  void bind(const dnnl::memory::desc& a_md, const dnnl::memory::desc& b_md, const dnnl::memory::desc& c_md) {
    a_mem_ = dnnl::memory(a_md, h_->engine, DNNL_MEMORY_NONE);
    b_mem_ = dnnl::memory(b_md, h_->engine, DNNL_MEMORY_NONE);
    c_mem_ = staged_ ? c_stage_.dense : dnnl::memory(c_md, h_->engine, DNNL_MEMORY_NONE);
    args_ = {{DNNL_ARG_SRC, a_mem_.get()}, {DNNL_ARG_WEIGHTS, b_mem_.get()}, {DNNL_ARG_DST, c_mem_.get()}};
    if (d_.bias) {
      bias_mem_ = dnnl::memory(bias_md_, h_->engine, DNNL_MEMORY_NONE);
      args_.push_back({bias_arg_, bias_mem_.get()});
    }
    if (d_.addend) {
      addend_mem_ = staged_ ? addend_stage_.dense : dnnl::memory(addend_md_, h_->engine, DNNL_MEMORY_NONE);
      args_.push_back({addend_arg_, addend_mem_.get()});
    }
  }
  /// Runs a primitive through the C API with arguments built once: the C++
  /// API's execute() copies its argument map into a new vector every call.
  void execute(const dnnl::primitive& p, const std::vector<dnnl_exec_arg_t>& args) const {
    dnnl::error::wrap_c_api(
        dnnl_primitive_execute(p.get(), h_->stream.get(), static_cast<int>(args.size()), args.data()),
        "could not execute a primitive");
  }

  std::shared_ptr<onednn_handles> h_;
  gemm_desc d_;
  dnnl::matmul prim_;
  std::string name_ = "none (empty product)";
  size_t packed_bytes_ = 0;
  uint64_t packed_layout_ = 0;
  dnnl::reorder pack_;
  mutable dnnl::memory pack_src_, pack_dst_;
  dnnl::memory::desc bias_md_, addend_md_;
  int bias_arg_ = 0, addend_arg_ = 0;
  mutable dnnl::memory a_mem_, b_mem_, c_mem_, bias_mem_, addend_mem_;
  std::vector<dnnl_exec_arg_t> args_, pack_args_;  // built once: no allocation per call
  bool staged_ = false;                            ///< the product runs on c_stage_'s (and addend_stage_'s) dense copy
  stage c_stage_, addend_stage_;
};

/// A bf16 GEMM for CPUs whose oneDNN has no bf16 matmul: each call widens
/// A, B (and a bf16 C to accumulate, addend, bias) into f32 buffers owned by
/// the kernel (allocated once, when the plan is built), runs an f32 matmul
/// with the same post-ops, and rounds the result to bf16 once. An f32 output
/// (an fp32 accumulator) is written directly.
class onednn_widened_gemm final : public gemm_kernel {
 public:
  /// Creates the f32 primitive for `d` (bf16 operands) and the widening workspace's shapes.
  onednn_widened_gemm(const std::shared_ptr<onednn_handles>& h, const gemm_desc& d) : d_(d) {
    if (d.m == 0 || d.n == 0 || d.k == 0) return;  // handled by run_degenerate
    // Stored shapes: A is m x k (k x m transposed), B is k x n (n x k transposed).
    a_rows_ = d.trans_a ? d.k : d.m, a_cols_ = d.trans_a ? d.m : d.k;
    b_rows_ = d.trans_b ? d.n : d.k, b_cols_ = d.trans_b ? d.k : d.n;
    gemm_desc w = d;
    w.pack_b = false;  // B is widened per call anyway
    w.in = dtype::f32;
    w.out = dtype::f32;
    w.lda = a_cols_;
    w.ldb = b_cols_;
    a_.resize(static_cast<size_t>(a_rows_ * a_cols_));
    if (!d.pack_b) b_.resize(static_cast<size_t>(b_rows_ * b_cols_));
    if (d.out == dtype::bf16) {
      w.ldc = d.n;
      c_.resize(static_cast<size_t>(d.m * d.n));
      if (d.bias) bias_.resize(static_cast<size_t>(d.n));
    }
    if (d.addend && d.addend_type == dtype::bf16) {
      w.addend_type = dtype::f32;
      w.ld_addend = d.n;
      addend_.resize(static_cast<size_t>(d.m * d.n));
    }
    f32_ = std::make_unique<onednn_gemm>(h, w);
  }

  void run(const gemm_operands& io) const override {
    if (overlap::detail::run_degenerate(d_, io)) return;
    detail::convert_block<bfloat16>({static_cast<const bfloat16*>(io.a()), a_rows_, a_cols_, d_.lda},
                                    matrix_view<float>(a_.data(), a_rows_, a_cols_));
    gemm_operands wide = io;
    wide.a(a_.data());
    // pack_b: b is already the widened copy (pack_b() made it once per call).
    if (!d_.pack_b) {
      detail::convert_block<bfloat16>({static_cast<const bfloat16*>(io.b()), b_rows_, b_cols_, d_.ldb},
                                      matrix_view<float>(b_.data(), b_rows_, b_cols_));
      wide.b(b_.data());
    }
    if (!addend_.empty()) {
      detail::convert_block<bfloat16>({static_cast<const bfloat16*>(io.addend()), d_.m, d_.n, d_.ld_addend},
                                      matrix_view<float>(addend_.data(), d_.m, d_.n));
      wide.addend(addend_.data());
    }
    if (d_.out == dtype::f32) {
      f32_->run(wide);
      return;
    }
    auto* cb = static_cast<bfloat16*>(io.c());
    if (d_.accumulate)
      detail::convert_block<bfloat16>({cb, d_.m, d_.n, d_.ldc}, matrix_view<float>(c_.data(), d_.m, d_.n));
    if (d_.bias)
      detail::convert_block<bfloat16>({static_cast<const bfloat16*>(io.bias()), 1, d_.n},
                                      matrix_view<float>(bias_.data(), 1, d_.n));
    f32_->run(wide.c(c_.data()).bias(bias_.data()));
    detail::convert_block<float>({c_.data(), d_.m, d_.n}, matrix_view<bfloat16>(cb, d_.m, d_.n, d_.ldc));
  }
  /// With pack_b, B is widened once per plan call (dense, as stored) instead
  /// of by every piece.
  [[nodiscard]] size_t packed_b_bytes() const override {
    return d_.pack_b && f32_ ? static_cast<size_t>(b_rows_ * b_cols_) * sizeof(float) : 0;
  }
  [[nodiscard]] uint64_t packed_b_layout() const override {
    return packed_b_bytes() == 0 ? 0 : (static_cast<uint64_t>(b_rows_) << 32 ^ static_cast<uint64_t>(b_cols_)) | 1u;
  }
  void pack_b(const void* b, void* dst) const override {
    if (packed_b_bytes() == 0) return;
    detail::convert_block<bfloat16>({static_cast<const bfloat16*>(b), b_rows_, b_cols_, d_.ldb},
                                    matrix_view<float>(static_cast<float*>(dst), b_rows_, b_cols_));
  }
  [[nodiscard]] std::string name() const override {
    return "widened bf16 -> " + (f32_ ? f32_->name() : std::string("none (empty product)")) +
           (d_.pack_b ? ", B widened once per call" : "");
  }

 private:
  gemm_desc d_;
  int64_t a_rows_ = 0, a_cols_ = 0, b_rows_ = 0, b_cols_ = 0;
  std::unique_ptr<onednn_gemm> f32_;
  mutable std::vector<float> a_, b_, c_, bias_, addend_;  // workspaces, sized once
};

/// Owns the oneDNN CPU engine and stream and a cache of kernels by gemm_desc.
/// The cache holds weak references: a kernel lives as long as a plan uses it,
/// and plans built at the same time share kernels of equal descriptions.
class onednn_backend {
 public:
  onednn_backend()
      : h_(detail::onednn_call("dnnl::engine", [] {
          auto h = std::make_shared<onednn_handles>();
          h->engine = dnnl::engine(dnnl::engine::kind::cpu, 0);
          h->stream = dnnl::stream(h->engine);
          return h;
        })) {}

  /// widen: a bf16 desc runs as onednn_widened_gemm.
  [[nodiscard]] std::shared_ptr<const gemm_kernel> make(const gemm_desc& d, bool widen = false) {
    std::lock_guard<std::mutex> lock(mutex_);
    widen = widen && d.in == dtype::bf16;
    auto& slot = cache_[{d, widen}];
    std::shared_ptr<const gemm_kernel> k = slot.lock();
    if (!k) {
      if (widen)
        k = std::make_shared<onednn_widened_gemm>(h_, d);
      else
        k = std::make_shared<onednn_gemm>(h_, d);
      slot = k;
    }
    if (++since_purge_ >= 256) purge();
    return k;
  }
  /// Entries whose kernels are alive (for tests of the cache bound).
  [[nodiscard]] size_t live_kernels() {
    std::lock_guard<std::mutex> lock(mutex_);
    purge();
    return cache_.size();
  }

 private:
  void purge() {
    since_purge_ = 0;
    for (auto it = cache_.begin(); it != cache_.end();) it = it->second.expired() ? cache_.erase(it) : std::next(it);
  }
  std::shared_ptr<onednn_handles> h_;
  std::mutex mutex_;
  std::map<std::pair<gemm_desc, bool>, std::weak_ptr<const gemm_kernel>> cache_;  // the desc includes the types
  int since_purge_ = 0;
};

}  // namespace overlap::backend
