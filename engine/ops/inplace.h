// What every in-place op shares: the checks before it writes into its `self`, and the copy of
// self's old value that a backward formula may need (Note [In-place ops]).
//
// Note [In-place ops]
// An in-place op (PyTorch's add_, relu_, copy_, masked_fill_, ...: the name ends in '_') writes
// its result into the elements of its first input, `self`, and returns self: no new output is
// allocated, and every view and alias of self sees the new values. It runs as its out-of-place
// form with self as the destination, then:
//   - bumps self's version (Note [Version counter] in engine/tensor/storage.h), so any Node that
//     saved self, or a view of it, refuses to run on the new values (Note [Saved versions]);
//   - when grad mode records it, rebases self's history as PyTorch's rebase_history does: the
//     op's Node takes an edge to self's old grad_fn (or AccumulateGrad) and becomes self's new
//     grad_fn, so later readers of self differentiate through the write;
//   - when its backward formula reads self's old value (mul_, div_, clamp_), it saves a copy
//     of that value made before the write (OriginalSelf), as PyTorch's generated code saves
//     self.clone(); formulas that read the result (relu_, sigmoid_, tanh_) save self after the
//     write, at its new version.
//   - when self is a view, rebases its base's history too (CopySlices, Note [Views written in
//     place] in engine/autograd/variable.h), so gradients through the base and through every
//     view of it see the write.
// As in PyTorch, with grad mode on an in-place op refuses a leaf that requires grad (its .grad
// would no longer be the gradient of the value the graph read), a view of one, and a view whose
// base autograd does not track (made under no_grad) when the op records. Under no_grad all are
// allowed and only the data changes.
// A self whose elements overlap (expand's stride 0) is refused, as PyTorch refuses it.
//
// Errors: StatusError(INVALID_ARGUMENT) naming the op and the reason.
// Thread safety: as the ops; self must not be read by another thread while it is written.

#ifndef GRADSERVE_ENGINE_OPS_INPLACE_H_
#define GRADSERVE_ENGINE_OPS_INPLACE_H_

#include "absl/types/span.h"
#include "engine/autograd/variable.h"
#include "engine/tensor/tensor.h"

namespace gradserve::ops {

// The checks before op writes into self: defined, writable under the grad mode (not a leaf
// that requires grad nor a view of one, not an untracked view when any of self and others
// requires grad), and no two elements of self at one address.
void CheckInPlace(const char* op, const Tensor& self, autograd::TensorRefs others);

// The checks of the result op computed before writing it into self: its shape and dtype are
// self's (the broadcast shape of the operands must be self's shape, as in PyTorch; a result of
// another dtype is refused rather than converted).
void CheckInPlaceResult(const char* op, const Tensor& self, absl::Span<const int64_t> shape,
                        DType dtype);

// t itself, or, when `copy`, a copy of its current values with t's place in the recorded graph
// (its gradient edge): what an in-place op reads and saves in place of its self, or of an
// operand that shares self's elements, so that its backward sees the values from before the
// write.
Tensor OriginalSelf(const Tensor& t, bool copy);

// Marks `view`, which a view op made over input's elements, a view (TensorImpl::is_view) and,
// under grad mode, makes autograd track its base (Note [Views written in place]). Call after
// the op recorded the view's history (RecordIfNeeded treats a view as an in-place op's self).
void MarkView(Tensor& view, const Tensor& input);

// Whether t's elements share memory with self's (the same storage).
inline bool SharesElements(const Tensor& t, const Tensor& self) {
  return t.defined() && t.storage() == self.storage();
}

}  // namespace gradserve::ops

#endif  // GRADSERVE_ENGINE_OPS_INPLACE_H_
