// The graph a client describes: leaves and ops in forward order, named values, attributes and
// sub-graphs. Independent of protobuf; the server translates its messages into this.
//
// Note [Graph values]
// Every value has a name, unique in its graph: a leaf's, an op output's, or (in a sub-graph) a
// formal input's. An op reads only values defined before it, so a graph is acyclic by
// construction. A sub-graph (checkpoint's body) sees only its formal inputs and its own leaves.
//
// In-place ops (add_, relu_, copy_, masked_fill_, ...: OpSchema::in_place) write their result
// into their first input's elements and return that same tensor (Note [In-place ops] in
// engine/ops/inplace.h). A name refers to a tensor, not to a version of its elements, as a
// Python variable does: after `add_(h, ...)`, every later read of "h" (by an op, a grad op, a
// backward call or the response) sees the written values and differentiates through the write,
// and so does every view of h. Such an op may name its one output (Python's `y = h.add_(1)`),
// which is then another name of h itself, or leave it unnamed. Inside a checkpoint body it
// must write a value the body computes, not a formal input or leaf, nor a view.
//
// Ops with graph-level meaning besides those of the op registry (engine/ops/op_registry.h):
//   grad        inputs: the roots. attrs: wrt (string list, required), grad_outputs (string
//               list, one per root, optional), create_graph (default true), retain_graph
//               (default true), allow_unused, materialize_grads. outputs: one per wrt. The
//               gradients, usable by later ops; differentiable when create_graph.
//   checkpoint  inputs: bound to body.inputs in order. outputs: bound to body.outputs. The body's
//               forward runs without saving anything; its backward recomputes it and runs a
//               nested backward (the reentrant path).
//   hook        inputs: one value. attrs: kind ("scale" with factor, "clamp" with min and/or max,
//               "zero", "nan_to_num" with nan, posinf, neginf). No outputs. Changes the gradient
//               that flows into that value during every later backward.
//   detach      inputs: one. outputs: one. The same data with no history.
// Op.no_grad runs an op with grad mode off (a no-grad region is a run of such ops).

#ifndef GRADSERVE_ENGINE_GRAPH_GRAPH_H_
#define GRADSERVE_ENGINE_GRAPH_GRAPH_H_

#include <memory>
#include <string>
#include <vector>

#include "engine/ops/attributes.h"
#include "engine/tensor/tensor.h"

namespace gradserve::graph {

struct Leaf {
  std::string name;
  Tensor value;
  bool requires_grad = false;
};

struct Graph;

struct Op {
  std::string op;                    // "mul", "grad", "checkpoint", ...
  std::vector<std::string> inputs;   // value names
  std::vector<std::string> outputs;  // new value names
  ops::Attrs attrs;
  bool no_grad = false;
  std::shared_ptr<const Graph> body;  // checkpoint only
};

struct Graph {
  std::vector<std::string> inputs;  // sub-graphs only: formal inputs
  std::vector<Leaf> leaves;
  std::vector<Op> ops;
  std::vector<std::string> outputs;  // sub-graphs only: results
};

// One backward call over a recorded graph.
struct BackwardCall {
  std::vector<std::string> roots;
  // One per root, or empty for all implicit; an undefined tensor means ones (one-element
  // roots only).
  TensorList seeds;
  // What to return gradients for. grad semantics: any values that require grad. backward
  // semantics: leaves whose .grad to return (empty: every leaf that requires grad).
  std::vector<std::string> inputs;
  bool accumulate_grad = false;  // backward() (true) or grad() (false)
  bool retain_graph = false;
  bool create_graph = false;
  bool allow_unused = false;
  bool materialize_grads = false;
  bool anomaly_mode = false;
};

struct CallResult {
  std::vector<std::string> names;  // the inputs the gradients are for
  TensorList grads;                // undefined where not connected and not materialized
  std::vector<bool> connected;     // whether each input was reached from the roots
};

}  // namespace gradserve::graph

#endif  // GRADSERVE_ENGINE_GRAPH_GRAPH_H_
