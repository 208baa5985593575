// Reductions with PyTorch's names and semantics: sum, mean and amax over all dims or a list of
// dims, with keepdim.
//
// `dim` lists the dims to reduce (negative ones count from the end; a 0-d tensor accepts 0 and
// -1); an empty list reduces every dim, as PyTorch does for dim=[] and dim=None. keepdim keeps
// each reduced dim as size 1.
//
// Dtypes: sum keeps float32/float64 (float32 accumulates in double) and sums int64 and bool to
// int64; mean takes float32/float64 only; amax takes every dtype and keeps it.
// Autograd: SumBackward0 (no dim, no keepdim) / SumBackward1, MeanBackward0 / MeanBackward1,
// AmaxBackward0, which splits the gradient evenly among the elements equal to the maximum, as
// PyTorch does. The backward formulas are differentiable (create_graph).
// Errors: StatusError(INVALID_ARGUMENT): a dim out of range or repeated, mean of a non-floating
// tensor, amax over a dim of size 0.
// Thread safety: stateless; concurrent calls are safe.

#ifndef GRADSERVE_ENGINE_OPS_REDUCTIONS_H_
#define GRADSERVE_ENGINE_OPS_REDUCTIONS_H_

#include <cstdint>

#include "absl/types/span.h"
#include "engine/tensor/tensor.h"

namespace gradserve::ops {

Tensor sum(const Tensor& input, absl::Span<const int64_t> dim = {}, bool keepdim = false);
Tensor mean(const Tensor& input, absl::Span<const int64_t> dim = {}, bool keepdim = false);
Tensor amax(const Tensor& input, absl::Span<const int64_t> dim = {}, bool keepdim = false);

}  // namespace gradserve::ops

#endif  // GRADSERVE_ENGINE_OPS_REDUCTIONS_H_
