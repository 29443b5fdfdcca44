#pragma once
/// @file
/// exp over a buffer in place, for the softmax inside attention: oneDNN's
/// eltwise primitive (vectorised, JIT) for float, std::exp for double. A
/// scalar std::exp per score costs about as much as the score's share of
/// the two attention GEMMs, so the softmax would otherwise double their time.

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <type_traits>

#include "overlap/backend/onednn.hpp"

namespace overlap::layers {

/// x[i] = exp(x[i]) for i < n. Primitives are cached by length (a run sees
/// a few tile shapes). Local; not thread-safe: one caller at a time.
template <class A>
class local_exp {
  static_assert(std::is_same_v<A, float> || std::is_same_v<A, double>, "local math runs in float or double");

 public:
  /// Exponentiates n values at x in place.
  void operator()(A* x, int64_t n) {
    if constexpr (std::is_same_v<A, double>) {
      for (int64_t i = 0; i < n; ++i) x[i] = std::exp(x[i]);
    } else {
      for (int64_t at = 0; at < n; at += piece) run(x + at, std::min(piece, n - at));
    }
  }

 private:
  // Longer buffers go in pieces of this many values: a bounded set of
  // primitive lengths, and each piece long enough that a call's overhead
  // is small beside its work.
  static constexpr int64_t piece = int64_t(1) << 20;

  struct kernel {
    dnnl::eltwise_forward prim;
    dnnl::memory mem;
  };

  void run(float* x, int64_t n) {
    backend::detail::onednn_call("dnnl::eltwise_forward (exp)", [&] {
      if (!engine_) {
        engine_ = std::make_unique<dnnl::engine>(dnnl::engine::kind::cpu, 0);
        stream_ = std::make_unique<dnnl::stream>(*engine_);
      }
      if (cache_.size() > 64) cache_.clear();  // tile shapes changed many times: start again
      auto it = cache_.find(n);
      if (it == cache_.end()) {
        const dnnl::memory::desc md({n}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::a);
        const dnnl::eltwise_forward::primitive_desc pd(
            dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::eltwise_exp, md, 0.f, 0.f),
            *engine_);
        it = cache_.emplace(n, kernel{dnnl::eltwise_forward(pd), dnnl::memory(md, *engine_, nullptr)}).first;
      }
      kernel& k = it->second;
      k.mem.set_data_handle(x);
      k.prim.execute(*stream_, {{DNNL_ARG_SRC, k.mem}, {DNNL_ARG_DST, k.mem}});
      stream_->wait();
    });
  }

  std::unique_ptr<dnnl::engine> engine_;
  std::unique_ptr<dnnl::stream> stream_;
  std::map<int64_t, kernel> cache_;
};

}  // namespace overlap::layers
