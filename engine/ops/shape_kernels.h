// The kernel stubs of the index ops (Note [Kernel stubs]): shape.cc defines them with their CPU
// implementations, engine/ops/cuda/shape_kernels.cu registers the GPU ones.
//
// Every stub takes tensors on one device, indices already checked against their bound on the
// host (CheckIndices in shape_common.h), and writes only into its output.

#ifndef GRADSERVE_ENGINE_OPS_SHAPE_KERNELS_H_
#define GRADSERVE_ENGINE_OPS_SHAPE_KERNELS_H_

#include <cstdint>
#include <type_traits>

#include "engine/kernels/kernel_stub.h"
#include "engine/tensor/tensor.h"

namespace gradserve::ops {

// index_select and index_add view the indexed tensor as [outer, size, inner] around the indexed
// dim and the selected slices as [outer, n, inner], n being the number of indices.
struct IndexGeometry {
  int64_t outer = 1;
  int64_t size = 1;
  int64_t inner = 1;
  int64_t n = 0;
  // A slice whose index equals skip reads as zeros (index_select) or is left out (index_add).
  bool has_skip = false;
  int64_t skip = 0;
};

// index_select: out[o, j, k] = in[o, index[j], k], or 0 where index[j] is the skip. out and in
// are contiguous, of one dtype (any); index is contiguous int64 with n elements.
using IndexSelectFn = void (*)(const Tensor& out, const Tensor& in, const Tensor& index,
                               const IndexGeometry& g);
// index_add: dst[o, index[j], k] += src[o, j, k], leaving out index[j] == skip. dst and src are
// contiguous, floating, of one dtype; index as above. The CPU adds in order; the GPU with atomic
// adds, so repeated indices sum in any order (float results agree within rounding).
using IndexAddFn = void (*)(const Tensor& dst, const Tensor& src, const Tensor& index,
                            const IndexGeometry& g);
// gather: out[i] = input at i's position (in index's shape) with dim's coordinate index[i].
// out and index are contiguous of index's shape; input has any strides; any dtype.
using GatherFn = void (*)(const Tensor& out, const Tensor& input, const Tensor& index, int64_t dim);
// scatter_add: out at i's position with dim's coordinate index[i] += src[i]. out is contiguous
// and zeroed; src and index contiguous of index's shape; floating, one dtype. The GPU adds with
// atomics, as index_add.
using ScatterAddFn = void (*)(const Tensor& out, const Tensor& src, const Tensor& index,
                              int64_t dim);

template <typename Fn>
using StubFor = KernelStub<std::remove_pointer_t<Fn>>;

extern StubFor<IndexSelectFn> index_select_stub;
extern StubFor<IndexAddFn> index_add_stub;
extern StubFor<GatherFn> gather_stub;
extern StubFor<ScatterAddFn> scatter_add_stub;

}  // namespace gradserve::ops

#endif  // GRADSERVE_ENGINE_OPS_SHAPE_KERNELS_H_
