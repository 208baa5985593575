// Finding and registering NVIDIA GPUs: the public face of the CUDA backend in the device layer.
// Programs register GPUs with RegisterCudaDevices (engine/ops/cuda_ops.h), which also gives
// the ops their GPU kernels; RegisterCudaBackend is the device half of it.
//
// These functions exist in every build. In a build without the backend (GRADSERVE_CUDA=OFF, or
// no CUDA compiler where it was built) CudaBuilt() is false, CudaDeviceCount() is 0 and
// RegisterCudaBackend fails with FAILED_PRECONDITION, so callers need no #ifdef.
//
// Thread safety: all may be called from any thread; RegisterCudaBackend registers at most once.

#ifndef GRADSERVE_ENGINE_DEVICE_CUDA_DEVICES_H_
#define GRADSERVE_ENGINE_DEVICE_CUDA_DEVICES_H_

#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace gradserve {

// True if this binary contains the CUDA backend.
bool CudaBuilt();

// The number of GPUs the CUDA driver shows this process (after CUDA_VISIBLE_DEVICES); 0 when
// the backend is not built, no driver is loaded or no GPU is present, and then *why_none (if
// given) says which, e.g. "no CUDA driver: CUDA driver version is insufficient".
int CudaDeviceCount(std::string* why_none = nullptr);

// Registers the CUDA backend in the DeviceRegistry with the GPUs `physical` (indices among
// CudaDeviceCount(); empty means all of them). Device "cuda:N" is then physical[N], as with
// CUDA_VISIBLE_DEVICES. Each GPU gets its caching allocator and stream; the Engine starts its
// worker thread on first use.
// Errors: FAILED_PRECONDITION if the backend is not built or no GPU is present;
// INVALID_ARGUMENT for an index out of range or given twice; ALREADY_EXISTS if registered before.
absl::Status RegisterCudaBackend(absl::Span<const int> physical = {});

}  // namespace gradserve

#endif  // GRADSERVE_ENGINE_DEVICE_CUDA_DEVICES_H_
