#include "engine/ops/activations.h"

#include "engine/kernels/op_kernels.h"
#include "engine/ops/comparison.h"
#include "engine/ops/elementwise.h"

namespace gradserve::ops {

Tensor silu(const Tensor& input) {
  RequireFloating("silu", "input", input);
  return mul(input, sigmoid(input));
}

Tensor leaky_relu(const Tensor& input, double negative_slope) {
  RequireFloating("leaky_relu", "input", input);
  // input * (1 where input > 0, else negative_slope), the factor made from sign(relu(input)):
  // so the gradient g * factor stays connected to the input (with derivative zero), as
  // PyTorch's LeakyReluBackward0 result is, and a double backward gives zeros, not an error.
  const Tensor factor = add(mul(sign(relu(input)), 1 - negative_slope), negative_slope);
  return mul(input, factor);
}

Tensor elu(const Tensor& input, double alpha) {
  RequireFloating("elu", "input", input);
  const Tensor positive = CompareMask("elu", Comparison::kGreater, input, 0.0);
  // exp of min(input, 0): the positive side's exp would overflow, and its zero gradient from
  // where times inf would be NaN.
  const Tensor negative_part = clamp(input, std::nullopt, 0.0);
  return where(positive, input, mul(sub(exp(negative_part), 1.0), alpha));
}

}  // namespace gradserve::ops
