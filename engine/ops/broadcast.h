// Broadcasting's adjoint pair, used by the backward of every broadcasting op: sum_to reduces a
// gradient to an input's shape, broadcast_to expands a tensor to a broadcast shape. Both are
// differentiable (each is the other's backward), so backward formulas built on them can be
// differentiated again (create_graph).
//
// Both are special cases of a reduction described by a ReductionLayout: SumOver sums an input
// over some of its dims, ExpandOver is its adjoint (it broadcasts the reduced tensor back over
// the reduced dims). The reductions (sum, mean, amax) and matmul's vector cases use them too.
//
// Errors: StatusError(INVALID_ARGUMENT) naming the op and the shapes.
// Thread safety: stateless; safe from any thread.

#ifndef GRADSERVE_ENGINE_OPS_BROADCAST_H_
#define GRADSERVE_ENGINE_OPS_BROADCAST_H_

#include <cstdint>

#include "absl/container/inlined_vector.h"
#include "absl/types/span.h"
#include "engine/tensor/tensor.h"

namespace gradserve::ops {

// How a reduction maps input_shape to output_shape: dim d of the input is summed over when
// reduced[d]; a reduced dim stays in the output as size 1 when kept[d] (keepdim), and is
// dropped otherwise. Dims not reduced keep their size and order.
struct ReductionLayout {
  Shape input_shape;
  Shape output_shape;
  absl::InlinedVector<bool, 6> reduced;
  absl::InlinedVector<bool, 6> kept;
};

// The layout of a reduction over the dims marked in `reduced` (one flag per dim of
// input_shape), keeping them as size 1 when keepdim.
ReductionLayout MakeReductionLayout(absl::Span<const int64_t> input_shape,
                                    absl::Span<const bool> reduced, bool keepdim);

// The layout that sums a tensor of shape `from` down to `to` (to must broadcast to from): the
// leading dims `from` has beyond `to` are reduced and dropped, and dims where `to` has size 1
// but `from` has not are reduced and kept. `op` names the caller in the error.
ReductionLayout SumToLayout(const char* op, absl::Span<const int64_t> from,
                            absl::Span<const int64_t> to);

// The sum of input over layout.reduced, of shape layout.output_shape (input.shape() must be
// layout.input_shape). float32 and float64 keep their dtype (float32 accumulates in double);
// int64 and bool sum to int64, as in PyTorch. Records a Node named node_name ("SumBackward0",
// "SumBackward1") whose backward is ExpandOver.
Tensor SumOver(const Tensor& input, const ReductionLayout& layout, const char* node_name);

// What SumOver records, alone: the Node of out = the sum of input over layout, for a sum whose
// kernel ran elsewhere (Note [A scaled sum in one pass] in engine/ops/elementwise.h).
void RecordSumOver(Tensor& out, const Tensor& input, const ReductionLayout& layout,
                   const char* node_name);

// The adjoint of SumOver: `reduced` (of shape layout.output_shape) repeated along the reduced
// dims to layout.input_shape. Returns a view (stride 0 along the reduced dims; no copy).
// Records ExpandBackward0, whose backward is SumOver.
Tensor ExpandOver(const Tensor& reduced, const ReductionLayout& layout);

// Sums grad down to `shape`, which must broadcast to grad's shape: the gradient of a broadcast
// input. Returns grad itself when the shapes are equal.
Tensor sum_to(const Tensor& grad, absl::Span<const int64_t> shape);

// torch.broadcast_to: input repeated to `shape` under broadcasting rules, as a view. Returns
// input itself when the shapes are equal.
Tensor broadcast_to(const Tensor& input, absl::Span<const int64_t> shape);

}  // namespace gradserve::ops

#endif  // GRADSERVE_ENGINE_OPS_BROADCAST_H_
