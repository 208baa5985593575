// NN ops: softmax, losses, layer_norm, embedding and conv2d, with PyTorch's semantics, argument
// names and backward Node names.
//
// Dtypes: the floating inputs are float32 or float64 (one dtype per call, no promotion);
// targets and indices are int64. Outputs have the floating input's dtype.
//
// Autograd: each op records its backward Node when grad mode is on and an input requires grad.
// Note [NN backward paths]: a Node's apply() checks grad mode. With create_graph (grad mode on
// inside the backward) it writes the gradient with differentiable ops (elementwise.h,
// reductions.h, linalg.h, shape.h), so it can be differentiated again; otherwise it runs one
// fused kernel over the saved tensors, which gives the same values faster.
//
// Errors: StatusError(INVALID_ARGUMENT) naming the op, the argument, its value and the shapes
// (bad dim, mismatched shapes, wrong dtype, an out-of-range class index or embedding index).
// Indices are checked before any memory is read through them.
// Thread safety: the functions share no state; concurrent calls are safe.

#ifndef GRADSERVE_ENGINE_OPS_NN_H_
#define GRADSERVE_ENGINE_OPS_NN_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/types/span.h"
#include "engine/tensor/tensor.h"

namespace gradserve::ops {

// How a loss reduces its per-element values: PyTorch's reduction="none" | "mean" | "sum".
enum class Reduction { kNone, kMean, kSum };
// Parses "none", "mean" or "sum"; INVALID_ARGUMENT naming `op` and the value otherwise.
Reduction ParseReduction(const char* op, const std::string& name);

// torch.softmax: exp(x) / sum(exp(x)) along dim, computed stably. A 0-d input is one element
// (its softmax is 1). Records SoftmaxBackward0.
Tensor softmax(const Tensor& input, int64_t dim);

// torch.log_softmax: x - logsumexp(x) along dim. Records LogSoftmaxBackward0.
Tensor log_softmax(const Tensor& input, int64_t dim);

// torch.nn.functional.nll_loss on log-probabilities: input [C], [N, C] or [N, C, d1, ...];
// target int64 of input's shape without the class dim (1), each in [0, C) or ignore_index.
// weight, if defined, holds PyTorch's class weights: [C], the input's dtype and device, not
// requiring grad; each position's -log p is multiplied by its target class's weight. "mean"
// divides by the sum of the weights of the targets not ignored (their number without class
// weights; NaN if that is 0, as PyTorch). Records NllLossBackward0.
Tensor nll_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::kMean,
                int64_t ignore_index = -100, const Tensor& weight = Tensor());

// torch.nn.functional.cross_entropy. With class-index targets (int64): nll_loss(log_softmax(
// input, 1)) (dim 0 for a [C] input) with the same class weights, plus PyTorch's
// label_smoothing in [0, 1], which mixes in the mean over the classes of -log_softmax (each
// class's term times its weight). With class probabilities (a floating target of the input's
// shape): -sum over classes of weight * target * log_softmax(input), the target smoothed the
// same way, "mean" dividing by the number of positions; ignore_index must be left negative,
// and the loss is differentiable with respect to the target and the weight too, as PyTorch's.
Tensor cross_entropy(const Tensor& input, const Tensor& target,
                     Reduction reduction = Reduction::kMean, int64_t ignore_index = -100,
                     double label_smoothing = 0.0, const Tensor& weight = Tensor());

// torch.nn.functional.mse_loss: (input - target)^2 reduced. Shapes broadcast as PyTorch's do
// (each operand is expanded first, recording ExpandBackward0). Records MseLossBackward0.
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::kMean);

// torch.nn.functional.layer_norm over the trailing dims named by normalized_shape (at least
// one), with the biased variance; weight and bias (optional, undefined if absent) have
// normalized_shape. Records NativeLayerNormBackward0.
Tensor layer_norm(const Tensor& input, absl::Span<const int64_t> normalized_shape,
                  const Tensor& weight = Tensor(), const Tensor& bias = Tensor(),
                  double eps = 1e-5);

// torch.nn.functional.embedding: rows of weight [V, D] picked by int64 indices of any shape
// (each in [0, V)), giving indices.shape + [D]. Rows picked at padding_idx (which may be
// negative, counted from V) receive no gradient. Records EmbeddingBackward0.
Tensor embedding(const Tensor& weight, const Tensor& indices,
                 std::optional<int64_t> padding_idx = std::nullopt);

// torch.nn.functional.conv2d's arguments other than tensors; each pair is (height, width).
struct Conv2dOptions {
  std::array<int64_t, 2> stride = {1, 1};
  std::array<int64_t, 2> padding = {0, 0};
  std::array<int64_t, 2> dilation = {1, 1};
  int64_t groups = 1;
  // PyTorch's padding="same" (stride 1 only): each spatial dim is padded by dilation *
  // (kernel - 1) in all, half before and the rest after, so the output keeps the input's
  // height and width; `padding` is not used. padding="valid" is padding {0, 0}.
  bool same_padding = false;
};

// torch.nn.functional.conv2d: input [N, C, H, W] (or unbatched [C, H, W]), weight
// [O, C / groups, kH, kW], optional bias [O] (undefined if absent). Computed as im2col and one
// gemm per image and group. Records ConvolutionBackward0.
Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor(),
              const Conv2dOptions& options = Conv2dOptions());

}  // namespace gradserve::ops

#endif  // GRADSERVE_ENGINE_OPS_NN_H_
