// The checks and saved copies every in-place op shares (inplace.h, Note [In-place ops]).

#include "engine/ops/inplace.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "engine/autograd/grad_mode.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/record.h"
#include "engine/ops/shape.h"
#include "engine/ops/shape_common.h"
#include "engine/util/quote.h"
#include "engine/util/status_error.h"

namespace gradserve::ops {
namespace {

// "'h' float32[3]", or the tensor alone when it has no name.
std::string Describe(const Tensor& t) {
  return t.name().empty() ? t.DebugString() : absl::StrCat(Quote(t.name()), " ", t.DebugString());
}

// Where a view's elements lie in its base (Note [Views written in place]): the base is
// contiguous, so element k of the view is element Index()[k] of the base flattened.
struct ViewGeometry {
  ViewGeometry(const Tensor& view, const Tensor& base)
      : base_shape(base.shape()),
        shape(view.shape()),
        strides(view.strides()),
        offset(view.storage_offset() - base.storage_offset()),
        base_numel(base.numel()) {}

  // The base's flat position of each of the view's elements, in the view's order, on device.
  Tensor Index(Device device) const {
    const int64_t n = Numel(shape);
    return PositionIndex(n, device, [this](int64_t k) {
      int64_t at = offset;
      for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
        at += (k % shape[d]) * strides[d];
        k /= shape[d];
      }
      return at;
    });
  }

  // The gradient of the base from g, the gradient of the view: g's elements added into zeros
  // at the view's places (an expanded view's repeats sum). Differentiable in g.
  Tensor Scatter(const Tensor& g, const Tensor& index) const {
    const int64_t flat[] = {-1};
    const int64_t numel[] = {base_numel};
    return reshape(IndexAddIntoZeros(numel, 0, index, reshape(g, flat)), base_shape);
  }

  Shape base_shape;
  Shape shape;
  Strides strides;
  int64_t offset;
  int64_t base_numel;
};

// The grad_fn of a view whose base was written in place (Note [Views written in place]), as
// PyTorch's regenerated AsStridedBackward0: the view's gradient placed into zeros of its base's
// shape, for the base's history.
// Thread safety: immutable once made.
class AsStridedBackward final : public autograd::Node {
 public:
  explicit AsStridedBackward(ViewGeometry geometry) : geometry_(std::move(geometry)) {}

  TensorList apply(TensorList&& grads) override {
    if (!grads[0].defined() || !should_compute_output(0)) return TensorList(1);
    return {geometry_.Scatter(grads[0], geometry_.Index(grads[0].device()))};
  }
  std::string name() const override { return "AsStridedBackward0"; }

 private:
  const ViewGeometry geometry_;
};

std::shared_ptr<autograd::Node> MakeAsStridedBackward(const Tensor& view, const Tensor& base) {
  auto node = autograd::MakeNode<AsStridedBackward>(ViewGeometry(view, base));
  node->set_next_edges({autograd::GradientEdge(base)});
  node->add_input_metadata(autograd::InputMetadata(view));
  return node;
}

// Note [Views written in place]: installed before main() runs.
[[maybe_unused]] const bool kViewReplayInstalled =
    (autograd::SetViewReplayMaker(&MakeAsStridedBackward), true);

// The base's grad_fn after an in-place op `fn` wrote into its view, as PyTorch's CopySlices:
// of the base's gradient g, the slice the view covers goes through fn, whose gradient for the
// view's old value takes its place, and the rest passes unchanged to the base's old history;
// fn's gradients for its other inputs go to their edges. Written with differentiable ops
// (index_select, where, IndexAddIntoZeros), so create_graph records it. Exact: no element
// is computed by arithmetic, so an infinite gradient outside the view stays as it was.
// Edges: 0 the base's old history, then fn's edges 1... Owns fn, which nothing else runs.
// Thread safety: the Engine holds this Node's mutex around apply and release_variables, and
// fn is reached only from here.
class CopySlices final : public autograd::Node {
 public:
  CopySlices(ViewGeometry geometry, std::shared_ptr<autograd::Node> fn)
      : geometry_(std::move(geometry)), fn_(std::move(fn)) {}

  TensorList apply(TensorList&& grads) override {
    TensorList out(num_outputs());
    if (!grads[0].defined()) return out;
    const Tensor g = std::move(grads[0]);
    const Tensor index = geometry_.Index(g.device());
    const int64_t flat[] = {-1};
    const Tensor g_flat = reshape(g, flat);
    TensorList res = fn_->apply({reshape(index_select(g_flat, 0, index), geometry_.shape)});
    if (should_compute_output(0)) {
      const Tensor in_view = InView(g.device());
      const Tensor slice =
          res[0].defined() ? res[0] : Tensor::Zeros(geometry_.shape, g.dtype(), g.device());
      const int64_t numel[] = {geometry_.base_numel};
      out[0] =
          reshape(where(in_view, IndexAddIntoZeros(numel, 0, index, reshape(slice, flat)), g_flat),
                  geometry_.base_shape);
    }
    for (size_t i = 1; i < out.size(); ++i) out[i] = std::move(res[i]);
    return out;
  }
  std::string name() const override { return "CopySlices"; }
  void release_variables() override { fn_->release_variables(); }

 private:
  // bool[base_numel]: whether each element of the base is one of the view's.
  Tensor InView(Device device) const {
    Tensor mask = Tensor::Zeros({geometry_.base_numel}, DType::kBool);
    const Tensor index = geometry_.Index(kCPU);
    bool* m = mask.data<bool>();
    const int64_t* at = index.data<int64_t>();
    for (int64_t k = 0; k < index.numel(); ++k) m[at[k]] = true;
    return device == kCPU ? mask : mask.To(device);
  }

  const ViewGeometry geometry_;
  const std::shared_ptr<autograd::Node> fn_;
};

}  // namespace

void MarkView(Tensor& view, const Tensor& input) {
  view.impl()->is_view = true;
  if (!IsFloating(view.dtype())) return;
  if (autograd::GradMode::is_enabled()) {
    autograd::TrackView(view, input);
  } else if (input.requires_grad() || autograd::IsViewMadeUnderNoGrad(input)) {
    autograd::MarkViewMadeUnderNoGrad(view);
  }
}

void RebaseViewHistory(Tensor& view, const std::shared_ptr<autograd::Node>& fn) {
  const Tensor* tracked = autograd::ViewBaseOf(view);
  // CheckInPlace refuses to record into an untracked view.
  GS_CHECK_INTERNAL(tracked != nullptr && fn->num_outputs() >= 1,
                    "in-place op on a view without a tracked base");
  Tensor base = *tracked;
  auto copy_slices = autograd::MakeNode<CopySlices>(ViewGeometry(view, base), fn);
  autograd::EdgeList edges = fn->next_edges();
  edges[0] = autograd::GradientEdge(base);
  copy_slices->set_next_edges(std::move(edges));
  autograd::SetHistory(base, copy_slices);
  autograd::ReplayViewFromBase(view);
}

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
  const Tensor* base = autograd::ViewBaseOf(self);
  GS_CHECK_ARG(base == nullptr || !(base->is_leaf() && base->requires_grad()), op,
               ": a view of a leaf Variable that requires grad is being used in an in-place "
               "operation (",
               Describe(self), ", a view of ", Describe(*base),
               "); write into it under no_grad, or into a copy");
  // A view made under no_grad of a value that requires grad requires grad in PyTorch.
  const bool no_grad_view = autograd::IsViewMadeUnderNoGrad(self);
  bool records = self.requires_grad() || no_grad_view;
  for (const Tensor& other : others) {
    if (!other.defined() || !other.requires_grad()) continue;
    records = true;
    GS_CHECK_ARG(!(other.is_leaf() && SharesElements(other, self)), op, ": writing into ",
                 Describe(self), " would change the elements of ", Describe(other),
                 ", a leaf Variable that requires grad");
  }
  GS_CHECK_ARG(!(records && no_grad_view), op, ": ", Describe(self),
               " is a view that was created in no_grad mode and is being modified inplace with "
               "grad mode enabled; this is ambiguous and forbidden, as in PyTorch: make the view "
               "and write it both under no_grad, or both outside");
  GS_CHECK_ARG(!(records && self.is_view() && base == nullptr), op, ": in-place operation on ",
               Describe(self),
               ", a view whose base autograd does not track (it was made under no_grad, or is a "
               "view of a non-contiguous tensor or of such a view), while it requires grad or "
               "its operands do; write into a copy of the view, or make the view with grad "
               "enabled");
}

void CheckInPlaceResult(const char* op, const Tensor& self, absl::Span<const int64_t> shape,
                        DType dtype) {
  GS_CHECK_ARG(absl::c_equal(shape, self.shape()), op, ": output with shape ",
               ShapeToString(self.shape()), " doesn't match the broadcast shape ",
               ShapeToString(shape));
  GS_CHECK_ARG(dtype == self.dtype(), op, ": result type ", DTypeName(dtype),
               " can't be cast to the desired output type ", DTypeName(self.dtype()),
               " (as in PyTorch: write into a tensor of a floating dtype, or use the "
               "out-of-place op)");
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
