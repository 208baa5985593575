// checkpoint: a sub-graph whose forward saves nothing and whose backward recomputes it.
//
// Note [Checkpoint]
// Forward runs the body with grad mode off, so it records nothing and keeps no intermediate
// tensor; the CheckpointBackward Node it records saves only the body's inputs. Its next edges
// are the inputs' gradient edges followed by those of the body's parameters: the leaves that
// require grad inside the body and inside bodies nested in it. Treating the parameters as
// extra inputs lets their gradients leave the checkpoint along ordinary edges, so they reach
// the parameters' AccumulateGrad under backward() semantics and are captured under grad()
// semantics alike, at any nesting depth.
//
// Backward (apply) recomputes the body with grad mode on and runs a nested autograd::Grad from
// the recomputed outputs, seeded with the incoming gradients, to the inputs and parameters:
// the reentrant path. The Engine nests it on the same thread up to its MAX_DEPTH and hands
// deeper ones to its reentrant thread pool, so checkpoints nest to any depth the limits allow.
// The recomputation starts from detached copies of the inputs that require grad, so the nested
// pass stops at the checkpoint's boundary. Under create_graph (grad mode on while apply runs)
// it starts from the saved inputs themselves instead, so that the gradients it returns are
// differentiable with respect to everything before the checkpoint (double backward through a
// checkpoint). The parameters are always the leaves themselves.
//
// Errors: a second backward through a checkpoint whose graph was not retained throws
// FAILED_PRECONDITION (its saved inputs are freed). Errors of the body (StatusError) pass
// through, named by the body's op.
// Thread safety: the Engine holds the Node's mutex through apply, nested backward included, so
// concurrent backward calls through one checkpoint take turns (Note [Node thread safety]).

#ifndef GRADSERVE_ENGINE_GRAPH_CHECKPOINT_H_
#define GRADSERVE_ENGINE_GRAPH_CHECKPOINT_H_

#include <functional>

#include "engine/tensor/tensor.h"

namespace gradserve::graph {

// Runs the body on its inputs under the caller's grad mode; returns its outputs in order.
// Throws StatusError. Must be safe to call from any thread, once per forward and once per
// backward, as long as any output of the checkpoint is alive.
using CheckpointBody = std::function<TensorList(const TensorList& inputs)>;

// The checkpoint op (Note [Checkpoint]): runs body on inputs with grad mode off and, if grad
// mode is on and any input or parameter requires grad, records a CheckpointBackward Node as the
// grad_fn of the floating outputs. params are the body's leaves that require grad. The outputs
// are new tensors (never aliases of the inputs).
TensorList Checkpoint(const TensorList& inputs, const TensorList& params, CheckpointBody body);

}  // namespace gradserve::graph

#endif  // GRADSERVE_ENGINE_GRAPH_CHECKPOINT_H_
