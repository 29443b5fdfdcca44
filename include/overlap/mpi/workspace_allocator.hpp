#pragma once
/// @file
/// std::vector's allocator for a layer's activations, parameters and
/// scratch: an ordinary aligned allocation, except under SimGrid SMPI's
/// timing-only runs (mpi::shared_workspaces), where it is shared by every
/// simulated rank as the plans' workspaces are. A transformer block's
/// buffers are about 130 MiB per rank at the default shape: 130 GiB at 1024
/// simulated ranks, unless the ranks share them.

#include <algorithm>
#include <cstddef>
#include <limits>
#include <new>
#include <vector>

#include "overlap/mpi/simulator.hpp"

namespace overlap::mpi {

/// A stateless allocator: what it allocates is shared by the simulated
/// ranks when mpi::shared_workspaces() holds at the time of the allocation
/// (then the contents are garbage, written by every rank), else this rank's
/// own, 64-byte aligned. Either kind is freed by any copy of it.
template <class T>
struct workspace_allocator {
  using value_type = T;  ///< the element type

  workspace_allocator() noexcept = default;
  /// Rebinding: the allocators of every type are alike.
  template <class U>
  workspace_allocator(const workspace_allocator<U>& /*other*/) noexcept {}  // NOLINT: implicit, as the standard's

  /// n values, uninitialised; throws std::bad_alloc.
  [[nodiscard]] T* allocate(size_t n) {
    if (n > std::numeric_limits<size_t>::max() / sizeof(T) - alignment) throw std::bad_array_new_length();
    const size_t bytes = std::max<size_t>(1, (n * sizeof(T) + alignment - 1) / alignment) * alignment;
    bool shared = false;
    void* p = allocate_workspace(alignment, bytes, shared);
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  /// Frees what allocate returned (a block lent by the simulation goes back to it).
  void deallocate(T* p, size_t /*n*/) noexcept {
    const std::vector<void*>& held = detail::shared_blocks_held();
    free_workspace(p, std::find(held.begin(), held.end(), static_cast<void*>(p)) != held.end());
  }
  /// Every two are interchangeable.
  friend bool operator==(const workspace_allocator& /*a*/, const workspace_allocator& /*b*/) noexcept { return true; }
  /// Never: every two are interchangeable.
  friend bool operator!=(const workspace_allocator& /*a*/, const workspace_allocator& /*b*/) noexcept { return false; }

 private:
  static constexpr size_t alignment = 64;
};

}  // namespace overlap::mpi

namespace overlap {

/// A vector of a layer's buffers: shared by the simulated ranks in SMPI's
/// timing-only runs (mpi::workspace_allocator), an ordinary vector elsewhere.
template <class T>
using workspace_vector = std::vector<T, mpi::workspace_allocator<T>>;

}  // namespace overlap
