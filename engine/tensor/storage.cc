#include "engine/tensor/storage.h"

#include <sys/mman.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "engine/util/mutex.h"
#include "engine/util/sharded_counter.h"
#include "engine/util/status_error.h"

namespace gradserve {

Storage::Storage(size_t nbytes, Allocator* allocator, const std::shared_ptr<MemoryBudget>& budget)
    : allocator_(allocator),
      device_(allocator->device()),
      nbytes_(nbytes),
      budget_(nbytes > 0 ? budget.get() : nullptr) {
  if (budget_) budget_->Charge(static_cast<int64_t>(nbytes));
  if (nbytes > 0 && nbytes <= kInlineBytes && allocator == CpuAllocator()) {
    data_ = inline_;
    return;
  }
  try {
    data_ = allocator_->Allocate(nbytes);
  } catch (...) {
    if (budget_) budget_->Release(static_cast<int64_t>(nbytes));
    throw;
  }
}

Storage::Storage(void* data, size_t nbytes, Device device, std::shared_ptr<const void> owner)
    : allocator_(nullptr),
      device_(device),
      nbytes_(nbytes),
      budget_(nbytes > 0 ? CurrentMemoryBudget().get() : nullptr),
      data_(data),
      owner_(std::move(owner)) {
  if (budget_) budget_->Charge(static_cast<int64_t>(nbytes));
}

Storage::~Storage() {
  if (allocator_ != nullptr && !is_inline()) allocator_->Deallocate(data_, nbytes_);
  if (budget_) budget_->Release(static_cast<int64_t>(nbytes_));
}

namespace {

// Note [Big host blocks]
// Host blocks of kBigBlockBytes or more (the 64 MiB tensors of a big request, their outputs and
// gradients) do not come from malloc, which would map fresh memory for each and fault it in 4
// KiB at a time, one page fault per 4 KiB on every request: about a third of the time of a
// 64 MiB request went to such faults. Instead they are mapped in whole 2 MiB huge pages,
// 2 MiB aligned, with madvise(MADV_HUGEPAGE) (transparent huge pages in "madvise" mode take
// them then; otherwise they are ordinary pages), and a freed block is kept for reuse by the next
// allocation of the same rounded size. The cache is bounded: at most kMaxCachedBytes of free
// blocks are kept, the oldest unmapped first, so an idle server holds at most that much more
// than its live tensors. A reused block is not zeroed: Allocate promises uninitialized memory.
constexpr size_t kBigBlockBytes = size_t{1} << 20;
constexpr size_t kHugePageBytes = size_t{2} << 20;
constexpr size_t kMaxCachedBytes = size_t{256} << 20;
// The bound in force: kMaxCachedBytes unless the program set another (SetBigBlockCacheBytes).
std::atomic<size_t> max_cached_bytes{kMaxCachedBytes};

// Maps and caches big blocks (Note [Big host blocks]).
//
// Thread safety: all methods may be called from any thread at once.
class BigBlockCache {
 public:
  // The size a big block of nbytes really has.
  static size_t Rounded(size_t nbytes) {
    return (nbytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  }

  // A block of rounded bytes (from Rounded), reused or newly mapped; null if mmap fails.
  void* Take(size_t rounded) {
    {
      MutexLock lock(&mutex_);
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (it->size != rounded) continue;
        void* p = it->ptr;
        free_.erase(it);
        cached_bytes_ -= rounded;
        return p;
      }
    }
    return Map(rounded);
  }

  // Keeps a block from Take for reuse, unmapping the oldest ones past the bound.
  void Give(void* ptr, size_t rounded) {
    std::vector<Block> unmap;
    {
      MutexLock lock(&mutex_);
      const size_t bound = max_cached_bytes.load(std::memory_order_relaxed);
      if (rounded > bound) {
        unmap.push_back({ptr, rounded});
      } else {
        free_.push_back({ptr, rounded});
        cached_bytes_ += rounded;
        while (cached_bytes_ > bound) {
          unmap.push_back(free_.front());
          cached_bytes_ -= free_.front().size;
          free_.erase(free_.begin());
        }
      }
    }
    for (const Block& b : unmap) munmap(b.ptr, b.size);
  }

  // Bytes of free blocks kept for reuse now.
  size_t cached_bytes() const {
    MutexLock lock(&mutex_);
    return cached_bytes_;
  }

 private:
  struct Block {
    void* ptr;
    size_t size;
  };

  // Maps rounded bytes at a 2 MiB boundary (mapping more and trimming), so that the kernel can
  // back the whole block with huge pages.
  static void* Map(size_t rounded) {
    const size_t span = rounded + kHugePageBytes;
    void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return nullptr;
    const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t aligned = (start + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
    if (aligned > start) munmap(raw, aligned - start);
    const uintptr_t end = start + span;
    if (end > aligned + rounded) {
      munmap(reinterpret_cast<void*>(aligned + rounded), end - (aligned + rounded));
    }
    void* p = reinterpret_cast<void*>(aligned);
    madvise(p, rounded, MADV_HUGEPAGE);  // advice only: without THP the block still works
    return p;
  }

  mutable Mutex mutex_;                              // guards free_ and cached_bytes_
  std::vector<Block> free_ ABSL_GUARDED_BY(mutex_);  // oldest first
  size_t cached_bytes_ ABSL_GUARDED_BY(mutex_) = 0;
};

class CpuAllocatorImpl final : public Allocator {
 public:
  void* Allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    // Small tensors take malloc's 16-byte alignment: glibc's aligned path costs several times
    // more, and a backward of tiny tensors allocates one per Node. Large ones are 64-byte
    // aligned for vector loads; big ones are whole huge pages (Note [Big host blocks]).
    constexpr size_t kSmall = 256;
    constexpr size_t kAlign = 64;
    const size_t rounded = (nbytes + kAlign - 1) / kAlign * kAlign;
    if (rounded < nbytes || nbytes > (size_t{1} << 62)) {
      ThrowStatus(absl::ResourceExhaustedError("allocation size overflows"));
    }
    void* p = nbytes >= kBigBlockBytes ? big_.Take(BigBlockCache::Rounded(nbytes))
              : nbytes <= kSmall       ? std::malloc(nbytes)
                                       : std::aligned_alloc(kAlign, rounded);
    if (p == nullptr) {
      ThrowStatus(absl::ResourceExhaustedError(
          absl::StrCat("out of host memory allocating ", nbytes, " bytes")));
    }
    allocated_.Add(static_cast<int64_t>(nbytes));
    return p;
  }
  void Deallocate(void* ptr, size_t nbytes) override {
    if (ptr == nullptr) return;  // Allocate(0)
    allocated_.Add(-static_cast<int64_t>(nbytes));
    if (nbytes >= kBigBlockBytes) {
      big_.Give(ptr, BigBlockCache::Rounded(nbytes));
    } else {
      std::free(ptr);
    }
  }
  Device device() const override { return kCPU; }
  // Reserved: the bytes handed out and the big blocks cached for reuse (Note [Big host
  // blocks]); what malloc keeps for itself is not counted. No peak: the count is sharded.
  std::optional<MemoryStats> memory_stats() const override {
    MemoryStats stats;
    stats.allocated_bytes = allocated_.Sum();
    stats.reserved_bytes = stats.allocated_bytes + static_cast<int64_t>(big_.cached_bytes());
    return stats;
  }

 private:
  BigBlockCache big_;
  // Bytes handed out and not given back, added to on every allocation by every thread, so
  // sharded by thread (Note [Counters sharded by thread]).
  ShardedCounter allocated_;
};

}  // namespace

Allocator* CpuAllocator() {
  static CpuAllocatorImpl* const allocator = new CpuAllocatorImpl;
  return allocator;
}

void SetBigBlockCacheBytes(size_t bytes) {
  max_cached_bytes.store(bytes, std::memory_order_relaxed);
}

}  // namespace gradserve
