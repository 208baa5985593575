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

// Note [Bare device names]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// "cuda" and "sim" without an index name the device of that type the current request was given,
// as PyTorch's "cuda" names the current device. The server gives each request the GPU and the
// simulated device with the fewest requests in flight (server/run/device_load.h), so requests
// that name "cuda" spread over the GPUs it serves, and sets that choice for the request's
// thread with a DeviceChoiceScope; a backward pass carries it to the threads that run its Nodes
// (a checkpoint's recompute parses its `to` again there), and a session keeps its Forward's
// choice for its later calls. With no scope, a bare name means index 0.
struct DeviceChoice {
  int16_t cuda = 0;
  int16_t sim = 0;
  friend constexpr bool operator==(DeviceChoice a, DeviceChoice b) {
    return a.cuda == b.cuda && a.sim == b.sim;
  }
};

// The calling thread's choice (Note [Bare device names]).
inline thread_local DeviceChoice current_device_choice;

inline DeviceChoice CurrentDeviceChoice() { return current_device_choice; }

// Sets the calling thread's choice for the scope's life.
class DeviceChoiceScope {
 public:
  explicit DeviceChoiceScope(DeviceChoice choice) : previous_(current_device_choice) {
    current_device_choice = choice;
  }
  ~DeviceChoiceScope() { current_device_choice = previous_; }
  DeviceChoiceScope(const DeviceChoiceScope&) = delete;
  DeviceChoiceScope& operator=(const DeviceChoiceScope&) = delete;

 private:
  const DeviceChoice previous_;
};

// Parses "cpu", "sim", "sim:N", "cuda", "cuda:N"; "sim" and "cuda" alone name the calling
// thread's choice (Note [Bare device names]). Whether the device exists is the DeviceRegistry's
// business, not this function's.
absl::StatusOr<Device> ParseDevice(absl::string_view name);

}  // namespace gradserve

#endif  // GRADSERVE_ENGINE_DEVICE_DEVICE_H_
