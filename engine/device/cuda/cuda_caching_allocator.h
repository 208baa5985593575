// The caching allocator of one GPU: device memory without a cudaMalloc or cudaFree per tensor.
//
// Note [Caching allocator]
// cudaMalloc and cudaFree cost tens of microseconds and cudaFree synchronizes the whole device,
// so, as PyTorch does, freed blocks are kept and handed out again. A block belongs to the stream
// that was current when it was allocated; it is reused only for allocations on that stream,
// where stream order alone makes reuse safe: work queued after the free runs after every kernel
// that used the block before it. A block also used on other streams (RecordStream, which the
// Engine calls when a gradient crosses streams) waits for events recorded on those streams at
// the free before it can be reused.
// Sizes are rounded up: to 512 bytes below 1 MiB, to 2 MiB above it. A cached block serves a
// request of at least half its size. When cudaMalloc fails, every unused cached block is freed
// and the allocation tried once more before it fails with RESOURCE_EXHAUSTED.
//
// Thread safety: Allocate and Deallocate may be called from any thread; one mutex per GPU
// guards its pools.

#ifndef GRADSERVE_ENGINE_DEVICE_CUDA_CUDA_CACHING_ALLOCATOR_H_
#define GRADSERVE_ENGINE_DEVICE_CUDA_CUDA_CACHING_ALLOCATOR_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "engine/device/allocator.h"
#include "engine/util/mutex.h"

namespace gradserve::cuda {

class CachingAllocator final : public Allocator {
 public:
  // index: "cuda:index"; physical: its CUDA runtime index.
  CachingAllocator(int index, int physical);
  ~CachingAllocator() override;  // never runs: backends live for the process

  void* Allocate(size_t nbytes) override;
  void Deallocate(void* ptr, size_t nbytes) override;
  Device device() const override { return {DeviceType::kCUDA, static_cast<int16_t>(index_)}; }

  // Marks the block at ptr (from Allocate) as used by work on `stream` as well.
  void RecordStream(void* ptr, cudaStream_t stream);
  // Frees every cached block no tensor holds (cudaFree); for tests and memory pressure.
  void ReleaseCached();

  struct Stats {
    size_t allocated_bytes = 0;       // held by tensors
    size_t cached_bytes = 0;          // kept for reuse
    size_t peak_allocated_bytes = 0;  // the most allocated_bytes has been
    int64_t cuda_mallocs = 0;         // calls to cudaMalloc so far
  };
  Stats stats() const;
  // stats() for the server's metrics: reserved is allocated and cached, all from cudaMalloc.
  std::optional<MemoryStats> memory_stats() const override;

 private:
  struct Block {
    size_t size = 0;
    cudaStream_t stream = nullptr;         // the stream it was allocated on
    std::vector<cudaStream_t> other_uses;  // RecordStream
  };
  // A freed block waiting for events on the other streams that used it.
  struct Pending {
    void* ptr;
    std::vector<cudaEvent_t> events;
  };
  using Pool = std::multimap<std::pair<cudaStream_t, size_t>, void*>;

  static size_t RoundSize(size_t nbytes);
  void* FindCached(cudaStream_t stream, size_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CollectPending() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseCachedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int index_;
  const int physical_;
  mutable Mutex mu_;
  // Every block from cudaMalloc, in use or cached, by address.
  absl::flat_hash_map<void*, Block> blocks_ ABSL_GUARDED_BY(mu_);
  Pool free_ ABSL_GUARDED_BY(mu_);
  std::vector<Pending> pending_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradserve::cuda

#endif  // GRADSERVE_ENGINE_DEVICE_CUDA_CUDA_CACHING_ALLOCATOR_H_
