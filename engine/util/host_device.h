// GS_HOST_DEVICE marks a function (a functor's operator(), a small helper) as callable from both
// host code and CUDA kernels. Outside nvcc it expands to nothing, so the same definition serves
// the CPU build (Note [Kernels for every device] in engine/kernels/op_kernels.h).
//
// GS_CUDA_KERNELS is 1 in a translation unit that nvcc compiles for a build with the CUDA
// backend: only there may code launch kernels.

#ifndef GRADSERVE_ENGINE_UTIL_HOST_DEVICE_H_
#define GRADSERVE_ENGINE_UTIL_HOST_DEVICE_H_

#if defined(__CUDACC__)
#define GS_HOST_DEVICE __host__ __device__
#else
#define GS_HOST_DEVICE
#endif

#if defined(__CUDACC__) && defined(GRADSERVE_HAS_CUDA)
#define GS_CUDA_KERNELS 1
#else
#define GS_CUDA_KERNELS 0
#endif

#endif  // GRADSERVE_ENGINE_UTIL_HOST_DEVICE_H_
