// Error checks and the current-device guard for code that calls the CUDA runtime.
//
// Only files built with the CUDA backend include this (engine/device/cuda, engine/ops/cuda).
// Errors: every failed CUDA call becomes a StatusError (Note [Errors inside the engine]):
// RESOURCE_EXHAUSTED when the GPU is out of memory, INTERNAL otherwise, naming the call and
// CUDA's message, so a failure on a device thread reaches the caller like any other op error.

#ifndef GRADSERVE_ENGINE_DEVICE_CUDA_CUDA_CHECK_H_
#define GRADSERVE_ENGINE_DEVICE_CUDA_CUDA_CHECK_H_

#include <cuda_runtime.h>

namespace gradserve::cuda {

[[noreturn]] void ThrowCudaError(cudaError_t error, const char* what, const char* file, int line);

// Runs a CUDA runtime call and throws StatusError unless it returned cudaSuccess.
#define GS_CUDA_CHECK(expr)                                                         \
  do {                                                                              \
    const cudaError_t gs_cuda_error_ = (expr);                                      \
    if (gs_cuda_error_ != cudaSuccess) {                                            \
      ::gradserve::cuda::ThrowCudaError(gs_cuda_error_, #expr, __FILE__, __LINE__); \
    }                                                                               \
  } while (false)

// After a kernel launch: throws if the launch failed (bad configuration, no kernel image).
#define GS_CUDA_CHECK_LAUNCH(kernel_name) GS_CUDA_CHECK(cudaPeekAtLastError())

// Makes a GPU the calling thread's current CUDA device for a scope and restores the previous
// one after. `physical` is the CUDA runtime's index, not the "cuda:N" index.
class DeviceGuard {
 public:
  explicit DeviceGuard(int physical);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace gradserve::cuda

#endif  // GRADSERVE_ENGINE_DEVICE_CUDA_CUDA_CHECK_H_
