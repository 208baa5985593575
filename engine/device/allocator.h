// The memory interface that each device backend implements.

#ifndef GRADSERVE_ENGINE_DEVICE_ALLOCATOR_H_
#define GRADSERVE_ENGINE_DEVICE_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <optional>

#include "engine/device/device.h"

namespace gradserve {

// What an allocator holds now, for the server's metrics (read when they are scraped).
struct MemoryStats {
  // Bytes handed out by Allocate and not yet given back.
  int64_t allocated_bytes = 0;
  // Bytes taken from the system: allocated_bytes and what is kept for reuse.
  int64_t reserved_bytes = 0;
  // The most allocated_bytes has been; -1 where the allocator does not keep it.
  int64_t peak_allocated_bytes = -1;
};

// Hands out raw memory on one device.
//
// Thread safety: Allocate and Deallocate may be called from any thread at once.
// Errors: Allocate throws StatusError(RESOURCE_EXHAUSTED) when the device is out of memory; it
// never returns nullptr for a non-zero size.
class Allocator {
 public:
  virtual ~Allocator() = default;

  // Returns at least nbytes, aligned to 64 bytes (16 for sizes up to 256 bytes); nbytes may be
  // 0.
  virtual void* Allocate(size_t nbytes) = 0;
  // Gives back memory from Allocate of the same size.
  virtual void Deallocate(void* ptr, size_t nbytes) = 0;
  virtual Device device() const = 0;
  // What this allocator holds now, or nullopt if it keeps no count (one that hands out another
  // allocator's memory, counted there). Cheap enough for a scrape; never on a hot path.
  virtual std::optional<MemoryStats> memory_stats() const { return std::nullopt; }
};

// The process-wide allocator for host memory.
Allocator* CpuAllocator();

}  // namespace gradserve

#endif  // GRADSERVE_ENGINE_DEVICE_ALLOCATOR_H_
