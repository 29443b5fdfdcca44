#pragma once
/// @file
/// Where a plan is built (build_site): the arrangement of the ranks that its
/// builders read, and whether building makes what running needs. A plan
/// built to run makes its GEMM kernels, buffers and MPI datatypes; a dry
/// plan makes none of them, so that the cost model can build every
/// candidate and price the plan that would run (docs/design.md, "The model
/// prices the plan") at no cost in memory, primitives or MPI calls.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "overlap/backend/gemm.hpp"
#include "overlap/engine/buffer.hpp"
#include "overlap/runtime/context.hpp"

namespace overlap::detail {

/// The kernel of a ring step: under progress_policy::poll, config().
/// poll_chunks row bands of C with an MPI_Testall of the context's
/// outstanding requests between two bands (Open MPI moves data only inside
/// MPI calls), but no band thinner than the GEMM path's rate knee
/// (context::piece_knee: fewer bands rather than slower ones); otherwise
/// the product's kernel.
inline std::shared_ptr<const gemm_kernel> make_step_kernel(context& ctx, const gemm_desc& d) {
  const int64_t knee = ctx.piece_knee(d.in, d.n);
  const int64_t bands = std::min<int64_t>(ctx.config().poll_chunks, knee > 0 ? d.m / knee : d.m);
  if (ctx.config().progress != progress_policy::poll || bands < 2 || d.n == 0) return ctx.make_kernel(d);
  std::vector<banded_kernel::band> parts;
  // Bands read the plan's packed B where their kernels agree on its layout
  // (reading B as stored cost the AMX path about half its rate), else B as stored.
  for (const bool packed : {d.pack_b, false}) {
    parts.clear();
    for (int64_t i = 0; i < bands; ++i) {
      const int64_t r0 = d.m / bands * i + std::min(i, d.m % bands);
      const int64_t r1 = d.m / bands * (i + 1) + std::min(i + 1, d.m % bands);
      gemm_desc sub = d;
      sub.m = r1 - r0;
      sub.pack_b = packed;
      parts.push_back({r0, ctx.make_kernel(sub)});
    }
    if (banded_kernel::shares_packed_b(parts)) break;
  }
  // The context keeps its request group on the heap: its address survives
  // moves of the context.
  auto poll = [](void* group) { static_cast<mpi::request_group*>(group)->test_all(); };
  return std::make_shared<banded_kernel>(d, std::move(parts), poll, &ctx.requests());
}

/// Where a plan is built: the ranks' arrangement its builders read, and
/// what building makes (everything to run, or nothing: dry).
class build_site {
 public:
  /// To run, on the context's ranks.
  explicit build_site(context& ctx) : ctx_(&ctx), size_(ctx.size()), rank_(ctx.rank()), slots_(ctx.node_slots()) {}

  /// Dry, on the context's ranks (what the plan built to run would be).
  static build_site dry(context& ctx) {
    build_site s(ctx);
    s.dry_ = true;
    return s;
  }
  /// Dry, as rank p of R ranks without a context (projections to clusters
  /// that are not there): a ring in rank order, one rank per node.
  static build_site projected(int R, int p) {
    build_site s;
    s.size_ = R, s.rank_ = p, s.slots_ = 1, s.dry_ = true;
    return s;
  }

  [[nodiscard]] bool dry() const noexcept { return dry_; }
  /// The progress policy the plan runs under (config().progress, resolved;
  /// none when projected).
  [[nodiscard]] progress_policy progress() const noexcept {
    return ctx_ != nullptr ? ctx_->config().progress : progress_policy::none;
  }
  /// config().paced (automatic when projected).
  [[nodiscard]] paced_sends paced() const noexcept {
    return ctx_ != nullptr ? ctx_->config().paced : paced_sends::automatic;
  }
  [[nodiscard]] int size() const noexcept { return size_; }
  [[nodiscard]] int rank() const noexcept { return rank_; }
  /// context::ring_at, or rank order when projected.
  [[nodiscard]] int ring_at(int offset) const noexcept {
    return ctx_ != nullptr ? ctx_->ring_at(offset) : ((rank_ + offset) % size_ + size_) % size_;
  }
  /// context::node_slots (1 when projected).
  [[nodiscard]] int node_slots() const noexcept { return slots_; }
  /// context::node_peer (two_levels only, which a projection never is).
  [[nodiscard]] int node_peer(int nodes, int locals) const noexcept {
    return ctx_ != nullptr ? ctx_->node_peer(nodes, locals) : ring_at(nodes + locals);
  }

  /// The kernel of a GEMM (none when dry).
  [[nodiscard]] std::shared_ptr<const gemm_kernel> kernel(const gemm_desc& d) const {
    return dry_ ? nullptr : ctx_->make_kernel(d);
  }
  /// The kernel of a ring step's GEMM (make_step_kernel; none when dry).
  [[nodiscard]] std::shared_ptr<const gemm_kernel> step_kernel(const gemm_desc& d) const {
    return dry_ ? nullptr : make_step_kernel(*ctx_, d);
  }
  /// A buffer of `elements` (empty when dry).
  template <class T>
  [[nodiscard]] engine::buffer<T> buffer(size_t elements) const {
    return dry_ ? engine::buffer<T>() : engine::buffer<T>(elements);
  }

 private:
  build_site() = default;
  context* ctx_ = nullptr;
  int size_ = 1, rank_ = 0, slots_ = 1;
  bool dry_ = false;
};

}  // namespace overlap::detail
