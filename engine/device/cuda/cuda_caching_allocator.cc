#include "engine/device/cuda/cuda_caching_allocator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/device/cuda/cuda_check.h"
#include "engine/device/cuda/cuda_stream.h"
#include "engine/util/status_error.h"

namespace gradserve::cuda {

namespace {
constexpr size_t kSmallRound = 512;
constexpr size_t kLargeRound = size_t{2} << 20;
constexpr size_t kLargeFrom = size_t{1} << 20;
}  // namespace

CachingAllocator::CachingAllocator(int index, int physical) : index_(index), physical_(physical) {}

CachingAllocator::~CachingAllocator() = default;

size_t CachingAllocator::RoundSize(size_t nbytes) {
  if (nbytes == 0) nbytes = 1;
  const size_t round = nbytes < kLargeFrom ? kSmallRound : kLargeRound;
  return (nbytes + round - 1) / round * round;
}

void* CachingAllocator::FindCached(cudaStream_t stream, size_t size) {
  auto it = free_.lower_bound({stream, size});
  if (it == free_.end() || it->first.first != stream || it->first.second > 2 * size) {
    return nullptr;
  }
  void* ptr = it->second;
  free_.erase(it);
  return ptr;
}

void CachingAllocator::CollectPending() {
  for (size_t i = 0; i < pending_.size();) {
    Pending& p = pending_[i];
    bool done = true;
    for (cudaEvent_t e : p.events) {
      const cudaError_t query = cudaEventQuery(e);
      if (query == cudaErrorNotReady) {
        done = false;
        break;
      }
      GS_CUDA_CHECK(query);
    }
    if (!done) {
      ++i;
      continue;
    }
    for (cudaEvent_t e : p.events) cudaEventDestroy(e);
    Block& b = blocks_.at(p.ptr);
    b.other_uses.clear();
    free_.emplace(std::make_pair(b.stream, b.size), p.ptr);
    pending_[i] = std::move(pending_.back());
    pending_.pop_back();
  }
}

void* CachingAllocator::Allocate(size_t nbytes) {
  const size_t size = RoundSize(nbytes);
  const cudaStream_t stream = CurrentStream(index_);
  MutexLock lock(&mu_);
  if (!pending_.empty()) CollectPending();
  if (void* ptr = FindCached(stream, size)) {
    const size_t block_size = blocks_.at(ptr).size;
    stats_.cached_bytes -= block_size;
    stats_.allocated_bytes += block_size;
    stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
    return ptr;
  }
  DeviceGuard guard(physical_);
  void* ptr = nullptr;
  cudaError_t error = cudaMalloc(&ptr, size);
  if (error == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clear the sticky-free error state of the runtime
    ReleaseCachedLocked();
    error = cudaMalloc(&ptr, size);
  }
  if (error != cudaSuccess) {
    cudaGetLastError();
    ThrowStatus(absl::ResourceExhaustedError(absl::StrCat(
        "cuda:", index_, " is out of memory: could not allocate ", size, " bytes (",
        stats_.allocated_bytes, " bytes held by tensors): ", cudaGetErrorString(error))));
  }
  ++stats_.cuda_mallocs;
  stats_.allocated_bytes += size;
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  blocks_[ptr] = Block{size, stream, {}};
  return ptr;
}

void CachingAllocator::Deallocate(void* ptr, size_t /*nbytes*/) {
  if (ptr == nullptr) return;
  MutexLock lock(&mu_);
  auto it = blocks_.find(ptr);
  if (it == blocks_.end()) return;  // not ours: a bug elsewhere, but never free twice
  Block& b = it->second;
  stats_.allocated_bytes -= b.size;
  stats_.cached_bytes += b.size;
  if (b.other_uses.empty()) {
    free_.emplace(std::make_pair(b.stream, b.size), ptr);
    return;
  }
  DeviceGuard guard(physical_);
  Pending p{ptr, {}};
  for (cudaStream_t s : b.other_uses) {
    cudaEvent_t e;
    GS_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    GS_CUDA_CHECK(cudaEventRecord(e, s));
    p.events.push_back(e);
  }
  pending_.push_back(std::move(p));
}

void CachingAllocator::RecordStream(void* ptr, cudaStream_t stream) {
  MutexLock lock(&mu_);
  auto it = blocks_.find(ptr);
  if (it == blocks_.end() || it->second.stream == stream) return;
  for (cudaStream_t s : it->second.other_uses) {
    if (s == stream) return;
  }
  it->second.other_uses.push_back(stream);
}

void CachingAllocator::ReleaseCached() {
  MutexLock lock(&mu_);
  ReleaseCachedLocked();
}

void CachingAllocator::ReleaseCachedLocked() {
  DeviceGuard guard(physical_);
  // cudaFree waits for the device, so blocks freed on any stream are idle by then.
  for (auto& [key, ptr] : free_) {
    cudaFree(ptr);
    stats_.cached_bytes -= blocks_.at(ptr).size;
    blocks_.erase(ptr);
  }
  free_.clear();
}

CachingAllocator::Stats CachingAllocator::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

std::optional<MemoryStats> CachingAllocator::memory_stats() const {
  const Stats s = stats();
  MemoryStats out;
  out.allocated_bytes = static_cast<int64_t>(s.allocated_bytes);
  out.reserved_bytes = static_cast<int64_t>(s.allocated_bytes + s.cached_bytes);
  out.peak_allocated_bytes = static_cast<int64_t>(s.peak_allocated_bytes);
  return out;
}

}  // namespace gradserve::cuda
