#include "engine/ops/attention.h"

#include <cmath>
#include <limits>

#include "engine/kernels/op_kernels.h"
#include "engine/ops/comparison.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/linalg.h"
#include "engine/ops/nn.h"
#include "engine/ops/shape.h"

namespace gradserve::ops {

Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const Tensor& attn_mask, double dropout_p, bool is_causal,
                                    std::optional<double> scale) {
  constexpr const char* kOp = "scaled_dot_product_attention";
  RequireFloating(kOp, "query", query);
  RequireFloating(kOp, "key", key);
  RequireFloating(kOp, "value", value);
  GS_CHECK_ARG(query.dim() >= 2 && key.dim() >= 2 && value.dim() >= 2, kOp,
               ": query, key and value must be [..., L, E], [..., S, E] and [..., S, Ev], got "
               "shapes ",
               ShapeToString(query.shape()), ", ", ShapeToString(key.shape()), " and ",
               ShapeToString(value.shape()));
  GS_CHECK_ARG(query.size(-1) == key.size(-1) && key.size(-2) == value.size(-2), kOp,
               ": query [..., L, E], key [..., S, E] and value [..., S, Ev] disagree: shapes ",
               ShapeToString(query.shape()), ", ", ShapeToString(key.shape()), " and ",
               ShapeToString(value.shape()));
  GS_CHECK_ARG(dropout_p == 0, kOp, ": dropout_p = ", dropout_p,
               " is not supported; apply the dropout op (with its seed) to the weights instead");
  GS_CHECK_ARG(!(is_causal && attn_mask.defined()), kOp,
               ": give either is_causal or attn_mask, not both");
  const double s = scale.value_or(1.0 / std::sqrt(static_cast<double>(query.size(-1))));
  Tensor scores = mul(matmul(query, transpose(key, -2, -1)), s);
  const double kNegInf = -std::numeric_limits<double>::infinity();
  if (is_causal) {
    const Tensor keep =
        Tensor::Full({query.size(-2), key.size(-2)}, 1, DType::kBool, query.device());
    scores = masked_fill(scores, CompareMask(kOp, Comparison::kEqual, tril(keep), 0.0), kNegInf);
  } else if (attn_mask.defined()) {
    if (attn_mask.dtype() == DType::kBool) {
      const Tensor dropped = CompareMask(kOp, Comparison::kEqual, attn_mask, 0.0);
      const Shape shape = BroadcastShapesOrThrow(kOp, scores.shape(), dropped.shape());
      if (shape != scores.shape()) scores = expand(scores, shape);
      scores = masked_fill(scores, dropped, kNegInf);
    } else {
      scores = add(scores, attn_mask);
    }
  }
  return matmul(softmax(scores, -1), value);
}

}  // namespace gradserve::ops
