// Normalization layers beside layer_norm (nn.h), with PyTorch's names, arguments and
// gradients: batch_norm (training and eval) and group_norm.
//
// Each is written with differentiable ops (mean, var, rsqrt, ...), so its gradient is
// PyTorch's and can be differentiated again. The statistics are the biased variance, as
// PyTorch's; batch_norm's running statistics are updated with the unbiased one and returned
// as outputs (a graph has no state), computed without history.
//
// Dtypes: float32 and float64, one for all tensors. Errors: StatusError(INVALID_ARGUMENT)
// naming the op, the argument and the shapes.
// Thread safety: stateless; concurrent calls are safe.

#ifndef GRADSERVE_ENGINE_OPS_NORMALIZATION_H_
#define GRADSERVE_ENGINE_OPS_NORMALIZATION_H_

#include <cstdint>

#include "engine/tensor/tensor.h"

namespace gradserve::ops {

struct BatchNormResult {
  Tensor output;
  // The running statistics after this call: in training (1 - momentum) * running +
  // momentum * the batch's mean / unbiased variance (the batch's own statistics when no
  // running ones were given); in eval the running ones, unchanged.
  Tensor running_mean;
  Tensor running_var;
};

// torch.nn.functional.batch_norm over input [N, C, ...] (at least 2 dims), per channel C.
// running_mean and running_var are [C] (undefined if absent; eval needs them); weight and
// bias [C] are optional. Training normalizes by the batch's statistics (over N and the
// spatial dims, which must hold more than one value per channel), eval by the running ones.
BatchNormResult batch_norm(const Tensor& input, const Tensor& running_mean,
                           const Tensor& running_var, const Tensor& weight, const Tensor& bias,
                           bool training, double momentum = 0.1, double eps = 1e-5);

// torch.nn.functional.group_norm over input [N, C, ...]: the C channels in num_groups groups
// (dividing C), each normalized over its channels and the spatial dims; weight and bias [C]
// optional.
Tensor group_norm(const Tensor& input, int64_t num_groups, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);

}  // namespace gradserve::ops

#endif  // GRADSERVE_ENGINE_OPS_NORMALIZATION_H_
