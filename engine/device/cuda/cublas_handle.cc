#include "engine/device/cuda/cublas_handle.h"

#include <cublas_v2.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/device/cuda/cuda_check.h"
#include "engine/device/cuda/cuda_stream.h"
#include "engine/tensor/status_error.h"

namespace gradserve::cuda {
namespace {

// One thread's handles, indexed by "cuda:N" (null until first used).
struct ThreadHandles {
  std::vector<cublasHandle_t> handles;
  std::vector<int> physical;

  ~ThreadHandles() {
    for (size_t i = 0; i < handles.size(); ++i) {
      if (handles[i] == nullptr) continue;
      // Errors at thread exit have no one to go to; the handle is gone either way.
      int previous = -1;
      if (cudaGetDevice(&previous) != cudaSuccess) continue;
      if (cudaSetDevice(physical[i]) != cudaSuccess) continue;
      (void)cublasDestroy(handles[i]);
      (void)cudaSetDevice(previous);
    }
  }
};

}  // namespace

[[noreturn]] void ThrowCublasError(cublasStatus_t status, const char* what, const char* file,
                                   int line) {
  const std::string message =
      absl::StrCat("cuBLAS error in ", what, " at ", file, ":", line, ": ",
                   cublasGetStatusName(status), ": ", cublasGetStatusString(status));
  if (status == CUBLAS_STATUS_ALLOC_FAILED) ThrowStatus(absl::ResourceExhaustedError(message));
  ThrowStatus(absl::InternalError(message));
}

cublasHandle_t CublasHandle(int index) {
  thread_local ThreadHandles table;
  if (static_cast<int>(table.handles.size()) <= index) {
    table.handles.resize(index + 1, nullptr);
    table.physical.resize(index + 1, -1);
  }
  cublasHandle_t& handle = table.handles[index];
  if (handle == nullptr) {
    const int physical = PhysicalIndex(index);
    DeviceGuard guard(physical);
    cublasHandle_t made = nullptr;
    GS_CUBLAS_CHECK(cublasCreate(&made));
    handle = made;
    table.physical[index] = physical;
    GS_CUBLAS_CHECK(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));
  }
  GS_CUBLAS_CHECK(cublasSetStream(handle, CurrentStream(index)));
  return handle;
}

}  // namespace gradserve::cuda
