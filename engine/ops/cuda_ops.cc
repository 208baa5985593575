#include "engine/ops/cuda_ops.h"

namespace gradserve {

#if GRADSERVE_HAS_CUDA
namespace cuda {
void RegisterCudaKernels();  // engine/ops/cuda/register_kernels.cu
}  // namespace cuda
#endif

absl::Status RegisterCudaDevices(absl::Span<const int> physical) {
#if GRADSERVE_HAS_CUDA
  // Before the GPUs are usable, as before any op could run on them. Registering twice is
  // harmless: each stub's slot is overwritten with the same kernel.
  cuda::RegisterCudaKernels();
#endif
  return RegisterCudaBackend(physical);
}

}  // namespace gradserve
