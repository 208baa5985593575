// Hooks that run around a Node's backward.
//
// Order, as in PyTorch: a Node's tensor pre-hooks (registered on the tensors it made, each for
// one input), then its pre-hooks (all inputs), then apply(), then its post-hooks. Captured
// gradients (autograd.grad's results) are read after the tensor pre-hooks.

#ifndef GRADSERVE_ENGINE_AUTOGRAD_FUNCTION_HOOK_H_
#define GRADSERVE_ENGINE_AUTOGRAD_FUNCTION_HOOK_H_

#include "engine/tensor/tensor.h"

namespace gradserve::autograd {

// Runs on the gradient of one tensor; returns the gradient to use instead (or the same one).
class TensorHook {
 public:
  virtual ~TensorHook() = default;
  virtual Tensor operator()(const Tensor& grad) = 0;
};

// Runs on all gradients a Node receives; returns those to use instead.
class FunctionPreHook {
 public:
  virtual ~FunctionPreHook() = default;
  virtual TensorList operator()(const TensorList& grads) = 0;
};

// Runs after apply() on its outputs (the gradients it made) and inputs; returns the outputs to
// pass on.
class FunctionPostHook {
 public:
  virtual ~FunctionPostHook() = default;
  virtual TensorList operator()(const TensorList& outputs, const TensorList& inputs) = 0;
};

}  // namespace gradserve::autograd

#endif  // GRADSERVE_ENGINE_AUTOGRAD_FUNCTION_HOOK_H_
