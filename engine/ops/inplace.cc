// The checks and saved copies every in-place op shares (inplace.h, Note [In-place ops]).

#include "engine/ops/inplace.h"

#include <string>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "engine/autograd/grad_mode.h"
#include "engine/util/quote.h"
#include "engine/util/status_error.h"

namespace gradserve::ops {
namespace {

// "'h' float32[3]", or the tensor alone when it has no name.
std::string Describe(const Tensor& t) {
  return t.name().empty() ? t.DebugString() : absl::StrCat(Quote(t.name()), " ", t.DebugString());
}

}  // namespace

void CheckInPlace(const char* op, const Tensor& self, autograd::TensorRefs others) {
  GS_CHECK_ARG(self.defined(), op, ": self is missing");
  for (size_t d = 0; d < self.shape().size(); ++d) {
    GS_CHECK_ARG(self.strides()[d] != 0 || self.shape()[d] <= 1, op,
                 ": unsupported operation: more than one element of the written-to tensor ",
                 Describe(self),
                 " refers to a single memory location (an expanded value); clone it before "
                 "the in-place operation");
  }
  if (!autograd::GradMode::is_enabled()) return;
  GS_CHECK_ARG(!(self.is_leaf() && self.requires_grad()), op,
               ": a leaf Variable that requires "
               "grad is being used in an in-place operation (",
               Describe(self), "); write into it under no_grad, or into a copy");
  bool records = self.requires_grad();
  for (const Tensor& other : others) {
    if (!other.defined() || !other.requires_grad()) continue;
    records = true;
    GS_CHECK_ARG(!(other.is_leaf() && SharesElements(other, self)), op, ": writing into ",
                 Describe(self), " would change the elements of ", Describe(other),
                 ", a leaf Variable that requires grad");
  }
  GS_CHECK_ARG(!(records && self.is_view()), op, ": in-place operation on ", Describe(self),
               ", a view, while it requires grad or its operands do: rebasing a view's base "
               "(CopySlices) is not supported yet; apply the operation to the base, or to a "
               "copy of the view");
}

void CheckInPlaceResult(const char* op, const Tensor& self, absl::Span<const int64_t> shape,
                        DType dtype) {
  GS_CHECK_ARG(absl::c_equal(shape, self.shape()), op, ": output with shape ",
               ShapeToString(self.shape()), " doesn't match the broadcast shape ",
               ShapeToString(shape));
  GS_CHECK_ARG(dtype == self.dtype(), op, ": result type ", DTypeName(dtype),
               " can't be written into self of dtype ", DTypeName(self.dtype()),
               " in place; convert self first (the out-of-place op promotes)");
}

Tensor OriginalSelf(const Tensor& t, bool copy) {
  if (!copy || !t.defined()) return t;
  Tensor original = t.Clone();
  // A leaf keeps no edge: one that requires grad gets here only under no_grad (CheckInPlace
  // refuses it otherwise), where nothing is recorded.
  if (t.grad_fn() != nullptr) autograd::SetGradientEdge(original, autograd::GradientEdge(t));
  if (!t.name().empty()) original.set_name(t.name());
  return original;
}

}  // namespace gradserve::ops
