#pragma once
/// @file
/// Workspace owned by a plan: 64-byte aligned, allocated once when the plan is built.

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>

namespace overlap::engine {

template <class T>
class buffer {
 public:
  buffer() = default;
  explicit buffer(size_t elements) : size_(elements) {
    if (elements == 0) return;
    const size_t bytes = (elements * sizeof(T) + alignment - 1) / alignment * alignment;
    data_.reset(static_cast<T*>(std::aligned_alloc(alignment, bytes)));
    if (!data_) throw std::bad_alloc();
  }
  [[nodiscard]] T* data() const noexcept { return data_.get(); }
  [[nodiscard]] size_t size() const noexcept { return size_; }

 private:
  static constexpr size_t alignment = 64;
  struct free_deleter {
    void operator()(T* p) const noexcept { std::free(p); }
  };
  std::unique_ptr<T, free_deleter> data_;
  size_t size_ = 0;
};

}  // namespace overlap::engine
