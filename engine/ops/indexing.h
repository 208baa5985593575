// Ops that move elements by position, with PyTorch's names, arguments and gradients: flip,
// roll, slice with a step, scatter_add, index_add and cumsum.
//
// flip and roll are index_select along each dim (shape.h), so their gradients are its adjoint;
// slice is a view (Note [Shape op views]) whose SliceBackward0 adds the gradient back at the
// positions sliced; scatter_add and index_add add ScatterAddIntoZeros / IndexAddIntoZeros to
// the input; cumsum runs one kernel (a loop on the host, double accumulators for float32 as
// PyTorch's CPU kernel; a GPU tensor is summed on the host) and its CumsumBackward0 is
// flip(cumsum(flip(grad))). Every backward is written with differentiable ops (create_graph).
//
// Errors: StatusError(INVALID_ARGUMENT) naming the op, the argument, its value and the shapes;
// indices are checked before any memory is read through them.
// Thread safety: stateless; concurrent calls are safe.

#ifndef GRADSERVE_ENGINE_OPS_INDEXING_H_
#define GRADSERVE_ENGINE_OPS_INDEXING_H_

#include <cstdint>
#include <optional>

#include "absl/types/span.h"
#include "engine/tensor/tensor.h"

namespace gradserve::ops {

// torch.flip: the order of the elements reversed along each of dims (distinct).
Tensor flip(const Tensor& input, absl::Span<const int64_t> dims);

// torch.roll: elements shifted by shifts[i] along dims[i] (wrapping around); with no dims, the
// flattened tensor is shifted by shifts[0] and reshaped back.
Tensor roll(const Tensor& input, absl::Span<const int64_t> shifts,
            absl::Span<const int64_t> dims = {});

// torch.ops.aten.slice (x[start:end:step] along dim): start and end may be negative (counted
// from the end) or out of range (clamped), as Python slices; step >= 1. A view.
Tensor slice(const Tensor& input, int64_t dim, std::optional<int64_t> start,
             std::optional<int64_t> end, int64_t step = 1);

// torch.scatter_add: input with src[i][j][k] added at [i][index[i][j][k]][k] (dim 1); index has
// input's rank and is no larger than src anywhere, nor than input outside dim.
Tensor scatter_add(const Tensor& input, int64_t dim, const Tensor& index, const Tensor& src);

// torch.index_add: input with alpha * source's slice j added at slice index[j] along dim;
// index is 0-d or 1-d int64, source input's shape with index.numel() along dim.
Tensor index_add(const Tensor& input, int64_t dim, const Tensor& index, const Tensor& source,
                 double alpha = 1);

// Note [Indexed writes]
// index_copy and index_put write whole slices of their input (self for the in-place forms)
// chosen by int64 indices: index_copy the slices index[j] along dim, index_put the elements (or
// trailing slices) at the positions its index tensors name together, as self[indices] = values.
// Both reduce to one write into self seen as [outer, size, inner] along its middle dim (for
// index_put, the indexed leading dims flattened into one), whose backward gives self the
// gradient with the written slices zeroed (all of it when accumulating) and the source the
// written slices of the gradient. As PyTorch: negative indices count from the end; values
// broadcast to the indexed shape; accumulate (index_put) sums repeated positions. Unlike
// PyTorch, a position written twice without accumulate is refused (PyTorch leaves which write
// wins undefined). The in-place forms write no new tensor when self is contiguous (Note
// [In-place ops]).
// Errors: StatusError(INVALID_ARGUMENT) naming the op, the argument and the shapes or index.

// torch.index_copy: input with source's slice j written over slice index[j] along dim; index is
// 0-d or 1-d int64 without repeats, source input's shape with index.numel() along dim.
Tensor index_copy(const Tensor& input, int64_t dim, const Tensor& index, const Tensor& source);
Tensor index_copy_(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& source);

// torch.index_put (input[indices] = values): indices are one to input.dim() int64 tensors that
// broadcast together, indexing input's leading dims; values broadcasts to the broadcast index
// shape followed by input's remaining dims. accumulate adds instead of writing.
Tensor index_put(const Tensor& input, absl::Span<const Tensor> indices, const Tensor& values,
                 bool accumulate = false);
Tensor index_put_(const Tensor& self, absl::Span<const Tensor> indices, const Tensor& values,
                  bool accumulate = false);

// torch.cumsum: running sums along dim; int64 and bool sum to int64.
Tensor cumsum(const Tensor& input, int64_t dim);

}  // namespace gradserve::ops

#endif  // GRADSERVE_ENGINE_OPS_INDEXING_H_
