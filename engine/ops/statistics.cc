#include "engine/ops/statistics.h"

#include <algorithm>
#include <vector>

#include "engine/autograd/grad_mode.h"
#include "engine/kernels/op_kernels.h"
#include "engine/ops/comparison.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/formula_node.h"
#include "engine/ops/reductions.h"
#include "engine/ops/shape.h"
#include "engine/ops/shape_common.h"

namespace gradserve::ops {
namespace {

// The number of elements one output element of a reduction over dim gathers (every dim when
// dim is empty). Each dim is wrapped (and checked) as the reduction will.
int64_t ReducedCount(const char* op, const Tensor& input, absl::Span<const int64_t> dim) {
  if (dim.empty()) return input.numel();
  std::vector<int64_t> seen;
  int64_t count = 1;
  for (int64_t d : dim) {
    const int64_t w = WrapDimArg(op, "dim", d, input.shape());
    GS_CHECK_ARG(std::find(seen.begin(), seen.end(), w) == seen.end(), op, ": dim ", w,
                 " appears more than once in dim");
    seen.push_back(w);
    count *= input.dim() == 0 ? 1 : input.size(w);
  }
  return count;
}

// sqrt(v) whose gradient is zero where the result is zero (PyTorch's std_backward), not the
// NaN of 0 * inf.
Tensor GuardedSqrt(const Tensor& v) {
  Tensor out;
  {
    autograd::NoGradGuard no_grad;
    out = sqrt(v);
  }
  if (auto node = RecordFormula(
          out, {v}, "StdBackward0", [](const FormulaBackward& n, const Tensor& g) -> TensorList {
            const Tensor y = n.Saved(0);
            const Tensor zero = CompareMask("std", Comparison::kEqual, y, 0.0);
            return {where(zero, Tensor::Scalar(0, g.dtype(), g.device()), div(g, mul(y, 2.0)))};
          })) {
    node->Save(0, out, /*is_output=*/true);
  }
  return out;
}

// The values and indices of max (largest) or min along dim.
std::pair<Tensor, Tensor> Extremes(const char* op, bool largest, const Tensor& input, int64_t dim,
                                   bool keepdim) {
  RequireDefined(op, "input", input);
  RequireNotBool(op, "input", input);
  dim = WrapDimArg(op, "dim", dim, input.shape());
  if (input.dim() == 0) {
    return {input, Tensor::Scalar(0, DType::kInt64, input.device())};
  }
  const int64_t size = input.size(dim);
  GS_CHECK_ARG(size > 0, op, ": cannot reduce dim ", dim, " of size 0 in a tensor of shape ",
               ShapeToString(input.shape()));
  const int64_t dims[] = {dim};
  Tensor index;
  if (input.numel() == 0) {
    // No element, so no position: the reduced dim may be of any size (2^63 - 1, found by
    // IntegerWrapTest), and a vector of its positions would be allocated outside the budget.
    Shape kept(input.shape().begin(), input.shape().end());
    kept[static_cast<size_t>(dim)] = 1;
    index = Tensor::Empty(kept, DType::kInt64, input.device());
  } else {
    autograd::NoGradGuard no_grad;
    const Tensor x = input.detach();
    const Tensor best = largest ? amax(x, dims, true) : amin(x, dims, true);
    const Tensor hit = add(CompareMask(op, Comparison::kEqual, x, best), IsNanMask(x));
    // Positions along dim, shaped [size, 1, ...] to broadcast against the input.
    std::vector<int64_t> positions(static_cast<size_t>(size));
    for (int64_t k = 0; k < size; ++k) positions[k] = k;
    Tensor at = Tensor::FromVector<int64_t>(positions, {size});
    at = reshape(at, ShapeWith(Shape(input.dim() - dim - 1, 1), 0, size));
    if (input.device() != kCPU) at = at.To(input.device());
    // The first hit: the smallest position among the hits (the others read as size).
    const Tensor candidates = where(hit, at, Tensor::Scalar(size, DType::kInt64, input.device()));
    index = neg(amax(neg(candidates), dims, true));
  }
  Tensor values = gather(input, dim, index);
  if (!keepdim) {
    values = squeeze(values, dim);
    index = squeeze(index, dim);
  }
  return {values, index};
}

}  // namespace

Tensor logsumexp(const Tensor& input, absl::Span<const int64_t> dim, bool keepdim) {
  RequireFloating("logsumexp", "input", input);
  ReducedCount("logsumexp", input, dim);
  Tensor shift;
  {
    autograd::NoGradGuard no_grad;
    shift = amax(input.detach(), dim, /*keepdim=*/true);
    shift = where(IsInfMask(shift), Tensor::Scalar(0, shift.dtype(), shift.device()), shift);
  }
  const Tensor total = log(sum(exp(sub(input, shift)), dim, keepdim));
  // The shift without the reduced dims: a sum over dims of size 1 is the value itself.
  return add(total, keepdim ? shift : sum(shift, dim, false));
}

Tensor var(const Tensor& input, absl::Span<const int64_t> dim, int64_t correction, bool keepdim) {
  RequireFloating("var", "input", input);
  const int64_t n = ReducedCount("var", input, dim);
  const Tensor centered = sub(input, mean(input, dim, /*keepdim=*/true));
  // In double: n - correction overflows int64 for a correction near its minimum.
  const double divisor = std::max(0.0, static_cast<double>(n) - static_cast<double>(correction));
  return div(sum(mul(centered, centered), dim, keepdim), divisor);
}

Tensor std_dev(const Tensor& input, absl::Span<const int64_t> dim, int64_t correction,
               bool keepdim) {
  RequireFloating("std", "input", input);
  return GuardedSqrt(var(input, dim, correction, keepdim));
}

Tensor amin(const Tensor& input, absl::Span<const int64_t> dim, bool keepdim) {
  RequireDefined("amin", "input", input);
  RequireNotBool("amin", "input", input);
  return neg(amax(neg(input), dim, keepdim));
}

std::pair<Tensor, Tensor> max(const Tensor& input, int64_t dim, bool keepdim) {
  return Extremes("max", /*largest=*/true, input, dim, keepdim);
}

std::pair<Tensor, Tensor> min(const Tensor& input, int64_t dim, bool keepdim) {
  return Extremes("min", /*largest=*/false, input, dim, keepdim);
}

}  // namespace gradserve::ops
