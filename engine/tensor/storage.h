// A block of device memory shared by the tensors that view it.

#ifndef GRADSERVE_ENGINE_TENSOR_STORAGE_H_
#define GRADSERVE_ENGINE_TENSOR_STORAGE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "engine/device/allocator.h"
#include "engine/tensor/memory_budget.h"

namespace gradserve {

// Owns nbytes from an Allocator and gives them back when the last reference goes, or wraps
// memory that something else owns (Note [Adopted storage]). Either way the bytes are charged to
// the MemoryBudget current on the constructing thread (Note [Memory budget]).
//
// Note [Adopted storage]
// A Storage may wrap host memory it did not allocate, such as the bytes of a received message,
// so that a tensor can use them where they lie instead of copying them. The Storage holds a
// shared reference to the memory's owner (any object, type-erased) and drops it when the last
// tensor goes; it never frees the bytes itself. The wrapped bytes are charged to the current
// budget exactly as an allocation of the same size would be, so adopting is no way around a
// request's memory limit. Tensor::FromExternal checks alignment and copies when the bytes are
// misaligned for their dtype.
//
// Note [Small storage inline]
// A backward pass over small tensors creates one or two per Node, and each used to cost three
// heap blocks (TensorImpl, Storage, bytes). Host storage of at most kInlineBytes keeps its bytes
// inside the Storage object instead, which make_shared allocates together with its control
// block: one block fewer to allocate and free per tensor. Such bytes are 16-byte aligned, as
// malloc's small blocks are.
//
// Note [Version counter]
// Every write into a tensor's elements by an in-place op (add_, copy_, ...) bumps the version
// of its Storage, as PyTorch's VariableVersion: a SavedVariable records the version it saw and
// refuses to give back data written since (Note [Saved versions] in
// engine/autograd/saved_variable.h). The counter lives on the Storage because everything that
// shares the elements shares it: a tensor, its views (narrow, select, reshape, transpose, ...)
// and its detach()ed aliases, exactly the tensors that share PyTorch's counter. Kernels that
// write a buffer no one else holds (Note [Reusing the gradient's buffer]) do not bump it: no
// saved tensor can see them. Reading it is one relaxed load, all that a Node's unpack adds.
//
// Thread safety: immutable after construction but for the version counter, which is atomic;
// the bytes themselves are the user's to guard.
class Storage {
 public:
  // Throws StatusError(RESOURCE_EXHAUSTED) when the budget or the device is out of memory.
  Storage(size_t nbytes, Allocator* allocator)
      : Storage(nbytes, allocator, CurrentMemoryBudget()) {}
  // The same, charging budget (null: none), which the caller read as CurrentMemoryBudget().
  Storage(size_t nbytes, Allocator* allocator, const std::shared_ptr<MemoryBudget>& budget);
  // Wraps nbytes at data on device, kept alive by owner (Note [Adopted storage]). Throws
  // StatusError(RESOURCE_EXHAUSTED) when the budget is out of memory; owner is then released.
  Storage(void* data, size_t nbytes, Device device, std::shared_ptr<const void> owner);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  // Whether the bytes belong to another owner (Note [Adopted storage]).
  bool adopted() const { return allocator_ == nullptr; }
  // How many in-place writes the bytes have had (Note [Version counter]).
  uint32_t version() const { return version_.load(std::memory_order_relaxed); }
  void BumpVersion() { version_.fetch_add(1, std::memory_order_relaxed); }

  static constexpr size_t kInlineBytes = 64;

 private:
  bool is_inline() const { return data_ == inline_; }

  Allocator* const allocator_;  // null for adopted memory
  const Device device_;         // allocator_->device(), kept to spare a virtual call per use
  // Note [Version counter]. Next to device_, in what was padding: no Storage grows.
  std::atomic<uint32_t> version_{0};
  const size_t nbytes_;
  // Charged nbytes_ (Note [A budget outlives its charges]); null if none or nbytes_ is 0.
  MemoryBudget* const budget_;
  void* data_ = nullptr;
  std::shared_ptr<const void> owner_;  // adopted memory's owner; null otherwise
  // The bytes of a small host storage (Note [Small storage inline]).
  alignas(16) unsigned char inline_[kInlineBytes];
};

// Bounds the freed big host blocks kept for reuse (Note [Big host blocks]): 256 MiB unless set
// lower, as a server in a small container does (Note [Sizing the server's memory]). Takes
// effect at the next block freed. Thread-safe.
void SetBigBlockCacheBytes(size_t bytes);

}  // namespace gradserve

#endif  // GRADSERVE_ENGINE_TENSOR_STORAGE_H_
