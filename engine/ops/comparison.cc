#include "engine/ops/comparison.h"

#include <vector>

#include "engine/kernels/op_kernels.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/shape_common.h"

namespace gradserve::ops {
namespace {

// a <cmp> b; cmp is a Comparison.
struct CompareFn {
  int cmp;
  template <typename T>
  GS_HOST_DEVICE bool operator()(T a, T b) const {
    switch (static_cast<Comparison>(cmp)) {
      case Comparison::kGreater:
        return a > b;
      case Comparison::kGreaterEqual:
        return a >= b;
      case Comparison::kLess:
        return a < b;
      case Comparison::kLessEqual:
        return a <= b;
      case Comparison::kEqual:
        return a == b;
      case Comparison::kNotEqual:
        break;
    }
    return a != b;
  }
};

struct IsNanFn {
  template <typename T>
  GS_HOST_DEVICE bool operator()(T v) const {
    return v != v;
  }
};

struct IsInfFn {
  template <typename T>
  GS_HOST_DEVICE bool operator()(T v) const {
    return v == v && (v - v) != (v - v);  // inf - inf is NaN; finite - finite is 0
  }
};

// A bool tensor of t's shape, fn(t) elementwise, for floating t; all false otherwise.
template <typename Fn>
Tensor FloatingMask(const Tensor& t, const Fn& fn) {
  Tensor out = Tensor::Zeros(t.shape(), DType::kBool, t.device());
  if (!IsFloating(t.dtype())) return out;
  DispatchFloating(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    MapKernel<bool, T>(out, fn, t);
  });
  return out;
}

// The operands of maximum / minimum promoted by differentiable casts, with their shape.
struct Operands {
  Tensor a;
  Tensor b;
};

Operands PromoteOperands(const char* op, const Tensor& input, const Tensor& other) {
  RequireDefined(op, "input", input);
  RequireDefined(op, "other", other);
  RequireSameDevice(op, "input", input, "other", other);
  BroadcastShapesOrThrow(op, input.shape(), other.shape());
  const DType dtype = ResultType({&input, &other});
  return {to(input, dtype), to(other, dtype)};
}

// maximum (kGreater) or minimum (kLess): where a wins (or is NaN) a, where they tie their mean
// (each half the gradient, as PyTorch), else b.
Tensor Extremum(const char* op, Comparison wins, const Tensor& input, const Tensor& other) {
  const Operands p = PromoteOperands(op, input, other);
  Tensor take_a = CompareMask(op, wins, p.a, p.b);
  if (IsFloating(p.a.dtype())) {
    take_a = add(take_a, IsNanMask(p.a));  // bool + bool: logical or
    const Tensor tie = CompareMask(op, Comparison::kEqual, p.a, p.b);
    // a * 0.5 + b * 0.5 is a itself at a tie (never a + b, which overflows).
    return where(take_a, p.a, where(tie, add(mul(p.a, 0.5), mul(p.b, 0.5)), p.b));
  }
  return where(take_a, p.a, p.b);
}

// tril (lower) or triu: where(mask, input, 0) with the mask of the kept triangle.
Tensor Triangle(const char* op, bool lower, const Tensor& input, int64_t diagonal) {
  RequireDefined(op, "input", input);
  GS_CHECK_ARG(input.dim() >= 2, op, ": input must have at least 2 dimensions, got shape ",
               ShapeToString(input.shape()));
  const int64_t rows = input.size(-2);
  const int64_t cols = input.size(-1);
  Tensor mask = Tensor::Empty({rows, cols}, DType::kBool);
  bool* m = mask.data<bool>();
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j)
      m[i * cols + j] = lower ? j - i <= diagonal : j - i >= diagonal;
  }
  if (input.device() != kCPU) mask = mask.To(input.device());
  return where(mask, input, Tensor::Scalar(0, input.dtype(), input.device()));
}

}  // namespace

Tensor CompareMask(const char* op, Comparison cmp, const Tensor& a, const Tensor& b) {
  RequireSameDevice(op, "input", a, "other", b);
  const Shape shape = BroadcastShapesOrThrow(op, a.shape(), b.shape());
  const DType dtype = ResultType({&a, &b});
  const Tensor x = a.dtype() == dtype ? a.detach() : a.detach().To(dtype);
  const Tensor y = b.dtype() == dtype ? b.detach() : b.detach().To(dtype);
  Tensor out = Tensor::Empty(shape, DType::kBool, a.device());
  DispatchDType(dtype, [&](auto tag) {
    using T = decltype(tag);
    MapKernel<bool, T, T>(out, CompareFn{static_cast<int>(cmp)}, x, y);
  });
  return out;
}

Tensor CompareMask(const char* op, Comparison cmp, const Tensor& a, double value) {
  return CompareMask(op, cmp, a, Tensor::Scalar(value, a.dtype(), a.device()));
}

Tensor IsNanMask(const Tensor& a) { return FloatingMask(a, IsNanFn{}); }
Tensor IsInfMask(const Tensor& a) { return FloatingMask(a, IsInfFn{}); }

Tensor maximum(const Tensor& input, const Tensor& other) {
  return Extremum("maximum", Comparison::kGreater, input, other);
}

Tensor minimum(const Tensor& input, const Tensor& other) {
  return Extremum("minimum", Comparison::kLess, input, other);
}

Tensor masked_fill(const Tensor& input, const Tensor& mask, const Tensor& value) {
  RequireDefined("masked_fill", "input", input);
  RequireDefined("masked_fill", "mask", mask);
  RequireDefined("masked_fill", "value", value);
  GS_CHECK_ARG(mask.dtype() == DType::kBool, "masked_fill: mask must be bool, got ",
               DTypeName(mask.dtype()));
  GS_CHECK_ARG(value.dim() == 0,
               "masked_fill: value must be a 0-dimensional tensor or a scalar, got shape ",
               ShapeToString(value.shape()));
  RequireSameDevice("masked_fill", "input", input, "mask", mask);
  RequireSameDevice("masked_fill", "input", input, "value", value);
  const Shape shape = BroadcastShapesOrThrow("masked_fill", input.shape(), mask.shape());
  GS_CHECK_ARG(shape == input.shape(), "masked_fill: mask with shape ", ShapeToString(mask.shape()),
               " does not broadcast to input's shape ", ShapeToString(input.shape()));
  return where(mask, to(value, input.dtype()), input);
}

Tensor masked_fill(const Tensor& input, const Tensor& mask, double value) {
  RequireDefined("masked_fill", "input", input);
  return masked_fill(input, mask, Tensor::Scalar(value, input.dtype(), input.device()));
}

Tensor tril(const Tensor& input, int64_t diagonal) {
  return Triangle("tril", /*lower=*/true, input, diagonal);
}

Tensor triu(const Tensor& input, int64_t diagonal) {
  return Triangle("triu", /*lower=*/false, input, diagonal);
}

}  // namespace gradserve::ops
