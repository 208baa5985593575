// The activations models use beside relu, gelu, sigmoid and tanh (elementwise.h): silu,
// leaky_relu and elu, with PyTorch's names, arguments and gradients.
//
// Each is written with differentiable ops (elementwise.h, comparison.h), so its gradient is
// PyTorch's formula and can be differentiated again (create_graph); the branch of elu's where
// not taken never reaches exp with a large argument, so no inf times 0 makes a NaN gradient.
// Dtypes: float32 and float64, as PyTorch's kernels. Errors: StatusError(INVALID_ARGUMENT)
// naming the op and the input's dtype.
// Thread safety: stateless; concurrent calls are safe.

#ifndef GRADSERVE_ENGINE_OPS_ACTIVATIONS_H_
#define GRADSERVE_ENGINE_OPS_ACTIVATIONS_H_

#include "engine/tensor/tensor.h"

namespace gradserve::ops {

// torch.nn.functional.silu: input * sigmoid(input).
Tensor silu(const Tensor& input);

// torch.nn.functional.leaky_relu: input where input > 0, else input * negative_slope (the
// gradient at 0 is negative_slope, as PyTorch's).
Tensor leaky_relu(const Tensor& input, double negative_slope = 0.01);

// torch.nn.functional.elu: input where input > 0, else alpha * (exp(input) - 1) (the gradient at
// 0 is alpha, as PyTorch's).
Tensor elu(const Tensor& input, double alpha = 1.0);

}  // namespace gradserve::ops

#endif  // GRADSERVE_ENGINE_OPS_ACTIVATIONS_H_
