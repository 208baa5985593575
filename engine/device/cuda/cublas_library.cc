#include "engine/device/cuda/cublas_library.h"

#include <dlfcn.h>

#include <string>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/util/status_error.h"

// The symbol a cuBLAS name of cublas_v2.h stands for, after the header's macros: two levels,
// so that GS_CUBLAS_SYMBOL(cublasCreate) is "cublasCreate_v2". libcublas also exports the
// legacy API's unversioned cublasSgemm, with another signature, so the name must be the
// macro's.
#define GS_CUBLAS_STRINGIFY(name) #name
#define GS_CUBLAS_SYMBOL(name) GS_CUBLAS_STRINGIFY(name)

namespace gradserve::cuda {

const char* const kCublasLibraryName = GRADSERVE_CUBLAS_LIBRARY_NAME;
const char* const kCublasBuildDirectory = GRADSERVE_CUBLAS_BUILD_DIRECTORY;

namespace {

// dlopen's handle for the library `name`, trying the loader's search and then `directory`;
// null with *errors saying why each failed.
void* OpenLibrary(const std::string& name, const std::string& directory, std::string* errors) {
  const std::string candidates[] = {name, absl::StrCat(directory, "/", name)};
  for (const std::string& path : candidates) {
    if (void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return library;
    const char* error = dlerror();
    absl::StrAppend(errors, errors->empty() ? "" : "; ", error != nullptr ? error : path);
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<CublasFunctions> LoadCublasFrom(const std::string& name,
                                               const std::string& directory) {
  std::string errors;
  void* library = OpenLibrary(name, directory, &errors);
  if (library == nullptr) {
    return absl::InternalError(absl::StrCat(
        "cannot load cuBLAS (", name,
        "), which matrix products on a GPU need; install it where the loader finds it: ", errors));
  }
  CublasFunctions f{};
  absl::Status status;
  auto resolve = [&](auto* slot, const char* symbol) {
    void* address = dlsym(library, symbol);
    if (address == nullptr && status.ok()) {
      status = absl::InternalError(absl::StrCat("cuBLAS (", name, ") has no function ", symbol));
    }
    *slot = reinterpret_cast<std::remove_pointer_t<decltype(slot)>>(address);
  };
  resolve(&f.create, GS_CUBLAS_SYMBOL(cublasCreate));
  resolve(&f.destroy, GS_CUBLAS_SYMBOL(cublasDestroy));
  resolve(&f.set_stream, GS_CUBLAS_SYMBOL(cublasSetStream));
  resolve(&f.set_math_mode, GS_CUBLAS_SYMBOL(cublasSetMathMode));
  resolve(&f.get_status_name, GS_CUBLAS_SYMBOL(cublasGetStatusName));
  resolve(&f.get_status_string, GS_CUBLAS_SYMBOL(cublasGetStatusString));
  resolve(&f.sgemm, GS_CUBLAS_SYMBOL(cublasSgemm));
  resolve(&f.dgemm, GS_CUBLAS_SYMBOL(cublasDgemm));
  resolve(&f.sgemm_strided_batched, GS_CUBLAS_SYMBOL(cublasSgemmStridedBatched));
  resolve(&f.dgemm_strided_batched, GS_CUBLAS_SYMBOL(cublasDgemmStridedBatched));
  resolve(&f.gemm_ex, "cublasGemmEx");
  resolve(&f.gemm_strided_batched_ex, "cublasGemmStridedBatchedEx");
  if (!status.ok()) {
    dlclose(library);
    return status;
  }
  // The library stays loaded for the life of the process: threads keep cuBLAS handles until
  // they exit.
  return f;
}

const CublasFunctions& CublasApi() {
  static const auto* const loaded = new absl::StatusOr<CublasFunctions>(
      LoadCublasFrom(kCublasLibraryName, kCublasBuildDirectory));
  if (!loaded->ok()) ThrowStatus(loaded->status());
  return **loaded;
}

}  // namespace gradserve::cuda
