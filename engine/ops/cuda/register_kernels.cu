// RegisterCudaKernels: puts the CUDA implementations into the ops' kernel stubs
// (Note [Kernel stubs]). RegisterCudaDevices calls it once, before the first GPU is usable;
// calling the registrars from here also keeps the linker from dropping their files.

namespace gradserve::cuda {

void RegisterShapeCudaKernels();  // shape_kernels.cu

void RegisterCudaKernels() { RegisterShapeCudaKernels(); }

}  // namespace gradserve::cuda
