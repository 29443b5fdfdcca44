#pragma once
/// @file
/// Packing the stationary operand B once per call for every ring piece that
/// reads all of it.

#include <cstddef>
#include <cstdint>
#include <memory>

#include "overlap/backend/gemm.hpp"
#include "overlap/engine/buffer.hpp"

namespace overlap::detail {

/// Packs the stationary operand B once per call for every ring piece that
/// reads all of it (docs/design.md, "Pieces"): the step kernels are made with
/// gemm_desc::pack_b, and if every non-empty piece's kernel reads the same
/// packed layout, one of them packs B into a plan-owned buffer before the
/// ring; otherwise (no packed layout on this CPU, or layouts that differ
/// between piece shapes) the steps are rebuilt to read B as stored.
struct b_packing {
  std::shared_ptr<const gemm_kernel> packer;  ///< null: B is read as stored
  engine::buffer<std::byte> packed;

  /// Steps: a range of {desc, kernel, nonempty()}; rebuild(desc) makes a kernel.
  template <class Steps, class Rebuild>
  void choose(Steps& steps, Rebuild&& rebuild) {
    uint64_t layout = 0;
    bool same = true;
    for (const auto& st : steps) {
      if (!st.nonempty() || !st.desc.pack_b) continue;
      const uint64_t l = st.kernel->packed_b_layout();
      if (layout == 0 && packer == nullptr) layout = l, packer = st.kernel;
      same = same && l == layout;
    }
    if (same && layout != 0) {
      packed = engine::buffer<std::byte>(packer->packed_b_bytes());
      return;
    }
    packer = nullptr;
    for (auto& st : steps)
      if (st.desc.pack_b) st.desc.pack_b = false, st.kernel = rebuild(st.desc);
  }
  /// Before the ring: packs B (as stored) for this call.
  void pack(const void* b) const {
    if (packer != nullptr) packer->pack_b(b, packed.data());
  }
  /// The B a piece reads: the packed copy, or `stored`.
  [[nodiscard]] const void* b(const void* stored) const { return packer != nullptr ? packed.data() : stored; }
};

}  // namespace overlap::detail
