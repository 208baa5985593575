// The interface through which the engine reaches one kind of device.

#ifndef GRADSERVE_ENGINE_DEVICE_DEVICE_BACKEND_H_
#define GRADSERVE_ENGINE_DEVICE_DEVICE_BACKEND_H_

#include <cstddef>
#include <string>

#include "engine/tensor/allocator.h"
#include "engine/tensor/device.h"

namespace gradserve {

// A backend serves every device of one DeviceType. Backends are registered once, at start-up,
// in the DeviceRegistry and live for the rest of the process.
//
// Thread safety: every method may be called from any thread at once.
class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;

  virtual DeviceType type() const = 0;
  virtual int device_count() const = 0;
  // The allocator of device `index`; valid for the life of the process.
  virtual Allocator* allocator(int index) = 0;
  // True if the CPU may read and write this backend's memory directly, so the CPU kernels serve
  // its tensors (the simulated accelerator); false for GPUs.
  virtual bool host_accessible() const = 0;
  // Copies nbytes from src to dst, where one or both live on this backend's devices and the
  // other may be the CPU. Returns when dst holds the bytes. Throws StatusError on failure.
  virtual void Copy(void* dst, Device dst_device, const void* src, Device src_device,
                    size_t nbytes) = 0;
  // Blocks until the device has finished the work queued on it.
  virtual void Synchronize(int /*index*/) {}
  // One line for server info, e.g. "simulated accelerator (host memory)".
  virtual std::string Describe(int index) const = 0;
};

}  // namespace gradserve

#endif  // GRADSERVE_ENGINE_DEVICE_DEVICE_BACKEND_H_
