// The memory interface that each device backend implements.

#ifndef GRADSERVE_ENGINE_DEVICE_ALLOCATOR_H_
#define GRADSERVE_ENGINE_DEVICE_ALLOCATOR_H_

#include <cstddef>

#include "engine/device/device.h"

namespace gradserve {

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
};

// The process-wide allocator for host memory.
Allocator* CpuAllocator();

}  // namespace gradserve

#endif  // GRADSERVE_ENGINE_DEVICE_ALLOCATOR_H_
