// Registering NVIDIA GPUs for the ops: the CUDA backend's devices (engine/device/cuda_devices.h)
// together with the GPU kernels of every op (engine/ops/cuda/). The device layer cannot
// register the kernels itself, since they live above it (engine/README.md); this is the one
// call that programs make.
//
// Exists in every build: without the CUDA backend it fails with FAILED_PRECONDITION, as
// RegisterCudaBackend does, so callers (the server's --devices flag, tests) need no #ifdef.
// Thread safety: may be called from any thread; the GPUs are registered at most once.

#ifndef GRADSERVE_ENGINE_OPS_CUDA_OPS_H_
#define GRADSERVE_ENGINE_OPS_CUDA_OPS_H_

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/device/cuda_devices.h"

namespace gradserve {

// Gives the kernel stubs their GPU implementations (Note [Kernel stubs]), then registers the
// GPUs `physical` (indices among CudaDeviceCount(); empty means all of them) as
// RegisterCudaBackend does: "cuda:N" is then physical[N].
// Errors: those of RegisterCudaBackend.
absl::Status RegisterCudaDevices(absl::Span<const int> physical = {});

}  // namespace gradserve

#endif  // GRADSERVE_ENGINE_OPS_CUDA_OPS_H_
