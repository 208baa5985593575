#include "engine/kernels/op_kernels.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "engine/device/device_registry.h"

namespace gradserve::ops {
namespace {

// The order of promote_types.
int Rank(DType t) {
  switch (t) {
    case DType::kBool:
      return 0;
    case DType::kInt64:
      return 1;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kFloat32:
      return 3;
    case DType::kFloat64:
      return 4;
  }
  return 0;
}

using MaybeDType = std::optional<DType>;

MaybeDType PromoteMaybe(MaybeDType a, MaybeDType b) {
  if (!a) return b;
  if (!b) return a;
  return PromoteTypes(*a, *b);
}

// PyTorch's combine_categories: `higher` is the result of the higher-priority operands.
MaybeDType CombineCategories(MaybeDType higher, MaybeDType lower) {
  if (!higher) return lower;
  if (!lower) return higher;
  if (IsFloating(*higher)) return higher;
  if (*higher == DType::kBool || IsFloating(*lower)) return PromoteTypes(*higher, *lower);
  return higher;
}

}  // namespace

DType PromoteTypes(DType a, DType b) {
  // float16 and bfloat16 hold no common 16-bit type: PyTorch gives float32.
  if (a != b && IsHalfFloating(a) && IsHalfFloating(b)) return DType::kFloat32;
  return Rank(a) >= Rank(b) ? a : b;
}

namespace {

// Where a tensor takes part in result_type: dimensioned, or 0-d.
void AddOperand(const Tensor& t, MaybeDType& dimensioned, MaybeDType& zero_dim) {
  if (!t.defined()) return;
  if (t.dim() > 0) {
    dimensioned = PromoteMaybe(dimensioned, t.dtype());
  } else {
    zero_dim = PromoteMaybe(zero_dim, t.dtype());
  }
}

}  // namespace

std::optional<DType> FloatingResultType(absl::Span<const Tensor> tensors) {
  MaybeDType dimensioned, zero_dim;
  for (const Tensor& t : tensors) {
    if (t.defined() && IsFloating(t.dtype())) AddOperand(t, dimensioned, zero_dim);
  }
  return CombineCategories(dimensioned, zero_dim);
}

DType ResultType(std::initializer_list<const Tensor*> tensors, ScalarKind scalar) {
  MaybeDType dimensioned, zero_dim, wrapped;
  for (const Tensor* t : tensors) {
    if (t != nullptr) AddOperand(*t, dimensioned, zero_dim);
  }
  switch (scalar) {
    case ScalarKind::kNone:
      break;
    case ScalarKind::kBool:
      wrapped = DType::kBool;
      break;
    case ScalarKind::kInt:
      wrapped = DType::kInt64;
      break;
    case ScalarKind::kFloat:
      wrapped = DType::kFloat32;
      break;
  }
  MaybeDType result = CombineCategories(dimensioned, CombineCategories(zero_dim, wrapped));
  GS_CHECK_INTERNAL(result.has_value(), "ResultType of no operands");
  return *result;
}

void RequireDefined(const char* op, const char* arg, const Tensor& t) {
  GS_CHECK_ARG(t.defined(), op, ": ", arg, " is an undefined tensor");
}

void RequireFloating(const char* op, const char* arg, const Tensor& t) {
  RequireDefined(op, arg, t);
  GS_CHECK_ARG(IsFloating(t.dtype()), op, ": ", arg,
               " must be floating (float32, float64, float16 or bfloat16), got ",
               DTypeName(t.dtype()));
}

void RequireNotBool(const char* op, const char* arg, const Tensor& t) {
  RequireDefined(op, arg, t);
  GS_CHECK_ARG(t.dtype() != DType::kBool, op, ": ", arg,
               " must be float32, float64 or int64, got bool");
}

void ThrowNoDeviceKernel(const char* kernel, Device device) {
  ThrowStatus(absl::InternalError(absl::StrCat(kernel, " reached a tensor on ", DeviceName(device),
                                               " in a file compiled without its CUDA kernels")));
}

void RequireSameDevice(const char* op, const char* arg_a, const Tensor& a, const char* arg_b,
                       const Tensor& b) {
  GS_CHECK_ARG(a.device() == b.device(), op, ": ", arg_a, " is on ", DeviceName(a.device()),
               " but ", arg_b, " is on ", DeviceName(b.device()));
}

Shape BroadcastShapesOrThrow(const char* op, absl::Span<const int64_t> a,
                             absl::Span<const int64_t> b) {
  if (a == b) return Shape(a.begin(), a.end());
  absl::StatusOr<Shape> shape = BroadcastShapes(a, b);
  GS_CHECK_ARG(shape.ok(), op, ": shapes ", ShapeToString(a), " and ", ShapeToString(b),
               " cannot be broadcast");
  return *std::move(shape);
}

Strides BroadcastStrides(absl::Span<const int64_t> from_shape,
                         absl::Span<const int64_t> from_strides, absl::Span<const int64_t> to) {
  const size_t lead = to.size() - from_shape.size();
  Strides strides(to.size(), 0);
  for (size_t d = 0; d < from_shape.size(); ++d) {
    strides[lead + d] = from_shape[d] == to[lead + d] ? from_strides[d] : 0;
  }
  return strides;
}

Strides ReducedOutputStrides(absl::Span<const int64_t> input_shape,
                             absl::Span<const bool> reduced) {
  Strides strides(input_shape.size(), 0);
  int64_t step = 1;
  for (int64_t d = static_cast<int64_t>(input_shape.size()) - 1; d >= 0; --d) {
    if (reduced[d]) continue;
    strides[d] = step;
    step *= input_shape[d];
  }
  return strides;
}

}  // namespace gradserve::ops
