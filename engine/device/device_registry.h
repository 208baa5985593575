// The process-wide table of device backends.

#ifndef GRADSERVE_ENGINE_DEVICE_DEVICE_REGISTRY_H_
#define GRADSERVE_ENGINE_DEVICE_DEVICE_REGISTRY_H_

#include <array>
#include <atomic>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "engine/device/device_backend.h"

namespace gradserve {

// The CPU backend is always present. Other backends are registered once at start-up (the
// server's --devices flag, a test's set-up) and never removed.
//
// Thread safety: Register may race with lookups; a lookup sees a backend either fully
// registered or not at all.
class DeviceRegistry {
 public:
  static DeviceRegistry& Get();

  // Adds backend for its type. Returns ALREADY_EXISTS if that type has one (the first stays).
  absl::Status Register(std::unique_ptr<DeviceBackend> backend);

  // The backend of a type, or null if none is registered.
  DeviceBackend* backend(DeviceType type) const {
    return backends_[static_cast<int>(type)].load(std::memory_order_acquire);
  }
  // OK if device exists; otherwise INVALID_ARGUMENT naming it.
  absl::Status Validate(Device device) const;
  // The allocator of an existing device; throws StatusError(INVALID_ARGUMENT) otherwise.
  Allocator* allocator(Device device) const;
  bool host_accessible(Device device) const;
  // Every device, CPU first.
  std::vector<Device> devices() const;

 private:
  DeviceRegistry();
  std::array<std::atomic<DeviceBackend*>, kNumDeviceTypes> backends_{};
};

// Registers `count` simulated accelerators ("sim:0" ...). Returns ALREADY_EXISTS if simulated
// devices were registered before (with whatever count they had then).
absl::Status RegisterSimulatedDevices(int count);

}  // namespace gradserve

#endif  // GRADSERVE_ENGINE_DEVICE_DEVICE_REGISTRY_H_
