// The interface through which the engine reaches one kind of device.

#ifndef GRADSERVE_ENGINE_DEVICE_DEVICE_BACKEND_H_
#define GRADSERVE_ENGINE_DEVICE_DEVICE_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/device/allocator.h"
#include "engine/device/device.h"

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

  // --- Streams (Note [CUDA streams]). A stream is an opaque non-zero id; a backend without
  // streams (the CPU, the simulated accelerator) answers 0 and ignores the rest. ---

  // The calling thread's current stream for device index.
  virtual uintptr_t CurrentStream(int /*index*/) const { return 0; }
  // Sets it (0: back to the device's own stream); returns the previous one.
  virtual uintptr_t ExchangeCurrentStream(int /*index*/, uintptr_t stream) { return stream; }
  // Makes later work on `consumer` wait for the work queued on `producer` so far.
  virtual void WaitStream(int /*index*/, uintptr_t /*consumer*/, uintptr_t /*producer*/) {}
  // Blocks the calling thread until the work queued on `stream` so far is done.
  virtual void SynchronizeStream(int /*index*/, uintptr_t /*stream*/) {}
  // Tells the device's memory that the block at ptr is in use by work on `stream`, which is not
  // the stream it was allocated on, so it is not reused before that work is done.
  virtual void RecordStream(int /*index*/, void* /*ptr*/, uintptr_t /*stream*/) {}
  // Called once on each Engine worker thread that serves device index, before its first task.
  virtual void InitializeThread(int /*index*/) {}
  // One line for server info, e.g. "simulated accelerator (host memory)".
  virtual std::string Describe(int index) const = 0;
};

}  // namespace gradserve

#endif  // GRADSERVE_ENGINE_DEVICE_DEVICE_BACKEND_H_
