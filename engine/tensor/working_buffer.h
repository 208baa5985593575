// WorkingBuffer: a kernel's scratch memory, charged to the request's memory budget.
//
// Note [Working buffers]
// A kernel's scratch memory whose size a client's shapes decide (conv2d's im2col columns, the
// double accumulators of a float32 reduction, layer_norm's sums for the weight gradient) is
// held for the request as its tensors are: WorkingBuffer charges it to the current budget
// (Note [Memory budget]) before it allocates it, and gives it back when it frees it, on
// whatever thread. A plain std::vector let conv2d allocate 1 GiB of columns under a budget of
// 16 MiB. Only the bytes are bounded: max_tensor_elements is about the tensors a client asks
// for, not about how a kernel computes them.

#ifndef GRADSERVE_ENGINE_TENSOR_WORKING_BUFFER_H_
#define GRADSERVE_ENGINE_TENSOR_WORKING_BUFFER_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <utility>

#include "engine/tensor/memory_budget.h"

namespace gradserve {

// A buffer of n elements of T charged to the budget current on the thread that makes it.
// Elements are default-initialized (indeterminate for arithmetic types) unless a value is
// given. Move-only.
//
// Thread safety: as a std::vector; the charge and its release are thread-safe.
template <typename T>
class WorkingBuffer {
 public:
  WorkingBuffer() = default;
  // Throws StatusError(RESOURCE_EXHAUSTED) over the budget or when the host is out of memory;
  // nothing is then charged or allocated.
  explicit WorkingBuffer(int64_t n) { Allocate(n); }
  WorkingBuffer(int64_t n, T value) {
    Allocate(n);
    std::fill(data_.get(), data_.get() + n, value);
  }
  WorkingBuffer(WorkingBuffer&& other) noexcept { *this = std::move(other); }
  WorkingBuffer& operator=(WorkingBuffer&& other) noexcept {
    Free();
    data_ = std::move(other.data_);
    size_ = std::exchange(other.size_, 0);
    budget_ = std::move(other.budget_);
    charged_ = std::exchange(other.charged_, 0);
    return *this;
  }
  ~WorkingBuffer() { Free(); }

  T* data() const { return data_.get(); }
  int64_t size() const { return size_; }
  T& operator[](int64_t i) const { return data_[i]; }

 private:
  void Allocate(int64_t n);
  void Free() {
    data_.reset();
    size_ = 0;
    if (budget_ != nullptr) budget_->Release(charged_);
    budget_.reset();
    charged_ = 0;
  }

  std::unique_ptr<T[]> data_;
  int64_t size_ = 0;
  std::shared_ptr<MemoryBudget> budget_;  // null: nothing charged
  int64_t charged_ = 0;
};

namespace internal {
// The bytes of n >= 0 elements of elem_size bytes; RESOURCE_EXHAUSTED if that overflows.
int64_t WorkingBufferBytes(int64_t n, size_t elem_size);
// Throws RESOURCE_EXHAUSTED: the host had no bytes for a working buffer.
[[noreturn]] void ThrowOutOfHostMemory(int64_t bytes);
}  // namespace internal

template <typename T>
void WorkingBuffer<T>::Allocate(int64_t n) {
  const int64_t bytes = internal::WorkingBufferBytes(n, sizeof(T));
  std::shared_ptr<MemoryBudget> budget = CurrentMemoryBudget();
  if (budget != nullptr) budget->Charge(bytes);
  T* p = n == 0 ? nullptr : new (std::nothrow) T[static_cast<size_t>(n)];
  if (n > 0 && p == nullptr) {
    if (budget != nullptr) budget->Release(bytes);
    internal::ThrowOutOfHostMemory(bytes);
  }
  data_.reset(p);
  size_ = n;
  budget_ = std::move(budget);
  charged_ = bytes;
}

}  // namespace gradserve

#endif  // GRADSERVE_ENGINE_TENSOR_WORKING_BUFFER_H_
