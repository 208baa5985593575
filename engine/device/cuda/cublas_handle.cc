#include "engine/device/cuda/cublas_handle.h"

#include <cublas_v2.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/device/cuda/cublas_library.h"
#include "engine/device/cuda/cuda_check.h"
#include "engine/device/cuda/cuda_stream.h"
#include "engine/util/status_error.h"

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
      (void)CublasApi().destroy(handles[i]);  // loaded: the handle was made through it
      (void)cudaSetDevice(previous);
    }
  }
};

}  // namespace

[[noreturn]] void ThrowCublasError(cublasStatus_t status, const char* what, const char* file,
                                   int line) {
  // A status came from a cuBLAS call, so the library is loaded.
  const CublasFunctions& cublas = CublasApi();
  const std::string message =
      absl::StrCat("cuBLAS error in ", what, " at ", file, ":", line, ": ",
                   cublas.get_status_name(status), ": ", cublas.get_status_string(status));
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
    GS_CUBLAS_CHECK(CublasApi().create(&made));  // loads cuBLAS the first time
    handle = made;
    table.physical[index] = physical;
    GS_CUBLAS_CHECK(CublasApi().set_math_mode(handle, CUBLAS_DEFAULT_MATH));
  }
  GS_CUBLAS_CHECK(CublasApi().set_stream(handle, CurrentStream(index)));
  return handle;
}

}  // namespace gradserve::cuda
