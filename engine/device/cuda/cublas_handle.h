// cuBLAS handles for the CUDA backend: one per (thread, GPU), made on first use.
//
// A cuBLAS handle is bound to the GPU current when it is made and must not be used by two
// threads at once, so each thread keeps its own handle per GPU in a function-local thread_local
// table (destroyed when the thread exits). CublasHandle sets the handle's stream to the calling
// thread's current stream of that GPU on every call (Note [CUDA streams]), so gemms queue with
// the kernels around them. Handles use CUBLAS_DEFAULT_MATH (no TF32), so float32 products agree
// with OpenBLAS on the CPU to rounding. Making the first handle loads cuBLAS (Note [cuBLAS
// loaded on first use], cublas_library.h).
//
// The caller makes the GPU current (cuda::DeviceGuard) around the cuBLAS calls it makes.
// Errors: GS_CUBLAS_CHECK turns a failed cuBLAS call into StatusError (RESOURCE_EXHAUSTED when
// cuBLAS could not allocate, INTERNAL otherwise), naming the call.

#ifndef GRADSERVE_ENGINE_DEVICE_CUDA_CUBLAS_HANDLE_H_
#define GRADSERVE_ENGINE_DEVICE_CUDA_CUBLAS_HANDLE_H_

#include <cublas_v2.h>

namespace gradserve::cuda {

// The calling thread's handle for "cuda:index", on the thread's current stream of that GPU.
cublasHandle_t CublasHandle(int index);

[[noreturn]] void ThrowCublasError(cublasStatus_t status, const char* what, const char* file,
                                   int line);

// Runs a cuBLAS call and throws StatusError unless it returned CUBLAS_STATUS_SUCCESS.
#define GS_CUBLAS_CHECK(expr)                                                            \
  do {                                                                                   \
    const cublasStatus_t gs_cublas_status_ = (expr);                                     \
    if (gs_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                                    \
      ::gradserve::cuda::ThrowCublasError(gs_cublas_status_, #expr, __FILE__, __LINE__); \
    }                                                                                    \
  } while (false)

}  // namespace gradserve::cuda

#endif  // GRADSERVE_ENGINE_DEVICE_CUDA_CUBLAS_HANDLE_H_
