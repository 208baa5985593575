// The matrix products of layers: torch.nn.functional.linear, torch.bmm and torch.baddbmm,
// written with matmul (linalg.h), so their gradients, second ones included, are matmul's.
//
// Dtypes: float32, float64 (and int64 without gradient), one dtype for all operands as in
// PyTorch. Errors: StatusError(INVALID_ARGUMENT) naming the op, the argument and the shapes.
// Thread safety: stateless; concurrent calls are safe.

#ifndef GRADSERVE_ENGINE_OPS_LINEAR_H_
#define GRADSERVE_ENGINE_OPS_LINEAR_H_

#include "engine/tensor/tensor.h"

namespace gradserve::ops {

// torch.nn.functional.linear: input [..., in] times weight [out, in] transposed, plus the
// optional bias [out] (undefined if absent): [..., out]. A 1-d weight [in] gives [...].
Tensor linear(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor());

// torch.bmm: batches of matrices [b, n, m] times [b, m, p] gives [b, n, p]; no broadcasting.
Tensor bmm(const Tensor& input, const Tensor& mat2);

// torch.baddbmm: beta * input + alpha * bmm(batch1, batch2), input broadcasting to [b, n, p].
// With beta 0 input is ignored (a NaN in it does not propagate) and gets a zero gradient.
Tensor baddbmm(const Tensor& input, const Tensor& batch1, const Tensor& batch2, double beta = 1,
               double alpha = 1);

}  // namespace gradserve::ops

#endif  // GRADSERVE_ENGINE_OPS_LINEAR_H_
