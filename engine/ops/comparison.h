// Ops that compare elements and pick by the result, with PyTorch's names and gradients:
// maximum, minimum, masked_fill, tril and triu, and the comparison masks other ops build
// their selections from.
//
// Autograd: each op is written with differentiable ops (where, mul, add, to), so its gradient
// is PyTorch's and can be differentiated again (create_graph). maximum and minimum give each
// operand half the gradient where they are equal, as PyTorch does; masked_fill gives the filled
// positions no gradient and a 0-d value tensor the sum of theirs; tril and triu pass the
// gradient of the kept triangle.
//
// Dtypes: maximum and minimum promote as torch.result_type; masked_fill and tril/triu keep
// the input's dtype (float32, float64, int64 or bool). Masks are bool and carry no gradient.
// Errors: StatusError(INVALID_ARGUMENT) naming the op, the argument and the shapes or dtypes.
// Thread safety: stateless; concurrent calls are safe.

#ifndef GRADSERVE_ENGINE_OPS_COMPARISON_H_
#define GRADSERVE_ENGINE_OPS_COMPARISON_H_

#include <cstdint>

#include "engine/tensor/tensor.h"

namespace gradserve::ops {

// --- Masks (bool tensors without history), broadcasting their operands. ---

enum class Comparison { kGreater, kGreaterEqual, kLess, kLessEqual, kEqual, kNotEqual };
// a <cmp> b elementwise in the promoted dtype of a and b, which share a device. `op` names the
// caller in errors.
Tensor CompareMask(const char* op, Comparison cmp, const Tensor& a, const Tensor& b);
// a <cmp> value, value taken in a's dtype.
Tensor CompareMask(const char* op, Comparison cmp, const Tensor& a, double value);
// Where a floating tensor holds NaN / +-inf (all false for other dtypes).
Tensor IsNanMask(const Tensor& a);
Tensor IsInfMask(const Tensor& a);

// --- Ops. ---

// torch.maximum / torch.minimum: the larger (smaller) of input and other elementwise,
// broadcasting; NaN if either is NaN. Ties split the gradient evenly.
Tensor maximum(const Tensor& input, const Tensor& other);
Tensor minimum(const Tensor& input, const Tensor& other);

// Tensor.masked_fill (out of place): input with value wherever the bool mask, which broadcasts
// to input's shape, is true. value is a 0-d tensor (differentiable) or a Python scalar.
Tensor masked_fill(const Tensor& input, const Tensor& mask, const Tensor& value);
Tensor masked_fill(const Tensor& input, const Tensor& mask, double value);

// torch.tril / torch.triu: the lower (upper) triangle of the last two dims, on and below
// (above) the diagonal `diagonal` (0 the main one, > 0 above it); other elements are zero.
Tensor tril(const Tensor& input, int64_t diagonal = 0);
Tensor triu(const Tensor& input, int64_t diagonal = 0);

}  // namespace gradserve::ops

#endif  // GRADSERVE_ENGINE_OPS_COMPARISON_H_
