// ReduceKernel on a GPU: the same contract as the CPU's (engine/kernels/op_kernels.h), as one CUDA
// kernel.
//
// Note [Reductions on the GPU]
// The input's dimensions are split into kept ones (the output's, row-major) and reduced ones,
// each walked by a StridedIndexer. Two shapes of kernel, chosen by where the input's contiguous
// dimension lies, keep the reads coalesced:
//  - the innermost input dimension is reduced (a row sum, softmax's max): a block per output,
//    its threads striding over the reduced elements, then a tree in shared memory;
//  - a kept dimension is innermost (a bias gradient's sum over the batch): 32 neighbouring
//    outputs per block along x, so a warp reads 32 neighbouring elements, with the reduced
//    elements split over 8 threads along y and combined in shared memory.
// When there are few outputs and many elements each (a whole-tensor sum), a block per output
// would leave most of the GPU idle, so the reduced elements are first split over many blocks,
// each writing a partial accumulator, and a second launch combines the partials.
// combine must be associative; the order of combination differs from the CPU's, so float
// results agree within rounding, not bit for bit.

#ifndef GRADSERVE_ENGINE_OPS_CUDA_REDUCE_KERNEL_CUH_
#define GRADSERVE_ENGINE_OPS_CUDA_REDUCE_KERNEL_CUH_

#include <array>

#include "engine/device/device_registry.h"
#include "engine/kernels/cuda/launch.cuh"

namespace gradserve::ops::cuda_kernels {

// Tree-combines the blockDim.x * blockDim.y values in acc (row ty, column tx) along y when
// along_y, else along x; the result is at column tx of row 0 (along y) or at index 0 of the row.
template <typename AccT, typename Combine>
__device__ void CombineInBlock(AccT* acc, const Combine& combine, bool along_y) {
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int width = blockDim.x;
  if (along_y) {
    for (int s = blockDim.y / 2; s > 0; s /= 2) {
      __syncthreads();
      if (ty < s) acc[ty * width + tx] = combine(acc[ty * width + tx], acc[(ty + s) * width + tx]);
    }
  } else {
    for (int s = blockDim.x / 2; s > 0; s /= 2) {
      __syncthreads();
      if (tx < s) acc[tx] = combine(acc[tx], acc[tx + s]);
    }
  }
  __syncthreads();
}

// A block per output (blockDim = (threads, 1)).
template <typename T, typename AccT, typename OutT, typename Combine, typename Finalize>
__global__ void ReducePerBlock(int64_t n_out, int64_t n_red, StridedIndexer<1> kept,
                               StridedIndexer<1> red, const T* in, OutT* out, AccT init,
                               Combine combine, Finalize finalize) {
  extern __shared__ unsigned char shared[];
  AccT* acc = reinterpret_cast<AccT*>(shared);
  for (int64_t o = blockIdx.x; o < n_out; o += gridDim.x) {
    int64_t base[1];
    kept.Offsets(o, base);
    AccT a = init;
    for (int64_t r = threadIdx.x; r < n_red; r += blockDim.x) {
      int64_t off[1];
      red.Offsets(r, off);
      a = combine(a, static_cast<AccT>(in[base[0] + off[0]]));
    }
    acc[threadIdx.x] = a;
    CombineInBlock(acc, combine, /*along_y=*/false);
    if (threadIdx.x == 0) out[o] = static_cast<OutT>(finalize(acc[0]));
    __syncthreads();
  }
}

// 32 outputs per block along x, the reduction split along y (blockDim = (32, 8)).
template <typename T, typename AccT, typename OutT, typename Combine, typename Finalize>
__global__ void ReduceAcrossOutputs(int64_t n_out, int64_t n_red, StridedIndexer<1> kept,
                                    StridedIndexer<1> red, const T* in, OutT* out, AccT init,
                                    Combine combine, Finalize finalize) {
  extern __shared__ unsigned char shared[];
  AccT* acc = reinterpret_cast<AccT*>(shared);
  for (int64_t first = int64_t{blockIdx.x} * blockDim.x; first < n_out;
       first += int64_t{gridDim.x} * blockDim.x) {
    const int64_t o = first + threadIdx.x;
    AccT a = init;
    if (o < n_out) {
      int64_t base[1];
      kept.Offsets(o, base);
      for (int64_t r = threadIdx.y; r < n_red; r += blockDim.y) {
        int64_t off[1];
        red.Offsets(r, off);
        a = combine(a, static_cast<AccT>(in[base[0] + off[0]]));
      }
    }
    acc[threadIdx.y * blockDim.x + threadIdx.x] = a;
    CombineInBlock(acc, combine, /*along_y=*/true);
    if (threadIdx.y == 0 && o < n_out) out[o] = static_cast<OutT>(finalize(acc[threadIdx.x]));
    __syncthreads();
  }
}

// Splits each output's reduced elements over gridDim.y blocks: block (o, part) combines elements
// part, part + parts, ... of output o (strided by threads within) into partial[o * parts + part].
template <typename T, typename AccT, typename Combine>
__global__ void ReducePartials(int64_t n_red, StridedIndexer<1> kept, StridedIndexer<1> red,
                               const T* in, AccT* partial, AccT init, Combine combine) {
  extern __shared__ unsigned char shared[];
  AccT* acc = reinterpret_cast<AccT*>(shared);
  const int64_t o = blockIdx.x;
  const int64_t parts = gridDim.y;
  int64_t base[1];
  kept.Offsets(o, base);
  AccT a = init;
  for (int64_t r = blockIdx.y * int64_t{blockDim.x} + threadIdx.x; r < n_red;
       r += parts * blockDim.x) {
    int64_t off[1];
    red.Offsets(r, off);
    a = combine(a, static_cast<AccT>(in[base[0] + off[0]]));
  }
  acc[threadIdx.x] = a;
  CombineInBlock(acc, combine, /*along_y=*/false);
  if (threadIdx.x == 0) partial[o * parts + blockIdx.y] = acc[0];
}

template <typename T, typename AccT, typename OutT, typename Combine, typename Finalize>
void LaunchReduce(const Tensor& input, absl::Span<const bool> reduced, const Tensor& out, AccT init,
                  const Combine& combine, const Finalize& finalize) {
  const int64_t n_out = out.numel();
  if (n_out == 0) return;
  Shape kept_sizes, red_sizes;
  Strides kept_strides, red_strides;
  int64_t n_red = 1;
  bool inner_reduced = false;
  for (size_t d = 0; d < input.shape().size(); ++d) {
    const int64_t size = input.shape()[d];
    if (reduced[d]) {
      red_sizes.push_back(size);
      red_strides.push_back(input.strides()[d]);
      n_red *= size;
      if (input.strides()[d] == 1 && size > 1) inner_reduced = true;
    } else {
      kept_sizes.push_back(size);
      kept_strides.push_back(input.strides()[d]);
    }
  }
  const StridedIndexer<1> kept =
      MakeIndexer<1>(kept_sizes, {absl::Span<const int64_t>(kept_strides)});
  const StridedIndexer<1> red = MakeIndexer<1>(red_sizes, {absl::Span<const int64_t>(red_strides)});
  const LaunchOn on(out);
  const T* const in = input.data<T>();
  OutT* const o = out.data<OutT>();
  constexpr int64_t kSplitFrom = int64_t{1} << 16;  // elements per output worth splitting
  if (n_out <= 1024 && n_red >= kSplitFrom) {
    const int64_t parts = std::min<int64_t>(n_red / (kThreads * 16), 1024 / n_out + 1);
    Allocator* device_memory = DeviceRegistry::Get().allocator(out.device());
    const size_t bytes = static_cast<size_t>(n_out * parts) * sizeof(AccT);
    AccT* partial = static_cast<AccT*>(device_memory->Allocate(bytes));
    ReducePartials<T, AccT><<<dim3(n_out, parts), kThreads, kThreads * sizeof(AccT), on.stream()>>>(
        n_red, kept, red, in, partial, init, combine);
    GS_CUDA_CHECK_LAUNCH("ReduceKernel");
    // The partials of output o are contiguous: reduce [n_out, parts] along its last dimension.
    const std::array<int64_t, 1> row_size{n_out}, row_stride{parts}, col_size{parts}, col_stride{1};
    const StridedIndexer<1> rows =
        MakeIndexer<1>(row_size, {absl::Span<const int64_t>(row_stride)});
    const StridedIndexer<1> cols =
        MakeIndexer<1>(col_size, {absl::Span<const int64_t>(col_stride)});
    ReducePerBlock<AccT, AccT, OutT>
        <<<BlocksFor(n_out, 1), kThreads, kThreads * sizeof(AccT), on.stream()>>>(
            n_out, parts, rows, cols, partial, o, init, combine, finalize);
    GS_CUDA_CHECK_LAUNCH("ReduceKernel");
    // Stream order makes the block safe to reuse once freed (Note [Caching allocator]).
    device_memory->Deallocate(partial, bytes);
  } else if (inner_reduced || n_out == 1) {
    int threads = 32;
    while (threads < kThreads && threads < n_red) threads *= 2;
    ReducePerBlock<T, AccT, OutT>
        <<<BlocksFor(n_out, 1), threads, threads * sizeof(AccT), on.stream()>>>(
            n_out, n_red, kept, red, in, o, init, combine, finalize);
  } else {
    const dim3 block(32, 8);
    ReduceAcrossOutputs<T, AccT, OutT>
        <<<BlocksFor(n_out, 32), block, 32 * 8 * sizeof(AccT), on.stream()>>>(
            n_out, n_red, kept, red, in, o, init, combine, finalize);
  }
  GS_CUDA_CHECK_LAUNCH("ReduceKernel");
}

}  // namespace gradserve::ops::cuda_kernels

#endif  // GRADSERVE_ENGINE_OPS_CUDA_REDUCE_KERNEL_CUH_
