// What the GPU tests share: registering the GPUs once per process, and the reason to skip when
// there is none (no CUDA backend in this build, no driver, no GPU).

#ifndef GRADSERVE_TESTS_ENGINE_CUDA_TEST_UTIL_H_
#define GRADSERVE_TESTS_ENGINE_CUDA_TEST_UTIL_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/device/device.h"
#include "engine/ops/cuda_ops.h"
#include "engine/tensor/tensor.h"

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

// t's values in row-major order as doubles, brought to the host, whatever its device, dtype and
// strides: what the GPU tests compare with the CPU's.
inline std::vector<double> HostValues(const Tensor& t) {
  const Tensor c = t.detach().To(kCPU).To(DType::kFloat64).contiguous();
  const double* d = c.data<double>();
  return std::vector<double>(d, d + c.numel());
}

}  // namespace gradserve::testing

#endif  // GRADSERVE_TESTS_ENGINE_CUDA_TEST_UTIL_H_
