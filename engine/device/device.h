// Where a Tensor's memory lives: the CPU, a simulated accelerator or a CUDA GPU.

#ifndef GRADSERVE_ENGINE_DEVICE_DEVICE_H_
#define GRADSERVE_ENGINE_DEVICE_DEVICE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradserve {

enum class DeviceType : uint8_t {
  kCPU = 0,
  // Host memory behind an accelerator's interface, with its own worker threads: lets every
  // cross-device path of the Engine run without a GPU. Written "sim:N".
  kSimulated = 1,
  kCUDA = 2,
};
inline constexpr int kNumDeviceTypes = 3;

struct Device {
  DeviceType type = DeviceType::kCPU;
  // Index among the devices of its type; always 0 for the CPU.
  int16_t index = 0;

  constexpr bool is_cpu() const { return type == DeviceType::kCPU; }
  friend constexpr bool operator==(Device a, Device b) {
    return a.type == b.type && a.index == b.index;
  }
  friend constexpr bool operator!=(Device a, Device b) { return !(a == b); }
  template <typename H>
  friend H AbslHashValue(H h, Device d) {
    return H::combine(std::move(h), d.type, d.index);
  }
};

inline constexpr Device kCPU{DeviceType::kCPU, 0};

// "cpu", "sim:0", "cuda:1".
std::string DeviceName(Device device);
const char* DeviceTypeName(DeviceType type);

// Parses "cpu", "sim", "sim:N", "cuda", "cuda:N" (no index means 0). Whether the device exists is
// the DeviceRegistry's business, not this function's.
absl::StatusOr<Device> ParseDevice(absl::string_view name);

}  // namespace gradserve

#endif  // GRADSERVE_ENGINE_DEVICE_DEVICE_H_
