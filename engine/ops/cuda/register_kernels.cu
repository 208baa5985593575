// RegisterCudaKernels: puts the CUDA implementations into the ops' kernel stubs
// (Note [Kernel stubs]). RegisterCudaDevices (engine/ops/cuda_ops.h) calls it before the first
// GPU is usable; calling the registrars from here also keeps the linker from dropping their
// files.

namespace gradserve::ops::cuda_kernels {
void RegisterNnCudaKernels();  // nn_kernels.cu: nn, conv2d and matmul's gemm
}  // namespace gradserve::ops::cuda_kernels

namespace gradserve::cuda {

void RegisterShapeCudaKernels();  // shape_kernels.cu: the index ops

void RegisterCudaKernels() {
  ops::cuda_kernels::RegisterNnCudaKernels();
  RegisterShapeCudaKernels();
}

}  // namespace gradserve::cuda
