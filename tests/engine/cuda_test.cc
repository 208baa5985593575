// The CUDA backend on a real GPU: registration, copies, the caching allocator, kernels against
// the CPU's, backward passes on the device worker thread, and the stream rules of
// Note [Streams in the backward pass]. Every test skips, saying why, where no GPU is present or
// the build has no CUDA backend (CI). tests/engine/device_parity_test.cc compares whole random
// graphs on the GPU with the CPU.

#include <cmath>
#include <string>
#include <vector>

#include "engine/autograd/autograd.h"
#include "engine/autograd/engine.h"
#include "engine/device/cuda_devices.h"
#include "engine/device/device_registry.h"
#include "engine/device/stream.h"
#include "engine/kernels/basic_kernels.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/linalg.h"
#include "engine/ops/reductions.h"
#include "engine/tensor/tensor.h"
#include "gtest/gtest.h"
#include "tests/engine/cuda_test_util.h"
#include "tests/engine/op_test_util.h"

#if defined(GRADSERVE_HAS_CUDA)
#include <cuda_runtime.h>

#include "engine/device/cuda/cuda_caching_allocator.h"
#endif

namespace gradserve {
namespace {

using testing::op_test::Values;

using testing::GpuUnavailable;
using testing::kGpu;

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = GpuUnavailable();
    if (!why.empty()) GTEST_SKIP() << "no GPU: " << why;
  }
};

// Deterministic values in [-1, 1).
Tensor Random(std::vector<int64_t> shape, DType dtype, uint64_t seed) {
  Tensor t = Tensor::Empty(shape, DType::kFloat64);
  uint64_t state = seed * 0x9E3779B97F4A7C15ULL + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    t.data<double>()[i] = 2 * (static_cast<double>(state >> 11) * 0x1.0p-53) - 1;
  }
  return t.To(dtype);
}

void ExpectClose(const Tensor& gpu, const Tensor& cpu, double tol) {
  ASSERT_EQ(gpu.device(), kGpu);
  ASSERT_EQ(gpu.shape(), cpu.shape());
  const std::vector<double> a = Values(gpu.To(kCPU)), b = Values(cpu);
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_NEAR(a[i], b[i], tol * std::max(1.0, std::abs(b[i]))) << "element " << i;
  }
}

TEST_F(CudaTest, RegistryListsTheGpuWithItsDescription) {
  DeviceBackend* backend = DeviceRegistry::Get().backend(DeviceType::kCUDA);
  ASSERT_NE(backend, nullptr);
  EXPECT_GE(backend->device_count(), 1);
  EXPECT_FALSE(backend->host_accessible());
  EXPECT_NE(backend->Describe(0).find("compute capability"), std::string::npos)
      << backend->Describe(0);
  EXPECT_TRUE(DeviceRegistry::Get().Validate(kGpu).ok());
  EXPECT_FALSE(DeviceRegistry::Get().Validate({DeviceType::kCUDA, 63}).ok());
}

TEST_F(CudaTest, CopiesRoundTripEveryDtypeAndLayout) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kInt64, DType::kBool}) {
    Tensor cpu = Random({3, 5, 7}, DType::kFloat64, 1).To(dtype);
    Tensor gpu = cpu.To(kGpu);
    EXPECT_EQ(gpu.device(), kGpu);
    EXPECT_EQ(Values(gpu.To(kCPU)), Values(cpu)) << DTypeName(dtype);
    // A transposed view on the GPU comes back in its logical order.
    Tensor t = gpu.AsStrided({7, 5}, {1, 7}, 0);
    Tensor host_t = cpu.AsStrided({7, 5}, {1, 7}, 0);
    EXPECT_EQ(Values(t.contiguous().To(kCPU)), Values(host_t)) << DTypeName(dtype);
  }
  Tensor empty = Tensor::Empty({0, 4}, DType::kFloat32, kGpu);
  EXPECT_EQ(empty.To(kCPU).numel(), 0);
  EXPECT_EQ(Tensor::Full({2, 2}, 3.5, DType::kFloat32, kGpu).To(kCPU).data<float>()[3], 3.5f);
  EXPECT_EQ(Tensor::Scalar(-2, DType::kFloat64, kGpu).item(), -2);
}

#if defined(GRADSERVE_HAS_CUDA)
cuda::CachingAllocator* GpuAllocator() {
  return static_cast<cuda::CachingAllocator*>(DeviceRegistry::Get().allocator(kGpu));
}

TEST_F(CudaTest, FreedBlocksAreReusedWithoutCudaMalloc) {
  { Tensor warm = Tensor::Empty({1 << 20}, DType::kFloat32, kGpu); }
  const auto before = GpuAllocator()->stats();
  for (int i = 0; i < 100; ++i) {
    Tensor t = Tensor::Empty({1 << 20}, DType::kFloat32, kGpu);
  }
  const auto after = GpuAllocator()->stats();
  EXPECT_EQ(after.cuda_mallocs, before.cuda_mallocs);
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
}

// What the server's gradserve_device_memory_* metrics read (Allocator::memory_stats).
TEST_F(CudaTest, MemoryStatsCountAllocatedReservedAndPeak) {
  const MemoryStats before = *DeviceRegistry::Get().allocator(kGpu)->memory_stats();
  {
    Tensor t = Tensor::Empty({4 << 20}, DType::kFloat32, kGpu);  // 16 MiB
    const MemoryStats held = *DeviceRegistry::Get().allocator(kGpu)->memory_stats();
    // At least 16 MiB: a bigger block an earlier test left in the cache may serve it, and
    // counts whole.
    EXPECT_GE(held.allocated_bytes - before.allocated_bytes, int64_t{16} << 20);
    EXPECT_LE(held.allocated_bytes - before.allocated_bytes, int64_t{32} << 20);  // FindCached
    EXPECT_GE(held.reserved_bytes, held.allocated_bytes);
    EXPECT_GE(held.peak_allocated_bytes, held.allocated_bytes);
  }
  const MemoryStats after = *DeviceRegistry::Get().allocator(kGpu)->memory_stats();
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  // The block is cached, not freed: still reserved; the peak remembers it.
  EXPECT_GE(after.reserved_bytes - after.allocated_bytes, int64_t{16} << 20);
  EXPECT_GE(after.peak_allocated_bytes, before.allocated_bytes + (int64_t{16} << 20));
}

TEST_F(CudaTest, OutOfMemoryIsResourceExhaustedAndHarmsNothing) {
  try {
    Tensor huge = Tensor::Empty({int64_t{1} << 45}, DType::kFloat32, kGpu);  // 128 TiB
    FAIL() << "allocated 128 TiB";
  } catch (const StatusError& e) {
    EXPECT_EQ(e.status().code(), absl::StatusCode::kResourceExhausted) << e.status();
    EXPECT_NE(e.status().message().find("cuda:0 is out of memory"), std::string::npos);
  }
  // The GPU still works.
  EXPECT_EQ(Tensor::Full({4}, 1, DType::kFloat32, kGpu).To(kCPU).data<float>()[0], 1.0f);
}
#endif

TEST_F(CudaTest, ElementwiseAndReductionKernelsMatchTheCpu) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    const double tol = dtype == DType::kFloat32 ? 1e-5 : 1e-12;
    Tensor a = Random({64, 33}, dtype, 2), b = Random({33}, dtype, 3);
    Tensor ga = a.To(kGpu), gb = b.To(kGpu);
    ExpectClose(ops::add(ga, gb, 2), ops::add(a, b, 2), tol);  // broadcast
    ExpectClose(ops::mul(ga, gb), ops::mul(a, b), tol);
    ExpectClose(ops::tanh(ga), ops::tanh(a), tol);
    ExpectClose(ops::div(ga, ops::add(gb, 3.0)), ops::div(a, ops::add(b, 3.0)), tol);
    ExpectClose(ops::sum(ga), ops::sum(a), tol);
    ExpectClose(ops::sum(ga, {0}), ops::sum(a, {0}), tol);  // kept dimension innermost
    ExpectClose(ops::sum(ga, {1}), ops::sum(a, {1}), tol);  // reduced dimension innermost
    ExpectClose(ops::mean(ga, {1}, true), ops::mean(a, {1}, true), tol);
    ExpectClose(ops::amax(ga, {0}), ops::amax(a, {0}), tol);
    ExpectClose(ops::matmul(ga, ga.AsStrided({33, 64}, {1, 33}, 0)),
                ops::matmul(a, a.AsStrided({33, 64}, {1, 33}, 0)), tol * 10);
  }
}

TEST_F(CudaTest, BackwardRunsOnTheGpuWorkerAndMatchesTheCpu) {
  auto run = [](Device device) {
    Tensor x = Random({128, 64}, DType::kFloat64, 4).To(device);
    Tensor w = Random({64, 32}, DType::kFloat64, 5).To(device);
    x.set_requires_grad(true);
    w.set_requires_grad(true);
    Tensor h = ops::tanh(ops::matmul(x, w));
    Tensor loss = ops::sum(ops::mul(h, h));
    absl::StatusOr<TensorList> grads = autograd::Grad({loss}, {Tensor()}, {x, w}, {});
    EXPECT_TRUE(grads.ok()) << grads.status();
    return *grads;
  };
  const int threads_before = autograd::Engine::Get().device_threads_started();
  TensorList gpu = run(kGpu), cpu = run(kCPU);
  EXPECT_GE(autograd::Engine::Get().device_threads_started(), std::max(threads_before, 1));
  ExpectClose(gpu[0], cpu[0], 1e-10);
  ExpectClose(gpu[1], cpu[1], 1e-10);
}

TEST_F(CudaTest, ALongChainOnTheGpu) {
  Tensor x = Tensor::Full({1}, 0.5, DType::kFloat32, kGpu);
  x.set_requires_grad(true);
  Tensor y = x;
  for (int i = 0; i < 2000; ++i) y = ops::tanh(ops::mul(y, 1.0001));
  Tensor xc = Tensor::Full({1}, 0.5, DType::kFloat32);
  xc.set_requires_grad(true);
  Tensor yc = xc;
  for (int i = 0; i < 2000; ++i) yc = ops::tanh(ops::mul(yc, 1.0001));
  auto g = autograd::Grad({ops::sum(y)}, {Tensor()}, {x}, {});
  auto gc = autograd::Grad({ops::sum(yc)}, {Tensor()}, {xc}, {});
  ASSERT_TRUE(g.ok()) << g.status();
  ExpectClose((*g)[0], (*gc)[0], 1e-5);
}

#if defined(GRADSERVE_HAS_CUDA)
// A forward op recorded under another stream: its backward runs on that stream, and the
// gradient from the compute stream reaches it through an event. Large tensors and a slow
// producer make a missing wait show up as wrong values.
TEST_F(CudaTest, AGradientCrossingStreamsIsOrderedByAnEvent) {
  cudaStream_t side;
  ASSERT_EQ(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), cudaSuccess);
  // A stream must outlive the tensors whose memory was used on it (Note [Caching allocator]).
  {
    Tensor x = Random({1 << 22}, DType::kFloat32, 6).To(kGpu);
    x.set_requires_grad(true);
    Tensor y;
    {
      StreamScope on_side({kGpu, reinterpret_cast<uintptr_t>(side)});
      y = ops::mul(x, 3.0);  // MulBackward0 records the side stream
    }
    Tensor z = y;
    for (int i = 0; i < 20; ++i) z = ops::mul(ops::sin(z), 1.0);  // on the compute stream
    auto grads = autograd::Grad({ops::sum(z)}, {Tensor()}, {x}, {});
    ASSERT_TRUE(grads.ok()) << grads.status();
    Tensor xc = x.detach().To(kCPU);
    xc.set_requires_grad(true);
    Tensor zc = ops::mul(xc, 3.0);
    for (int i = 0; i < 20; ++i) zc = ops::mul(ops::sin(zc), 1.0);
    auto expected = autograd::Grad({ops::sum(zc)}, {Tensor()}, {xc}, {});
    ExpectClose((*grads)[0], (*expected)[0], 1e-4);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaStreamDestroy(side);
}
#endif

TEST_F(CudaTest, MixingDevicesInOneOpIsAnError) {
  Tensor a = Tensor::Full({2}, 1, DType::kFloat32, kGpu);
  Tensor b = Tensor::Full({2}, 1, DType::kFloat32);
  testing::op_test::ExpectInvalid([&] { ops::add(a, b); }, {"cuda:0", "cpu"});
}

TEST_F(CudaTest, NothingLeaksAcrossPasses) {
#if defined(GRADSERVE_HAS_CUDA)
  auto pass = [] {
    Tensor w = Random({256, 256}, DType::kFloat32, 7).To(kGpu);
    w.set_requires_grad(true);
    Tensor loss = ops::sum(ops::relu(ops::matmul(w, w)));
    ASSERT_TRUE(autograd::Grad({loss}, {Tensor()}, {w}, {}).ok());
  };
  pass();
  const size_t before = GpuAllocator()->stats().allocated_bytes;
  for (int i = 0; i < 20; ++i) pass();
  EXPECT_EQ(GpuAllocator()->stats().allocated_bytes, before);
#else
  GTEST_SKIP() << "this build has no CUDA backend";
#endif
}

}  // namespace
}  // namespace gradserve
