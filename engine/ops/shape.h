// Shape ops: views and copies that rearrange elements, with PyTorch's semantics and names.
//
// Every function records its backward Node when grad mode is on and an input requires grad
// (Note [Shape op views]); the backward formulas are themselves written with these ops, so
// gradients can be differentiated again (create_graph).
//
// Errors: StatusError(INVALID_ARGUMENT) naming the op, the argument, its value and the shapes
// (bad dim, bad size, mismatched shapes, wrong dtype, out-of-range index). An out-of-range
// index is always found before any memory is touched.
// Thread safety: the functions share no state; concurrent calls on the same inputs are safe.
//
// Note [Shape op views]
// reshape (when the strides allow), transpose, permute, expand, squeeze, unsqueeze, narrow and
// select return views: tensors that share the input's storage (Tensor::AsStrided), as PyTorch's
// do. Nothing in the engine writes into a tensor in place, so sharing is only a saving. cat,
// stack, index_select and gather return new tensors, as does reshape when no view can express
// the new shape.

#ifndef GRADSERVE_ENGINE_OPS_SHAPE_H_
#define GRADSERVE_ENGINE_OPS_SHAPE_H_

#include <cstdint>
#include <optional>

#include "absl/types/span.h"
#include "engine/tensor/tensor.h"

namespace gradserve::ops {

// torch.reshape: the same elements in the shape given, which may hold one -1 (inferred). A view
// where the input's strides allow, a copy otherwise. Records ViewBackward0.
Tensor reshape(const Tensor& input, absl::Span<const int64_t> shape);

// torch.transpose: swaps dims dim0 and dim1 (a view). Records TransposeBackward0.
Tensor transpose(const Tensor& input, int64_t dim0, int64_t dim1);

// torch.permute: reorders the dims; dims is a permutation of the input's dims (a view).
// Records PermuteBackward0.
Tensor permute(const Tensor& input, absl::Span<const int64_t> dims);

// Tensor.expand: broadcasts size-1 dims (and new leading dims) to `size` without copying; -1
// keeps a dim's size. Records ExpandBackward0, whose backward sums back with sum_to.
Tensor expand(const Tensor& input, absl::Span<const int64_t> size);

// torch.squeeze: removes dim `dim` if its size is 1 (otherwise returns a view of the same
// shape), or every size-1 dim when dim is not given. Records SqueezeBackward1 / 0.
Tensor squeeze(const Tensor& input, std::optional<int64_t> dim = std::nullopt);

// torch.unsqueeze: inserts a size-1 dim at `dim`, in [-rank - 1, rank]. Records
// UnsqueezeBackward0.
Tensor unsqueeze(const Tensor& input, int64_t dim);

// torch.cat: joins tensors of one dtype, device and rank (at least 1) along dim; their sizes
// must agree elsewhere. Records CatBackward0.
Tensor cat(absl::Span<const Tensor> tensors, int64_t dim = 0);

// torch.stack: joins tensors of one shape, dtype and device along a new dim. Records
// StackBackward0.
Tensor stack(absl::Span<const Tensor> tensors, int64_t dim = 0);

// torch.narrow: elements [start, start + length) along dim (a view); start may be negative
// (counted from the end). Records SliceBackward0.
Tensor narrow(const Tensor& input, int64_t dim, int64_t start, int64_t length);

// torch.select: the slice at `index` along dim, which is removed (a view); index may be
// negative. Records SelectBackward0.
Tensor select(const Tensor& input, int64_t dim, int64_t index);

// torch.index_select: the slices of input along dim named by `index` (int64, 0-d or 1-d, each
// in [0, size)). Records IndexSelectBackward0.
Tensor index_select(const Tensor& input, int64_t dim, const Tensor& index);

// torch.gather: out[i][j][k] = input[i][index[i][j][k]][k] for dim 1, and so on; index is int64
// with the input's rank, no larger than the input in dims other than dim. Records
// GatherBackward0.
Tensor gather(const Tensor& input, int64_t dim, const Tensor& index);

// --- Building blocks of backward formulas (also differentiable). ---

// The adjoint of index_select: zeros of `shape` with slice index[j] of source along dim added
// for each j (repeated indices sum). `skip`: a slice whose index equals it is left out (the
// embedding's padding_idx). Deterministic on the CPU, where one thread adds in order; a GPU adds
// with atomics, in any order. Records IndexAddBackward0, differentiable with respect to source.
Tensor IndexAddIntoZeros(absl::Span<const int64_t> shape, int64_t dim, const Tensor& index,
                         const Tensor& source, std::optional<int64_t> skip = std::nullopt);

// index_select where a slice whose index equals `skip` reads as zeros: the adjoint of
// IndexAddIntoZeros with the same skip. Without skip it is index_select.
Tensor IndexSelectSkipping(const Tensor& input, int64_t dim, const Tensor& index,
                           std::optional<int64_t> skip);

// The adjoint of gather: zeros of `shape` with src[i][j][k] added at [i][index[i][j][k]][k]
// (dim 1). Deterministic on the CPU; a GPU adds with atomics. Records ScatterAddBackward0,
// differentiable with respect to src.
Tensor ScatterAddIntoZeros(absl::Span<const int64_t> shape, int64_t dim, const Tensor& index,
                           const Tensor& src);

// The adjoint of narrow: zeros of `shape` with `slice` placed at [start, start + slice.size(dim))
// along dim. Differentiable (written with Cat).
Tensor PadAlongDim(const Tensor& slice, absl::Span<const int64_t> shape, int64_t dim,
                   int64_t start);

}  // namespace gradserve::ops

#endif  // GRADSERVE_ENGINE_OPS_SHAPE_H_
