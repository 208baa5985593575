// Reductions beyond sum, mean and amax (reductions.h), with PyTorch's names and semantics:
// logsumexp, var, std, amin, and max / min along a dim with the indices of the extremes.
//
// `dim` follows reductions.h: a list of dims (negative ones count from the end), an empty list
// reducing every dim; keepdim keeps each reduced dim as size 1.
//
// Autograd: written with differentiable ops, so each gradient is PyTorch's formula and can be
// differentiated again. logsumexp subtracts the maximum (not differentiated) first, so large
// values neither overflow nor lose digits; std's gradient is zero where std is zero, as
// PyTorch's (StdBackward0), not NaN; max / min give the whole gradient to the element their
// index names (the first extreme, or the first NaN), as PyTorch's do; amin splits it among
// ties, as amax.
// Dtypes: logsumexp, var and std take float32 and float64; amin, max and min every dtype but
// bool, whose indices are int64.
// Errors: StatusError(INVALID_ARGUMENT) naming the op, the attribute and its value.
// Thread safety: stateless; concurrent calls are safe.

#ifndef GRADSERVE_ENGINE_OPS_STATISTICS_H_
#define GRADSERVE_ENGINE_OPS_STATISTICS_H_

#include <cstdint>
#include <utility>

#include "absl/types/span.h"
#include "engine/tensor/tensor.h"

namespace gradserve::ops {

// torch.logsumexp: log(sum(exp(input))) over dim, computed as m + log(sum(exp(input - m))), m
// the maximum (0 where it is infinite).
Tensor logsumexp(const Tensor& input, absl::Span<const int64_t> dim, bool keepdim = false);

// torch.var / torch.std (std_dev, so as not to hide namespace std): sum((x - mean)^2) / max(0, N -
// correction) over dim (N the number of elements reduced), and its square root. correction 1 is
// PyTorch's unbiased=True, 0 unbiased=False.
Tensor var(const Tensor& input, absl::Span<const int64_t> dim = {}, int64_t correction = 1,
           bool keepdim = false);
Tensor std_dev(const Tensor& input, absl::Span<const int64_t> dim = {}, int64_t correction = 1,
               bool keepdim = false);

// torch.amin: the minimum over dim.
Tensor amin(const Tensor& input, absl::Span<const int64_t> dim = {}, bool keepdim = false);

// torch.max(input, dim, keepdim) / torch.min: (values, indices) along one dim of non-zero size.
std::pair<Tensor, Tensor> max(const Tensor& input, int64_t dim, bool keepdim = false);
std::pair<Tensor, Tensor> min(const Tensor& input, int64_t dim, bool keepdim = false);

}  // namespace gradserve::ops

#endif  // GRADSERVE_ENGINE_OPS_STATISTICS_H_
