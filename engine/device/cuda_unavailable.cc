// cuda_devices.h for builds without the CUDA backend (see engine/CMakeLists.txt).

#include "engine/device/cuda_devices.h"

namespace gradserve {

bool CudaBuilt() { return false; }

int CudaDeviceCount(std::string* why_none) {
  if (why_none != nullptr) *why_none = "this build has no CUDA backend (GRADSERVE_CUDA=OFF)";
  return 0;
}

absl::Status RegisterCudaBackend(absl::Span<const int>) {
  return absl::FailedPreconditionError(
      "this build has no CUDA backend; rebuild with -DGRADSERVE_CUDA=ON on a machine with nvcc");
}

}  // namespace gradserve
