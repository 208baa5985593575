// What the GPU tests share: registering the GPUs once per process, and the reason to skip when
// there is none (no CUDA backend in this build, no driver, no GPU).

#ifndef GRADSERVE_TESTS_ENGINE_CUDA_TEST_UTIL_H_
#define GRADSERVE_TESTS_ENGINE_CUDA_TEST_UTIL_H_

#include <string>

#include "absl/status/status.h"
#include "engine/device/cuda_devices.h"
#include "engine/tensor/device.h"

namespace gradserve::testing {

inline constexpr Device kGpu{DeviceType::kCUDA, 0};

// Registers every GPU once for this process; empty if it could, else why not.
inline std::string GpuUnavailable() {
  static const std::string why = [] {
    std::string reason;
    if (!CudaBuilt()) return std::string("this build has no CUDA backend");
    if (CudaDeviceCount(&reason) == 0) return reason;
    absl::Status s = RegisterCudaDevices();
    if (!s.ok() && !absl::IsAlreadyExists(s)) return std::string(s.message());
    return std::string();
  }();
  return why;
}

}  // namespace gradserve::testing

#endif  // GRADSERVE_TESTS_ENGINE_CUDA_TEST_UTIL_H_
