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

// Registers a hook on the gradient of t (PyTorch's Tensor.register_hook): on its grad_fn for a
// non-leaf, on its AccumulateGrad for a leaf. Throws INVALID_ARGUMENT if t requires no grad.
// For a leaf the hook lives as long as its AccumulateGrad, which the recorded graph owns.
void RegisterHook(const Tensor& t, std::shared_ptr<TensorHook> hook);

}  // namespace gradserve::autograd

#endif  // GRADSERVE_ENGINE_AUTOGRAD_VARIABLE_H_
