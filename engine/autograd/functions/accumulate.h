// The differentiable sum the Engine itself uses to add gradients.

#ifndef GRADSERVE_ENGINE_AUTOGRAD_FUNCTIONS_ACCUMULATE_H_
#define GRADSERVE_ENGINE_AUTOGRAD_FUNCTIONS_ACCUMULATE_H_

#include "engine/tensor/tensor.h"

namespace gradserve::autograd {

// a + b for two gradients of one input (same shape, dtype and device). Records an
// AccumulateBackward Node when grad mode is on and either requires grad (create_graph), so the
// sum can be differentiated again. Also the smallest example of how an op records itself.
Tensor AccumulateSum(const Tensor& a, const Tensor& b);

}  // namespace gradserve::autograd

#endif  // GRADSERVE_ENGINE_AUTOGRAD_FUNCTIONS_ACCUMULATE_H_
