// A block of device memory shared by the tensors that view it.

#ifndef GRADSERVE_ENGINE_TENSOR_STORAGE_H_
#define GRADSERVE_ENGINE_TENSOR_STORAGE_H_

#include <cstddef>
#include <memory>

#include "engine/tensor/allocator.h"
#include "engine/tensor/memory_budget.h"

namespace gradserve {

// Owns nbytes from an Allocator and gives them back when the last reference goes. The bytes are
// charged to the MemoryBudget current on the constructing thread (Note [Memory budget]).
//
// Note [Small storage inline]
// A backward pass over small tensors creates one or two per Node, and each used to cost three
// heap blocks (TensorImpl, Storage, bytes). Host storage of at most kInlineBytes keeps its bytes
// inside the Storage object instead, which make_shared allocates together with its control
// block: one block fewer to allocate and free per tensor. Such bytes are 16-byte aligned, as
// malloc's small blocks are.
//
// Thread safety: immutable after construction; the bytes themselves are the user's to guard.
class Storage {
 public:
  // Throws StatusError(RESOURCE_EXHAUSTED) when the budget or the device is out of memory.
  Storage(size_t nbytes, Allocator* allocator);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

  static constexpr size_t kInlineBytes = 64;

 private:
  bool is_inline() const { return data_ == inline_; }

  Allocator* const allocator_;
  const Device device_;  // allocator_->device(), kept to spare a virtual call per use
  const size_t nbytes_;
  std::shared_ptr<MemoryBudget> budget_;
  void* data_ = nullptr;
  // The bytes of a small host storage (Note [Small storage inline]).
  alignas(16) unsigned char inline_[kInlineBytes];
};

}  // namespace gradserve

#endif  // GRADSERVE_ENGINE_TENSOR_STORAGE_H_
