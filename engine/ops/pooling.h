// 2-d pooling with PyTorch's names, arguments and gradients: max_pool2d, avg_pool2d and
// adaptive_avg_pool2d over input [N, C, H, W] or unbatched [C, H, W].
//
// Each is written with differentiable ops, so its gradient is PyTorch's and can be
// differentiated again: avg_pool2d is a depthwise conv2d by a constant averaging kernel;
// adaptive_avg_pool2d is two products with constant averaging matrices (the bins PyTorch uses:
// rows floor(i * H / OH) to ceil((i + 1) * H / OH)); max_pool2d finds the index of each
// window's maximum (the first one, or the last NaN, as PyTorch's CPU kernel) on the host and
// gathers it, so the gradient goes to that element and overlapping windows add up.
//
// Dtypes: float32 and float64. Errors: StatusError(INVALID_ARGUMENT) naming the op, the
// attribute, its value and the input's shape (bad rank, padding over half the kernel, an
// output of no element). ceil_mode is max_pool2d's only; avg_pool2d refuses it
// (INVALID_ARGUMENT).
// Thread safety: stateless; concurrent calls are safe.

#ifndef GRADSERVE_ENGINE_OPS_POOLING_H_
#define GRADSERVE_ENGINE_OPS_POOLING_H_

#include <array>
#include <cstdint>
#include <optional>

#include "engine/tensor/tensor.h"

namespace gradserve::ops {

// A pooling window's arguments; each pair is (height, width).
struct Pool2dOptions {
  std::array<int64_t, 2> kernel_size = {1, 1};
  std::array<int64_t, 2> stride = {1, 1};  // PyTorch's default is kernel_size
  std::array<int64_t, 2> padding = {0, 0};
  std::array<int64_t, 2> dilation = {1, 1};  // max_pool2d only
  bool ceil_mode = false;                    // max_pool2d only
  bool count_include_pad = true;             // avg_pool2d only
  std::optional<int64_t> divisor_override;   // avg_pool2d only
};

Tensor max_pool2d(const Tensor& input, const Pool2dOptions& options);
Tensor avg_pool2d(const Tensor& input, const Pool2dOptions& options);
// output_size: (OH, OW), each at least 1.
Tensor adaptive_avg_pool2d(const Tensor& input, std::array<int64_t, 2> output_size);

}  // namespace gradserve::ops

#endif  // GRADSERVE_ENGINE_OPS_POOLING_H_
