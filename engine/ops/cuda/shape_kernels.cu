// The GPU kernels of the index ops' stubs (engine/ops/shape_kernels.h): index_select,
// index_add, gather and scatter_add.
//
// Each is one elementwise kernel over the output's (index_select, gather) or the source's
// (index_add, scatter_add) elements, with a grid-stride loop, launched on the current stream of
// the tensors' GPU and not waited for. The indices were checked on the host before the launch
// (CheckIndices), so the kernels read them without bounds checks. The adds are atomicAdd: the
// order in which repeated indices sum is not fixed, so float sums agree with the CPU's within
// rounding, not bit for bit.

#include <cstdint>

#include "engine/kernels/cuda/launch.cuh"
#include "engine/ops/shape_kernels.h"
#include "engine/tensor/dtype.h"

namespace gradserve::ops::cuda_kernels {
namespace {

// out[o, j, k] = in[o, index[j], k] (or 0 at the skip) for e = (o * n + j) * inner + k.
template <typename T>
__global__ void IndexSelectRows(int64_t total, IndexGeometry g, const int64_t* index, const T* in,
                                T* out) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t k = e % g.inner;
    const int64_t j = (e / g.inner) % g.n;
    const int64_t o = e / (g.inner * g.n);
    const int64_t v = index[j];
    out[e] = g.has_skip && v == g.skip ? T(0) : in[(o * g.size + v) * g.inner + k];
  }
}

// dst[o, index[j], k] += src[o, j, k] for e = (o * n + j) * inner + k, leaving out the skip.
template <typename T>
__global__ void IndexAddRows(int64_t total, IndexGeometry g, const int64_t* index, const T* src,
                             T* dst) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t k = e % g.inner;
    const int64_t j = (e / g.inner) % g.n;
    const int64_t o = e / (g.inner * g.n);
    const int64_t v = index[j];
    if (g.has_skip && v == g.skip) continue;
    atomicAdd(dst + (o * g.size + v) * g.inner + k, src[e]);
  }
}

// out[i] = in[target(i) + index[i] * dim_stride]: target indexes the gathered-from tensor at
// i's position in index's shape with the strides of the tensor, dim's set to 0.
template <typename T>
__global__ void GatherElements(int64_t n, StridedIndexer<1> target, int64_t dim_stride,
                               const int64_t* index, const T* in, T* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t off[1];
    target.Offsets(i, off);
    out[i] = in[off[0] + index[i] * dim_stride];
  }
}

// out[target(i) + index[i] * dim_stride] += src[i], target as in GatherElements.
template <typename T>
__global__ void ScatterAddElements(int64_t n, StridedIndexer<1> target, int64_t dim_stride,
                                   const int64_t* index, const T* src, T* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t off[1];
    target.Offsets(i, off);
    atomicAdd(out + off[0] + index[i] * dim_stride, src[i]);
  }
}

// The walk of GatherElements / ScatterAddElements: index's shape over `tensor`'s strides with
// dim's stride taken out (returned in dim_stride).
StridedIndexer<1> TargetIndexer(const Tensor& index, const Tensor& tensor, int64_t dim,
                                int64_t& dim_stride) {
  Strides strides = tensor.strides();
  dim_stride = 0;
  if (!strides.empty()) {
    dim_stride = strides[dim];
    strides[dim] = 0;
  }
  return MakeIndexer<1>(index.shape(), {absl::Span<const int64_t>(strides)});
}

void IndexSelectCuda(const Tensor& out, const Tensor& in, const Tensor& index,
                     const IndexGeometry& g) {
  const int64_t total = out.numel();
  if (total == 0) return;
  const LaunchOn on(out);
  DispatchDType(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    IndexSelectRows<T><<<BlocksFor(total), kThreads, 0, on.stream()>>>(
        total, g, index.data<int64_t>(), in.data<T>(), out.data<T>());
  });
  GS_CUDA_CHECK_LAUNCH("index_select");
}

void IndexAddCuda(const Tensor& dst, const Tensor& src, const Tensor& index,
                  const IndexGeometry& g) {
  const int64_t total = src.numel();
  if (total == 0) return;
  const LaunchOn on(dst);
  DispatchFloating(dst.dtype(), [&](auto tag) {
    using T = decltype(tag);
    IndexAddRows<T><<<BlocksFor(total), kThreads, 0, on.stream()>>>(total, g, index.data<int64_t>(),
                                                                    src.data<T>(), dst.data<T>());
  });
  GS_CUDA_CHECK_LAUNCH("index_add");
}

void GatherCuda(const Tensor& out, const Tensor& input, const Tensor& index, int64_t dim) {
  const int64_t n = index.numel();
  if (n == 0) return;
  int64_t dim_stride = 0;
  const StridedIndexer<1> target = TargetIndexer(index, input, dim, dim_stride);
  const LaunchOn on(out);
  DispatchDType(input.dtype(), [&](auto tag) {
    using T = decltype(tag);
    GatherElements<T><<<BlocksFor(n), kThreads, 0, on.stream()>>>(
        n, target, dim_stride, index.data<int64_t>(), input.data<T>(), out.data<T>());
  });
  GS_CUDA_CHECK_LAUNCH("gather");
}

void ScatterAddCuda(const Tensor& out, const Tensor& src, const Tensor& index, int64_t dim) {
  const int64_t n = index.numel();
  if (n == 0) return;
  int64_t dim_stride = 0;
  const StridedIndexer<1> target = TargetIndexer(index, out, dim, dim_stride);
  const LaunchOn on(out);
  DispatchFloating(src.dtype(), [&](auto tag) {
    using T = decltype(tag);
    ScatterAddElements<T><<<BlocksFor(n), kThreads, 0, on.stream()>>>(
        n, target, dim_stride, index.data<int64_t>(), src.data<T>(), out.data<T>());
  });
  GS_CUDA_CHECK_LAUNCH("scatter_add");
}

}  // namespace
}  // namespace gradserve::ops::cuda_kernels

namespace gradserve::cuda {

void RegisterShapeCudaKernels() {
  using namespace ops::cuda_kernels;  // NOLINT(build/namespaces)
  ops::index_select_stub.Register(DeviceType::kCUDA, &IndexSelectCuda);
  ops::index_add_stub.Register(DeviceType::kCUDA, &IndexAddCuda);
  ops::gather_stub.Register(DeviceType::kCUDA, &GatherCuda);
  ops::scatter_add_stub.Register(DeviceType::kCUDA, &ScatterAddCuda);
}

}  // namespace gradserve::cuda
