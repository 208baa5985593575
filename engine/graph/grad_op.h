// The `grad` op: torch.autograd.grad inside the graph, so that gradient penalties and
// Hessian-vector products fit in one request (engine/graph/graph.h lists its attributes).

#ifndef GRADSERVE_ENGINE_GRAPH_GRAD_OP_H_
#define GRADSERVE_ENGINE_GRAPH_GRAD_OP_H_

#include <memory>

#include "engine/autograd/cancellation.h"
#include "engine/ops/attributes.h"
#include "engine/tensor/tensor.h"

namespace gradserve::graph {

// The gradients of roots (seeded with seeds: one per root, undefined for ones) with respect to
// wrt, one per wrt, with the options the op's attributes give (create_graph and retain_graph
// default to true). Under create_graph the gradients have history, so later ops can
// differentiate them again. A wrt the roots do not reach gives zeros with materialize_grads,
// an undefined tensor with allow_unused, and an error otherwise.
// Blocks until the nested backward is done; charged to the current memory budget; stops when
// cancel is cancelled. Errors: throws StatusError (INVALID_ARGUMENT for a root or wrt that
// requires no grad, or an unreached wrt; whatever the backward raises).
TensorList RunGradOp(const TensorList& roots, const TensorList& seeds, const TensorList& wrt,
                     const ops::Attrs& attrs, const std::shared_ptr<CancellationToken>& cancel);

}  // namespace gradserve::graph

#endif  // GRADSERVE_ENGINE_GRAPH_GRAD_OP_H_
