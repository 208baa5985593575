// MapKernel on a GPU: out[i] = fn(ins[i]...) as one CUDA kernel (Note [Elementwise kernels]).
//
// fn is the functor the op passes to MapKernel; it must be callable on the device
// (GS_HOST_DEVICE) and is copied into the kernel's parameters, so it may hold values but no
// pointers to host memory. Launched on the current stream of out's GPU and not waited for.

#ifndef GRADSERVE_ENGINE_OPS_CUDA_MAP_KERNEL_CUH_
#define GRADSERVE_ENGINE_OPS_CUDA_MAP_KERNEL_CUH_

#include <array>
#include <utility>

#include "engine/kernels/cuda/launch.cuh"

namespace gradserve::ops::cuda_kernels {

template <typename OutT, typename Fn, typename... InTs>
__global__ void MapContiguous(int64_t n, OutT* out, Fn fn, const InTs*... ins) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = static_cast<OutT>(fn(ins[i]...));
  }
}

template <typename OutT, typename Fn, size_t... I, typename... InTs>
__device__ void MapOne(const int64_t* off, OutT* out, Fn& fn, std::index_sequence<I...>,
                       const InTs*... ins) {
  out[off[0]] = static_cast<OutT>(fn(ins[off[I + 1]]...));
}

template <int N, typename OutT, typename Fn, typename... InTs>
__global__ void MapStrided(int64_t n, StridedIndexer<N> ix, OutT* out, Fn fn, const InTs*... ins) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t off[N];
    ix.Offsets(i, off);
    MapOne(off, out, fn, std::index_sequence_for<InTs...>{}, ins...);
  }
}

// Each input broadcasts to out's shape; out may have any strides (no two elements at one
// address).
template <typename OutT, typename... InTs, typename Fn, typename... Tensors>
void LaunchMap(const Tensor& out, const Fn& fn, const Tensors&... ins) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const LaunchOn on(out);
  OutT* const o = out.data<OutT>();
  if (out.is_contiguous() && ((ins.numel() == n && ins.is_contiguous()) && ...)) {
    MapContiguous<OutT, Fn, InTs...>
        <<<BlocksFor(n), kThreads, 0, on.stream()>>>(n, o, fn, ins.template data<InTs>()...);
  } else {
    constexpr int N = 1 + sizeof...(InTs);
    const std::array<Strides, N - 1> bs{
        BroadcastStrides(ins.shape(), ins.strides(), out.shape())...};
    std::array<absl::Span<const int64_t>, N> spans{};
    spans[0] = out.strides();
    for (int k = 1; k < N; ++k) spans[k] = bs[k - 1];
    const StridedIndexer<N> ix = MakeIndexer<N>(out.shape(), spans);
    MapStrided<N, OutT, Fn, InTs...>
        <<<BlocksFor(n), kThreads, 0, on.stream()>>>(n, ix, o, fn, ins.template data<InTs>()...);
  }
  GS_CUDA_CHECK_LAUNCH("MapKernel");
}

}  // namespace gradserve::ops::cuda_kernels

#endif  // GRADSERVE_ENGINE_OPS_CUDA_MAP_KERNEL_CUH_
