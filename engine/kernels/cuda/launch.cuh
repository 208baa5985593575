// What every CUDA kernel of the op set shares: launch sizes, the device and stream a launch
// on a tensor's GPU uses (LaunchOn), and StridedIndexer, the GPU side of ForEachRow's walk
// (engine/kernels/op_kernels.h).
//
// Only nvcc-compiled files with the CUDA backend include this (GS_CUDA_KERNELS).

#ifndef GRADSERVE_ENGINE_OPS_CUDA_LAUNCH_CUH_
#define GRADSERVE_ENGINE_OPS_CUDA_LAUNCH_CUH_

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>

#include "absl/types/span.h"
#include "engine/device/cuda/cuda_check.h"
#include "engine/device/cuda/cuda_stream.h"
#include "engine/tensor/tensor.h"
#include "engine/util/host_device.h"
#include "engine/util/status_error.h"

namespace gradserve::ops::cuda_kernels {

inline constexpr int kThreads = 256;
// Dimensions a kernel indexes after merging; more is refused with UNIMPLEMENTED.
inline constexpr int kMaxDims = 16;

// Blocks of kThreads for n elements with a grid-stride loop.
inline unsigned BlocksFor(int64_t n, int threads = kThreads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, int64_t{1} << 30));
}

// The stream work on t's GPU goes to now (Note [CUDA streams]).
inline cudaStream_t StreamOf(const Tensor& t) { return cuda::CurrentStream(t.device().index); }

// A launch on t's GPU, for a scope: that GPU is the thread's current device (kernels and the
// runtime calls between them go to it), and stream() is its current stream. Each kernel
// launcher starts with one.
class LaunchOn {
 public:
  explicit LaunchOn(const Tensor& t)
      : guard_(cuda::PhysicalIndex(t.device().index)), stream_(StreamOf(t)) {}
  LaunchOn(const LaunchOn&) = delete;
  LaunchOn& operator=(const LaunchOn&) = delete;

  cudaStream_t stream() const { return stream_; }

 private:
  cuda::DeviceGuard guard_;
  const cudaStream_t stream_;
};

// Element offsets of N operands for a linear index over a shape, row-major. Built on the host
// with the same merging as ForEachRow: size-1 dimensions are dropped and neighbours contiguous
// for every operand merged, so most tensors index as one or two dimensions.
template <int N>
struct StridedIndexer {
  int rank = 0;
  int64_t sizes[kMaxDims];
  int64_t strides[N][kMaxDims];

  GS_HOST_DEVICE void Offsets(int64_t linear, int64_t (&off)[N]) const {
    for (int k = 0; k < N; ++k) off[k] = 0;
    for (int d = rank - 1; d >= 0; --d) {
      const int64_t i = linear % sizes[d];
      linear /= sizes[d];
      for (int k = 0; k < N; ++k) off[k] += i * strides[k][d];
    }
  }
};

template <int N>
StridedIndexer<N> MakeIndexer(absl::Span<const int64_t> shape,
                              const std::array<absl::Span<const int64_t>, N>& strides) {
  StridedIndexer<N> ix;
  int rank = 0;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = rank > 0;
    for (int k = 0; k < N && merge; ++k) {
      merge = ix.strides[k][rank - 1] == strides[k][d] * shape[d];
    }
    if (merge) {
      ix.sizes[rank - 1] *= shape[d];
      for (int k = 0; k < N; ++k) ix.strides[k][rank - 1] = strides[k][d];
      continue;
    }
    if (rank == kMaxDims) {
      ThrowStatus(
          absl::UnimplementedError(absl::StrCat("CUDA kernels index at most ", kMaxDims,
                                                " dimensions after merging; got a tensor of "
                                                "shape ",
                                                ShapeToString(shape))));
    }
    ix.sizes[rank] = shape[d];
    for (int k = 0; k < N; ++k) ix.strides[k][rank] = strides[k][d];
    ++rank;
  }
  ix.rank = rank;
  return ix;
}

}  // namespace gradserve::ops::cuda_kernels

#endif  // GRADSERVE_ENGINE_OPS_CUDA_LAUNCH_CUH_
