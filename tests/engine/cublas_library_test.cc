// Note [cuBLAS loaded on first use] (engine/device/cuda/cublas_library.h): the loader finds
// libcublas and every function the backend calls, with or without a GPU. Skips where the build
// has no CUDA backend (CI). Whether a process loads cuBLAS before it needs it is checked on the
// server binary (ServerFlagsTest.CublasIsNotLoadedByCpuWork).

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "engine/device/cuda_devices.h"
#include "gtest/gtest.h"

#if defined(GRADSERVE_HAS_CUDA)
#include <cublas_v2.h>
#include <dlfcn.h>

#include "engine/device/cuda/cublas_library.h"
#include "engine/util/status_error.h"
#endif

namespace gradserve {
namespace {

TEST(CublasLibraryTest, LoadsAndResolvesEveryFunction) {
  if (!CudaBuilt()) GTEST_SKIP() << "this build has no CUDA backend";
#if defined(GRADSERVE_HAS_CUDA)
  const cuda::CublasFunctions* cublas = nullptr;
  try {
    cublas = &cuda::CublasApi();
  } catch (const StatusError& e) {
    FAIL() << e.status();
  }
  for (const void* f :
       {reinterpret_cast<const void*>(cublas->create),
        reinterpret_cast<const void*>(cublas->destroy),
        reinterpret_cast<const void*>(cublas->set_stream),
        reinterpret_cast<const void*>(cublas->set_math_mode),
        reinterpret_cast<const void*>(cublas->get_status_name),
        reinterpret_cast<const void*>(cublas->get_status_string),
        reinterpret_cast<const void*>(cublas->sgemm), reinterpret_cast<const void*>(cublas->dgemm),
        reinterpret_cast<const void*>(cublas->sgemm_strided_batched),
        reinterpret_cast<const void*>(cublas->dgemm_strided_batched)}) {
    EXPECT_NE(f, nullptr);
  }
  // The process has the library now (NOLOAD finds it without loading it), and the pointers
  // are cublas_v2.h's versioned functions, not the legacy API's of the same base name, which
  // the library exports too with other signatures.
  void* library = dlopen(cuda::kCublasLibraryName, RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(library, nullptr) << dlerror();
  EXPECT_EQ(reinterpret_cast<void*>(cublas->create), dlsym(library, "cublasCreate_v2"));
  EXPECT_EQ(reinterpret_cast<void*>(cublas->sgemm), dlsym(library, "cublasSgemm_v2"));
  EXPECT_EQ(reinterpret_cast<void*>(cublas->dgemm), dlsym(library, "cublasDgemm_v2"));
  EXPECT_NE(reinterpret_cast<void*>(cublas->sgemm), dlsym(library, "cublasSgemm"));
  dlclose(library);
  // Calls that need no GPU go through the pointers as they would through a link.
  EXPECT_EQ(std::string(cublas->get_status_name(CUBLAS_STATUS_ALLOC_FAILED)),
            "CUBLAS_STATUS_ALLOC_FAILED");
  EXPECT_FALSE(std::string(cublas->get_status_string(CUBLAS_STATUS_NOT_SUPPORTED)).empty());
  // Making a handle needs a GPU: with one it works, without one it fails with a status.
  cublasHandle_t handle = nullptr;
  const cublasStatus_t made = cublas->create(&handle);
  if (CudaDeviceCount() > 0) {
    ASSERT_EQ(made, CUBLAS_STATUS_SUCCESS) << cublas->get_status_name(made);
    EXPECT_EQ(cublas->set_math_mode(handle, CUBLAS_DEFAULT_MATH), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublas->destroy(handle), CUBLAS_STATUS_SUCCESS);
  } else {
    EXPECT_NE(made, CUBLAS_STATUS_SUCCESS);
  }
  // The same table on every call.
  EXPECT_EQ(&cuda::CublasApi(), cublas);
#endif
}

TEST(CublasLibraryTest, AMissingLibraryIsAnInternalErrorNamingIt) {
  if (!CudaBuilt()) GTEST_SKIP() << "this build has no CUDA backend";
#if defined(GRADSERVE_HAS_CUDA)
  absl::StatusOr<cuda::CublasFunctions> missing =
      cuda::LoadCublasFrom("libgradserve_no_such_cublas.so.13", "/nonexistent");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInternal);
  // Both places it looked, with the loader's reasons.
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "libgradserve_no_such_cublas.so.13"))
      << missing.status();
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "/nonexistent/")) << missing.status();

  // A library that opens but is not cuBLAS names the first function it lacks.
  absl::StatusOr<cuda::CublasFunctions> other = cuda::LoadCublasFrom("libm.so.6", "/nonexistent");
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(absl::StrContains(other.status().message(), "has no function cublasCreate_v2"))
      << other.status();
#endif
}

}  // namespace
}  // namespace gradserve
