// The public face of autograd: torch.autograd.backward and torch.autograd.grad.

#ifndef GRADSERVE_ENGINE_AUTOGRAD_AUTOGRAD_H_
#define GRADSERVE_ENGINE_AUTOGRAD_AUTOGRAD_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/autograd/cancellation.h"
#include "engine/tensor/memory_budget.h"
#include "engine/tensor/tensor.h"

namespace gradserve::autograd {

struct ExecuteStats;  // engine.h

struct BackwardOptions {
  // Keep saved tensors after the pass so the graph can be differentiated again (keep_graph).
  bool retain_graph = false;
  // Record the backward itself, so its gradients can be differentiated (double backward).
  bool create_graph = false;
  // Grad only: an input not connected to the roots gets an undefined gradient instead of an
  // INVALID_ARGUMENT error.
  bool allow_unused = false;
  // Grad only: such an input gets zeros instead (implies allow_unused).
  bool materialize_grads = false;
  // Fail with INVALID_ARGUMENT naming the first backward function that returns a NaN.
  bool anomaly_mode = false;
  // Stops the pass when cancelled or past its deadline. Null: a nested (reentrant) backward
  // inherits the token of the pass it runs in; otherwise the pass cannot be cancelled.
  std::shared_ptr<CancellationToken> cancel;
  // Charged for the gradients' memory (Note [Memory budget]); null: the caller's current one.
  std::shared_ptr<MemoryBudget> budget;
  // If set, filled in with the pass's node counts.
  ExecuteStats* stats = nullptr;
  // No other pass runs any Node of this one's graph until it returns (ExecuteOptions::
  // sole_pass): a graph private to its caller, differentiated one call at a time.
  bool sole_pass = false;
};

// torch.autograd.grad: the gradients of roots with respect to inputs, returned, never summed
// into .grad. seeds holds one tensor per root (undefined: ones, allowed for a one-element root
// only). An input that requires no grad is INVALID_ARGUMENT. Blocks until done.
absl::StatusOr<TensorList> Grad(const TensorList& roots, const TensorList& seeds,
                                const TensorList& inputs, const BackwardOptions& options);

// torch.autograd.backward: sums the gradients into the .grad of the leaves (only those in
// inputs, if it is not empty). Blocks until done.
absl::Status Backward(const TensorList& roots, const TensorList& seeds, const TensorList& inputs,
                      const BackwardOptions& options);

}  // namespace gradserve::autograd

#endif  // GRADSERVE_ENGINE_AUTOGRAD_AUTOGRAD_H_
