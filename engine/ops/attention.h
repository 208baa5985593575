// torch.nn.functional.scaled_dot_product_attention (PyTorch 2's math path; Debian's PyTorch
// 1.13 has no such function, and the tests compare with the same formula written in its ops):
//   softmax(query @ key^T * scale + mask) @ value
// with query [..., L, E], key [..., S, E], value [..., S, Ev] (batch dims broadcasting), scale
// 1 / sqrt(E) by default. A bool attn_mask [.., L, S] keeps the positions where it is true (the
// others get -inf before the softmax); a floating one is added. is_causal masks every key
// after the query's position (attn_mask must then be absent). A row with every key masked is
// NaN, as PyTorch's.
//
// Written with differentiable ops (matmul, softmax, masked_fill, add), so its gradients, second
// ones included, are theirs. dropout_p must be 0: for dropout on the weights, a graph spells
// the attention out with the dropout op (dropout.h), whose seed makes it reproducible.
//
// Errors: StatusError(INVALID_ARGUMENT) naming the argument and the shapes.
// Thread safety: stateless; concurrent calls are safe.

#ifndef GRADSERVE_ENGINE_OPS_ATTENTION_H_
#define GRADSERVE_ENGINE_OPS_ATTENTION_H_

#include <optional>

#include "engine/tensor/tensor.h"

namespace gradserve::ops {

Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    const Tensor& attn_mask = Tensor(), double dropout_p = 0,
                                    bool is_causal = false,
                                    std::optional<double> scale = std::nullopt);

}  // namespace gradserve::ops

#endif  // GRADSERVE_ENGINE_OPS_ATTENTION_H_
