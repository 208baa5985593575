// The CUDA implementation of gemm_batch_stub (engine/ops/nn_kernels.h): cuBLAS strided batched
// gemm, on the calling thread's current stream of the GPU (CublasHandle sets it).
//
// cuBLAS is column-major and a row-major [R, C] matrix with row stride ld is a column-major
// [C, R] one with leading dimension ld, so row-major C = op(A) @ op(B) is computed as the
// column-major C^T = op(B)^T @ op(A)^T: B first, then A, with n and m swapped. The cuBLAS
// functions come from cuda::CublasApi (Note [cuBLAS loaded on first use]); the handle was made
// through it, so it is loaded by the time they are called.

#include <cublas_v2.h>

#include <cstdint>
#include <type_traits>

#include "engine/device/cuda/cublas_handle.h"
#include "engine/device/cuda/cublas_library.h"
#include "engine/device/cuda/cuda_check.h"
#include "engine/device/cuda/cuda_stream.h"
#include "engine/ops/nn_kernels.h"
#include "engine/util/status_error.h"

namespace gradserve::ops::cuda_kernels {
namespace {

template <typename T>
cublasStatus_t GemmStridedBatched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                                  int m, int n, int k, const T* alpha, const T* a, int lda,
                                  long long sa, const T* b, int ldb, long long sb, const T* beta,
                                  T* c, int ldc, long long sc, int count);

template <>
cublasStatus_t GemmStridedBatched<float>(cublasHandle_t h, cublasOperation_t ta,
                                         cublasOperation_t tb, int m, int n, int k,
                                         const float* alpha, const float* a, int lda, long long sa,
                                         const float* b, int ldb, long long sb, const float* beta,
                                         float* c, int ldc, long long sc, int count) {
  const cuda::CublasFunctions& cublas = cuda::CublasApi();
  if (count == 1) return cublas.sgemm(h, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  return cublas.sgemm_strided_batched(h, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c,
                                      ldc, sc, count);
}

template <>
cublasStatus_t GemmStridedBatched<double>(cublasHandle_t h, cublasOperation_t ta,
                                          cublasOperation_t tb, int m, int n, int k,
                                          const double* alpha, const double* a, int lda,
                                          long long sa, const double* b, int ldb, long long sb,
                                          const double* beta, double* c, int ldc, long long sc,
                                          int count) {
  const cuda::CublasFunctions& cublas = cuda::CublasApi();
  if (count == 1) return cublas.dgemm(h, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  return cublas.dgemm_strided_batched(h, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c,
                                      ldc, sc, count);
}

// cuBLAS takes sizes, leading dimensions and batch counts as int.
void CheckIntSizes(const GemmBatch& g) {
  constexpr int64_t kMax = 2147483647;
  GS_CHECK_ARG(g.m <= kMax && g.n <= kMax && g.k <= kMax && g.lda <= kMax && g.ldb <= kMax &&
                   g.ldc <= kMax && g.count <= kMax,
               "matmul: matrix sizes beyond 2^31 - 1 are not supported");
}

template <typename T>
void GemmBatchTyped(const GemmBatch& g) {
  CheckIntSizes(g);
  cuda::DeviceGuard guard(cuda::PhysicalIndex(g.device_index));
  const cublasHandle_t handle = cuda::CublasHandle(g.device_index);
  const T alpha = T(1), beta = g.beta_one ? T(1) : T(0);
  const cublasOperation_t op_a = g.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = g.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  if constexpr (std::is_same_v<T, float>) {
    // The handle is the thread's, shared by its requests: the mode is set on every call (Note
    // [TF32 per request]).
    GS_CUBLAS_CHECK(cuda::CublasApi().set_math_mode(
        handle, g.allow_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  }
  GS_CUBLAS_CHECK(GemmStridedBatched<T>(
      handle, op_b, op_a, static_cast<int>(g.n), static_cast<int>(g.m), static_cast<int>(g.k),
      &alpha, static_cast<const T*>(g.b), static_cast<int>(g.ldb), g.stride_b,
      static_cast<const T*>(g.a), static_cast<int>(g.lda), g.stride_a, &beta, static_cast<T*>(g.c),
      static_cast<int>(g.ldc), g.stride_c, static_cast<int>(g.count)));
}

// float16 and bfloat16 operands and result, float32 accumulation (CUBLAS_COMPUTE_32F), as
// PyTorch's 16-bit matmul: cuBLAS runs it on tensor cores.
void GemmBatch16Bit(const GemmBatch& g) {
  CheckIntSizes(g);
  cuda::DeviceGuard guard(cuda::PhysicalIndex(g.device_index));
  const cublasHandle_t handle = cuda::CublasHandle(g.device_index);
  const float alpha = 1.0f, beta = g.beta_one ? 1.0f : 0.0f;
  const cublasOperation_t op_a = g.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = g.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cudaDataType type = g.dtype == DType::kFloat16 ? CUDA_R_16F : CUDA_R_16BF;
  const cuda::CublasFunctions& cublas = cuda::CublasApi();
  const int m = static_cast<int>(g.n), n = static_cast<int>(g.m), k = static_cast<int>(g.k);
  if (g.count == 1) {
    GS_CUBLAS_CHECK(cublas.gemm_ex(handle, op_b, op_a, m, n, k, &alpha, g.b, type,
                                   static_cast<int>(g.ldb), g.a, type, static_cast<int>(g.lda),
                                   &beta, g.c, type, static_cast<int>(g.ldc), CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT));
    return;
  }
  GS_CUBLAS_CHECK(cublas.gemm_strided_batched_ex(
      handle, op_b, op_a, m, n, k, &alpha, g.b, type, static_cast<int>(g.ldb), g.stride_b, g.a,
      type, static_cast<int>(g.lda), g.stride_a, &beta, g.c, type, static_cast<int>(g.ldc),
      g.stride_c, static_cast<int>(g.count), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void GemmBatchCuda(const GemmBatch& g) {
  if (g.m == 0 || g.n == 0 || g.count == 0) return;
  GS_CHECK_INTERNAL(g.k > 0, "gemm: k = 0 reached the GPU gemm");
  if (g.dtype == DType::kFloat32) {
    GemmBatchTyped<float>(g);
  } else if (IsHalfFloating(g.dtype)) {
    GemmBatch16Bit(g);
  } else {
    GemmBatchTyped<double>(g);
  }
}

}  // namespace

void RegisterLinalgCudaKernels() { gemm_batch_stub.Register(DeviceType::kCUDA, GemmBatchCuda); }

}  // namespace gradserve::ops::cuda_kernels
