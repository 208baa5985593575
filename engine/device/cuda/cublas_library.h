// The cuBLAS functions the CUDA backend calls, resolved from libcublas when the first one is
// needed.
//
// Note [cuBLAS loaded on first use]
// libcublas brings libcublasLt with it, and loading the two costs a process about 150 MiB of
// resident memory before any call (their own start-up work): a server linked with them sat at
// 176 MiB idle where one built without the CUDA backend sat at 21 MiB, GPU or no GPU. Only a
// matrix product on a GPU needs cuBLAS, so the backend does not link it: CublasApi() loads it
// with dlopen the first time a cuBLAS handle is made (cublas_handle.h), which only a matrix
// product on "cuda:N" tensors does (matmul, and conv2d, which multiplies through matmul). A
// server on a machine without a GPU, or one that never multiplies matrices on its GPU, never
// loads it. The first GPU matrix product pays the load once; nothing else changes: the
// functions and their arguments are cuBLAS's own, called through pointers.
//
// Where it is looked for: the library's versioned name (kCublasLibraryName, libcublas.so.13
// for CUDA 13) through the dynamic loader's search (LD_LIBRARY_PATH, the ld.so cache), then in
// the toolkit's library directory the build used (kCublasBuildDirectory, /usr/local/cuda/lib64
// on these machines), which is where a plain link would have found it too.
//
// Thread safety: CublasApi may be called from any thread; the first call loads the library
// (once, under a static's initialization) and every later one returns the same table.
// Errors: when the library or one of its functions cannot be found, CublasApi throws
// StatusError (INTERNAL, naming the library and the loader's message) on every call; the
// server and its CPU work go on.

#ifndef GRADSERVE_ENGINE_DEVICE_CUDA_CUBLAS_LIBRARY_H_
#define GRADSERVE_ENGINE_DEVICE_CUDA_CUBLAS_LIBRARY_H_

#include <cublas_v2.h>

#include <string>

#include "absl/status/statusor.h"

namespace gradserve::cuda {

// cublas_v2.h maps some names to versioned symbols by macro (cublasCreate is cublasCreate_v2);
// decltype of the name gives the function's type either way.
struct CublasFunctions {
  decltype(&cublasCreate) create;
  decltype(&cublasDestroy) destroy;
  decltype(&cublasSetStream) set_stream;
  decltype(&cublasSetMathMode) set_math_mode;
  decltype(&cublasGetStatusName) get_status_name;
  decltype(&cublasGetStatusString) get_status_string;
  decltype(&cublasSgemm) sgemm;
  decltype(&cublasDgemm) dgemm;
  decltype(&cublasSgemmStridedBatched) sgemm_strided_batched;
  decltype(&cublasDgemmStridedBatched) dgemm_strided_batched;
  // The mixed-precision products (float16 and bfloat16 on tensor cores), spelled out: C++
  // overloads of these names also exist.
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                            const void*, const void*, cudaDataType, int, const void*, cudaDataType,
                            int, const void*, void*, cudaDataType, int, cublasComputeType_t,
                            cublasGemmAlgo_t);
  cublasStatus_t (*gemm_strided_batched_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t,
                                            int, int, int, const void*, const void*, cudaDataType,
                                            int, long long, const void*, cudaDataType, int,
                                            long long, const void*, void*, cudaDataType, int,
                                            long long, int, cublasComputeType_t, cublasGemmAlgo_t);
};

// The versioned file name the loader looks for first, and the toolkit's library directory of
// the build, tried second.
extern const char* const kCublasLibraryName;
extern const char* const kCublasBuildDirectory;

// Note [cuBLAS loaded on first use]: loads libcublas on the first call and returns its
// functions, or throws StatusError (INTERNAL) if it cannot be loaded.
const CublasFunctions& CublasApi();

// What CublasApi does once with kCublasLibraryName and kCublasBuildDirectory: loads the
// library `name` through the loader's search, else from `directory`, and resolves every
// function. INTERNAL, naming the library and why, if it cannot; a library it could open but
// not resolve is closed again.
absl::StatusOr<CublasFunctions> LoadCublasFrom(const std::string& name,
                                               const std::string& directory);

}  // namespace gradserve::cuda

#endif  // GRADSERVE_ENGINE_DEVICE_CUDA_CUBLAS_LIBRARY_H_
