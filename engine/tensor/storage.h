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

 private:
  Allocator* const allocator_;
  const Device device_;  // allocator_->device(), kept to spare a virtual call per use
  const size_t nbytes_;
  std::shared_ptr<MemoryBudget> budget_;
  void* data_ = nullptr;
};

}  // namespace gradserve

#endif  // GRADSERVE_ENGINE_TENSOR_STORAGE_H_
