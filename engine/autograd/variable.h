// Tensor-as-Variable helpers: how ops connect their outputs into the recorded graph.
//
// The pattern every differentiable op follows (see engine/autograd/functions/ for examples):
//   if (autograd::ShouldRecord({a, b})) {
//     auto node = autograd::MakeNode<MulBackward>(...saved tensors...);
//     node->set_next_edges(autograd::CollectNextEdges({a, b}));
//     autograd::SetHistory(out, node);
//   }

#ifndef GRADSERVE_ENGINE_AUTOGRAD_VARIABLE_H_
#define GRADSERVE_ENGINE_AUTOGRAD_VARIABLE_H_

#include <functional>
#include <initializer_list>
#include <memory>

#include "absl/types/span.h"
#include "engine/autograd/edge.h"
#include "engine/autograd/function_hook.h"
#include "engine/autograd/node.h"
#include "engine/tensor/tensor.h"

namespace gradserve::autograd {

// The inputs of an op, by reference, so that recording touches no reference counts on the hot
// path: ShouldRecord({a, b}).
using TensorRefs = std::initializer_list<std::reference_wrapper<const Tensor>>;

// True if grad mode is on and any input requires grad: the op must record a Node.
bool ShouldRecord(absl::Span<const Tensor> inputs);
bool ShouldRecord(TensorRefs inputs);

// The edge a gradient for t flows along: (grad_fn, output_nr) for a tensor made by an op, the
// leaf's AccumulateGrad for a leaf that requires grad, and an invalid edge otherwise.
Edge GradientEdge(const Tensor& t);

// GradientEdge of each input.
EdgeList CollectNextEdges(absl::Span<const Tensor> inputs);
EdgeList CollectNextEdges(TensorRefs inputs);

// Makes `out` the next output of node: sets its grad_fn and output_nr and records its metadata
// as the node's next input.
void SetHistory(Tensor& out, const std::shared_ptr<Node>& node);

// Gives t the gradient edge `edge` (PyTorch's set_gradient_edge): t becomes output
// edge.input_nr of edge.function, which must be a Node, not an AccumulateGrad (copy the
// history of a tensor made by an op onto another handle, Note [In-place ops]). An invalid
// edge leaves t a leaf.
void SetGradientEdge(Tensor& t, Edge edge);

// The AccumulateGrad of a leaf that requires grad, made on first use and shared while alive;
// null for other tensors. Thread-safe.
std::shared_ptr<Node> GradAccumulator(const Tensor& leaf);

// Note [Views written in place]
// A view (narrow, select, slice, reshape without a copy, transpose, permute, squeeze,
// unsqueeze, expand) shares its elements with its base, so an in-place op on one changes the
// other, and autograd must see that, as PyTorch's differentiable views do:
//   - A view op made under grad mode tracks its base (TrackView): the tensor that is no view
//     whose elements the view shows (a view of a view tracks the first one's base), provided
//     that base is contiguous, so that a view's elements are a fixed set of its base's.
//   - An in-place op on a tracked view that records (Note [In-place ops] in
//     engine/ops/inplace.h) rebases the base's history (RebaseViewHistory in engine/ops):
//     the base's grad_fn becomes a CopySlices Node, which hands the slice of the base's
//     gradient the view covers to the in-place op's Node and the rest through unchanged to the
//     base's old history; the view's grad_fn becomes a view-replay Node (AsStridedBackward0)
//     over the base's new history.
//   - Any other view of the same base sees its base's history change too: its elements'
//     version moved past view_version_, so the first read of its grad_fn, requires_grad or
//     output_nr (Tensor's accessors) remakes its grad_fn as a view-replay Node over the base's
//     current history (AutogradMeta::RefreshViewHistory), as PyTorch's grad_fn() does. An
//     in-place op on the base itself rebases the base as any tensor's, and its views follow
//     the same way.
// Autograd itself knows no op; the ops install the view-replay Node's maker
// (SetViewReplayMaker) before main() runs.
//
// Thread safety: the remaking happens on the thread that builds the graph, where the version
// moves; a backward reads only histories made before it started.

// Records base's base (base itself unless it is a tracked view) as view's, and the version the
// view's history holds for. Leaves the view untracked when that tensor is not contiguous. Call
// once, after the view's own history is set.
void TrackView(Tensor& view, const Tensor& base);

// Marks a view made under no_grad of a tensor that requires grad, which an in-place op with
// grad mode on refuses as PyTorch does; IsViewMadeUnderNoGrad says whether t is one.
void MarkViewMadeUnderNoGrad(Tensor& view);
bool IsViewMadeUnderNoGrad(const Tensor& t);

// The base a tracked view shows; null for any other tensor.
const Tensor* ViewBaseOf(const Tensor& t);

// Makes the Node that gives the gradient of `view` back to `base` (whose view it is) over the
// base's current history: one input, view's metadata, and one edge, GradientEdge(base).
using ViewReplayMaker = std::shared_ptr<Node> (*)(const Tensor& view, const Tensor& base);
void SetViewReplayMaker(ViewReplayMaker maker);
// Throws INTERNAL when the ops have installed no maker.
std::shared_ptr<Node> MakeViewReplay(const Tensor& view, const Tensor& base);

// Makes `view`'s history replay it from its base's current history (Note [Views written in
// place]), after an in-place op on it rebased the base's.
void ReplayViewFromBase(const Tensor& view);

// Registers a hook on the gradient of t (PyTorch's Tensor.register_hook): on its grad_fn for a
// non-leaf, on its AccumulateGrad for a leaf. Throws INVALID_ARGUMENT if t requires no grad.
// For a leaf the hook lives as long as its AccumulateGrad, which the recorded graph owns.
void RegisterHook(const Tensor& t, std::shared_ptr<TensorHook> hook);

}  // namespace gradserve::autograd

#endif  // GRADSERVE_ENGINE_AUTOGRAD_VARIABLE_H_
