// The CUDA backend: NVIDIA GPUs as devices "cuda:0", "cuda:1", ... (cuda_devices.h).
//
// Each registered GPU has its caching allocator (Note [Caching allocator]) and its compute
// stream (Note [CUDA streams]); the Engine gives it a ready queue and a worker thread, which
// InitializeThread binds to the GPU. Copies run on the current stream and return when the
// destination holds the bytes (the DeviceBackend contract); kernels stay asynchronous.

#include <cuda_runtime.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/device/cuda/cuda_caching_allocator.h"
#include "engine/device/cuda/cuda_check.h"
#include "engine/device/cuda/cuda_stream.h"
#include "engine/device/cuda_devices.h"
#include "engine/device/device_registry.h"
#include "engine/util/status_error.h"

namespace gradserve {

namespace cuda {

namespace {

// One registered GPU. Never freed: the backend lives for the process.
struct GpuState {
  int physical = 0;
  cudaStream_t compute_stream = nullptr;
  std::unique_ptr<CachingAllocator> allocator;
  std::string description;
};

// Set once by RegisterCudaBackend, read-only after.
std::atomic<std::vector<GpuState>*> registered_gpus{nullptr};
std::vector<GpuState>& Gpus() { return *registered_gpus.load(std::memory_order_acquire); }

// The calling thread's current streams, by "cuda:N" index; null entries mean the compute stream.
constexpr int kMaxGpus = 64;
thread_local cudaStream_t current_streams[kMaxGpus] = {};

}  // namespace

[[noreturn]] void ThrowCudaError(cudaError_t error, const char* what, const char* file, int line) {
  const std::string message =
      absl::StrCat("CUDA error in ", what, " at ", file, ":", line, ": ", cudaGetErrorName(error),
                   ": ", cudaGetErrorString(error));
  if (error == cudaErrorMemoryAllocation) ThrowStatus(absl::ResourceExhaustedError(message));
  ThrowStatus(absl::InternalError(message));
}

DeviceGuard::DeviceGuard(int physical) {
  GS_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != physical) GS_CUDA_CHECK(cudaSetDevice(physical));
}

DeviceGuard::~DeviceGuard() {
  int now = -1;
  if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
}

int RegisteredDeviceCount() {
  const auto* g = registered_gpus.load(std::memory_order_acquire);
  return g == nullptr ? 0 : static_cast<int>(g->size());
}
int PhysicalIndex(int index) { return Gpus()[index].physical; }
cudaStream_t ComputeStream(int index) { return Gpus()[index].compute_stream; }

cudaStream_t CurrentStream(int index) {
  cudaStream_t s = current_streams[index];
  return s != nullptr ? s : Gpus()[index].compute_stream;
}

StreamGuard::StreamGuard(int index, cudaStream_t stream)
    : index_(index), previous_(current_streams[index]) {
  current_streams[index] = stream;
}

StreamGuard::~StreamGuard() { current_streams[index_] = previous_; }

void WaitStream(int index, cudaStream_t consumer, cudaStream_t producer) {
  if (consumer == producer) return;
  DeviceGuard guard(PhysicalIndex(index));
  cudaEvent_t event;
  GS_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  GS_CUDA_CHECK(cudaEventRecord(event, producer));
  GS_CUDA_CHECK(cudaStreamWaitEvent(consumer, event, 0));
  GS_CUDA_CHECK(cudaEventDestroy(event));  // released once the wait has passed
}

namespace {

cudaStream_t AsStream(uintptr_t id) { return reinterpret_cast<cudaStream_t>(id); }

class CudaBackend final : public DeviceBackend {
 public:
  DeviceType type() const override { return DeviceType::kCUDA; }
  int device_count() const override { return RegisteredDeviceCount(); }
  Allocator* allocator(int index) override { return Gpus()[index].allocator.get(); }
  bool host_accessible() const override { return false; }

  void Copy(void* dst, Device dst_device, const void* src, Device src_device,
            size_t nbytes) override {
    if (nbytes == 0) return;
    const bool dst_gpu = dst_device.type == DeviceType::kCUDA;
    const bool src_gpu = src_device.type == DeviceType::kCUDA;
    const int index = dst_gpu ? dst_device.index : src_device.index;
    DeviceGuard guard(PhysicalIndex(index));
    const cudaStream_t stream = cuda::CurrentStream(index);
    if (dst_gpu && src_gpu && dst_device.index != src_device.index) {
      // Between GPUs: the source's pending work first, then a peer copy on the destination's
      // stream; the copy returns when done, as the contract says.
      GS_CUDA_CHECK(cudaStreamSynchronize(cuda::CurrentStream(src_device.index)));
      GS_CUDA_CHECK(cudaMemcpyPeerAsync(dst, PhysicalIndex(dst_device.index), src,
                                        PhysicalIndex(src_device.index), nbytes, stream));
    } else {
      const cudaMemcpyKind kind = dst_gpu && src_gpu ? cudaMemcpyDeviceToDevice
                                  : dst_gpu          ? cudaMemcpyHostToDevice
                                                     : cudaMemcpyDeviceToHost;
      GS_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, kind, stream));
    }
    GS_CUDA_CHECK(cudaStreamSynchronize(stream));
  }

  void Synchronize(int index) override {
    DeviceGuard guard(PhysicalIndex(index));
    GS_CUDA_CHECK(cudaDeviceSynchronize());
  }

  uintptr_t CurrentStream(int index) const override {
    return reinterpret_cast<uintptr_t>(cuda::CurrentStream(index));
  }
  uintptr_t ExchangeCurrentStream(int index, uintptr_t stream) override {
    const uintptr_t previous = reinterpret_cast<uintptr_t>(current_streams[index]);
    current_streams[index] = AsStream(stream);
    return previous;
  }
  void WaitStream(int index, uintptr_t consumer, uintptr_t producer) override {
    cuda::WaitStream(index, AsStream(consumer), AsStream(producer));
  }
  void SynchronizeStream(int index, uintptr_t stream) override {
    DeviceGuard guard(PhysicalIndex(index));
    GS_CUDA_CHECK(cudaStreamSynchronize(AsStream(stream)));
  }
  void RecordStream(int index, void* ptr, uintptr_t stream) override {
    Gpus()[index].allocator->RecordStream(ptr, AsStream(stream));
  }
  void InitializeThread(int index) override { GS_CUDA_CHECK(cudaSetDevice(PhysicalIndex(index))); }

  std::string Describe(int index) const override { return Gpus()[index].description; }
};

}  // namespace
}  // namespace cuda

bool CudaBuilt() { return true; }

int CudaDeviceCount(std::string* why_none) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    cudaGetLastError();
    if (why_none != nullptr) {
      *why_none = absl::StrCat("no usable CUDA driver or GPU: ", cudaGetErrorString(error));
    }
    return 0;
  }
  if (count == 0 && why_none != nullptr) *why_none = "the CUDA driver shows no GPU";
  return count;
}

absl::Status RegisterCudaBackend(absl::Span<const int> physical) {
  std::string why;
  const int count = CudaDeviceCount(&why);
  if (count == 0) return absl::FailedPreconditionError(why);
  std::vector<int> chosen(physical.begin(), physical.end());
  if (chosen.empty()) {
    for (int i = 0; i < count; ++i) chosen.push_back(i);
  }
  if (static_cast<int>(chosen.size()) > cuda::kMaxGpus) {
    return absl::InvalidArgumentError(absl::StrCat("at most ", cuda::kMaxGpus, " GPUs"));
  }
  for (size_t i = 0; i < chosen.size(); ++i) {
    if (chosen[i] < 0 || chosen[i] >= count) {
      return absl::InvalidArgumentError(
          absl::StrCat("GPU ", chosen[i], " does not exist: ", count, " GPU(s) are visible"));
    }
    for (size_t j = 0; j < i; ++j) {
      if (chosen[j] == chosen[i]) {
        return absl::InvalidArgumentError(absl::StrCat("GPU ", chosen[i], " is listed twice"));
      }
    }
  }
  if (cuda::RegisteredDeviceCount() != 0) {
    return absl::AlreadyExistsError("the CUDA devices are already registered");
  }
  auto states = std::make_unique<std::vector<cuda::GpuState>>();
  try {
    for (size_t i = 0; i < chosen.size(); ++i) {
      cuda::GpuState s;
      s.physical = chosen[i];
      cuda::DeviceGuard guard(s.physical);
      cudaDeviceProp prop;
      GS_CUDA_CHECK(cudaGetDeviceProperties(&prop, s.physical));
      GS_CUDA_CHECK(cudaStreamCreateWithFlags(&s.compute_stream, cudaStreamNonBlocking));
      s.allocator = std::make_unique<cuda::CachingAllocator>(static_cast<int>(i), s.physical);
      s.description = absl::StrFormat(
          "%s (GPU %d, compute capability %d.%d, %.1f GiB, %d SMs)", prop.name, s.physical,
          prop.major, prop.minor, prop.totalGlobalMem / double(1 << 30), prop.multiProcessorCount);
      states->push_back(std::move(s));
    }
  } catch (const StatusError& e) {
    return e.status();
  }
  cuda::registered_gpus.store(states.release(), std::memory_order_release);
  return DeviceRegistry::Get().Register(std::make_unique<cuda::CudaBackend>());
}

}  // namespace gradserve
