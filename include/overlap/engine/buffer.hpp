#pragma once
/// @file
/// Workspace owned by a plan: 64-byte aligned, allocated once when the plan is built.
/// Under SimGrid SMPI's timing-only runs it may be shared by the simulated
/// ranks (mpi::shared_workspaces).

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>

#include "overlap/mpi/simulator.hpp"

namespace overlap::engine {

/// An owned, 64-byte aligned array of T for a plan's workspaces (move-only;
/// under SimGrid SMPI with shared workspaces, one allocation serves every
/// simulated rank).
template <class T>
class buffer {
 public:
  using value_type = T;  ///< the element type
  buffer() = default;
  /// `elements` values, uninitialised; throws std::bad_alloc.
  explicit buffer(size_t elements) : size_(elements) {
    if (elements == 0) return;
    const size_t bytes = (elements * sizeof(T) + alignment - 1) / alignment * alignment;
    bool shared = false;
    T* p = static_cast<T*>(mpi::allocate_workspace(alignment, bytes, shared));  // sets `shared` before the deleter
    data_ = std::unique_ptr<T, free_deleter>(p, free_deleter{shared});
    if (!data_) throw std::bad_alloc();
  }
  [[nodiscard]] T* data() const noexcept { return data_.get(); }  ///< the first value, or null when empty
  [[nodiscard]] size_t size() const noexcept { return size_; }    ///< the number of values

 private:
  static constexpr size_t alignment = 64;
  struct free_deleter {
    bool shared = false;  ///< allocated by mpi::allocate_workspace as shared
    void operator()(T* p) const noexcept { mpi::free_workspace(p, shared); }
  };
  std::unique_ptr<T, free_deleter> data_;
  size_t size_ = 0;
};

}  // namespace overlap::engine
