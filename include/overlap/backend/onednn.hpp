#pragma once
/// @file
/// oneDNN backend (2.x API): one matmul primitive per gemm_desc, created when
/// a plan is built and cached here, so equal shapes share a primitive.

#include <oneapi/dnnl/dnnl.hpp>

#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#include "overlap/backend/gemm.hpp"
#include "overlap/error.hpp"

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
}  // namespace detail

struct onednn_handles {
  dnnl::engine engine;
  dnnl::stream stream;
};

class onednn_gemm final : public gemm_kernel {
 public:
  onednn_gemm(std::shared_ptr<onednn_handles> h, const gemm_desc& d) : h_(std::move(h)), d_(d) {
    if (d.m == 0 || d.n == 0 || d.k == 0) return;  // handled by run_degenerate
    detail::onednn_call("dnnl::matmul::primitive_desc", [&] {
      using dims = dnnl::memory::dims;
      const auto dt = detail::onednn_type(d.in), dt_out = detail::onednn_type(d.out);
      const dnnl::memory::desc a_md(dims{d.m, d.k}, dt, detail::strides(d.lda, d.trans_a));
      const dnnl::memory::desc b_md(dims{d.k, d.n}, dt, detail::strides(d.ldb, d.trans_b));
      const dnnl::memory::desc c_md(dims{d.m, d.n}, dt_out, dims{d.ldc, 1});
      // Post-ops run in this order on the fp32 result: + C (beta = 1), + D,
      // + bias, activation; then one rounding to the output type.
      dnnl::primitive_attr attr;
      dnnl::post_ops ops;
      if (d.accumulate) ops.append_sum(1.0f);
      if (d.addend) {
        addend_md_ = dnnl::memory::desc(dims{d.m, d.n}, detail::onednn_type(d.addend_type), dims{d.ld_addend, 1});
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
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), attr, h_->engine);
      prim_ = dnnl::matmul(pd);
      a_mem_ = dnnl::memory(a_md, h_->engine, DNNL_MEMORY_NONE);
      b_mem_ = dnnl::memory(b_md, h_->engine, DNNL_MEMORY_NONE);
      c_mem_ = dnnl::memory(c_md, h_->engine, DNNL_MEMORY_NONE);
      args_ = {{DNNL_ARG_SRC, a_mem_}, {DNNL_ARG_WEIGHTS, b_mem_}, {DNNL_ARG_DST, c_mem_}};
      if (d.bias) {
        bias_mem_ = dnnl::memory(bias_md_, h_->engine, DNNL_MEMORY_NONE);
        args_.emplace(bias_arg_, bias_mem_);
      }
      if (d.addend) {
        addend_mem_ = dnnl::memory(addend_md_, h_->engine, DNNL_MEMORY_NONE);
        args_.emplace(addend_arg_, addend_mem_);
      }
      return 0;
    });
  }

  void run(const void* a, const void* b, void* c, const void* bias, const void* addend) const override {
    if (overlap::detail::run_degenerate(d_, c, bias, addend)) return;
    detail::onednn_call("dnnl::matmul::execute", [&] {
      a_mem_.set_data_handle(const_cast<void*>(a));
      b_mem_.set_data_handle(const_cast<void*>(b));
      c_mem_.set_data_handle(c);
      if (d_.bias) bias_mem_.set_data_handle(const_cast<void*>(bias));
      if (d_.addend) addend_mem_.set_data_handle(const_cast<void*>(addend));
      prim_.execute(h_->stream, args_);  // args_ holds handles to the memories above
      h_->stream.wait();
      return 0;
    });
  }

 private:
  std::shared_ptr<onednn_handles> h_;
  gemm_desc d_;
  dnnl::matmul prim_;
  dnnl::memory::desc bias_md_, addend_md_;
  int bias_arg_ = 0, addend_arg_ = 0;
  mutable dnnl::memory a_mem_, b_mem_, c_mem_, bias_mem_, addend_mem_;
  std::unordered_map<int, dnnl::memory> args_;  // built once: no allocation per call
};

/// Owns the oneDNN CPU engine and stream and a cache of kernels by gemm_desc.
class onednn_backend {
 public:
  onednn_backend()
      : h_(detail::onednn_call("dnnl::engine", [] {
          auto h = std::make_shared<onednn_handles>();
          h->engine = dnnl::engine(dnnl::engine::kind::cpu, 0);
          h->stream = dnnl::stream(h->engine);
          return h;
        })) {}

  [[nodiscard]] std::shared_ptr<const gemm_kernel> make(const gemm_desc& d) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& slot = cache_[d];
    if (!slot) slot = std::make_shared<onednn_gemm>(h_, d);
    return slot;
  }

 private:
  std::shared_ptr<onednn_handles> h_;
  std::mutex mutex_;
  std::map<gemm_desc, std::shared_ptr<const gemm_kernel>> cache_;  // the desc includes the types
};

}  // namespace overlap::backend
