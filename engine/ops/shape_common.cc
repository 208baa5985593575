#include "engine/ops/shape_common.h"

#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/device/device_registry.h"
#include "engine/kernels/basic_kernels.h"

namespace gradserve::ops {
namespace {

int64_t WrapInto(const char* op, const char* arg, int64_t dim, int64_t bound,
                 absl::Span<const int64_t> shape) {
  GS_CHECK_ARG(dim >= -bound && dim < bound, op, ": ", arg, " = ", dim,
               " is out of range for a tensor of shape ", ShapeToString(shape), " (expected [",
               -bound, ", ", bound - 1, "])");
  return dim < 0 ? dim + bound : dim;
}

// "[1, 0]" for the element at row-major position `linear` of `shape`; "" for a 0-d tensor.
std::string PositionString(absl::Span<const int64_t> shape, int64_t linear) {
  if (shape.empty()) return "";
  Shape position(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    position[d] = linear % shape[d];
    linear /= shape[d];
  }
  return absl::StrCat("[", absl::StrJoin(position, ", "), "]");
}

}  // namespace

int64_t WrapDimArg(const char* op, const char* arg, int64_t dim, absl::Span<const int64_t> shape) {
  const int64_t rank = static_cast<int64_t>(shape.size());
  return WrapInto(op, arg, dim, rank == 0 ? 1 : rank, shape);
}

int64_t WrapInsertDimArg(const char* op, const char* arg, int64_t dim,
                         absl::Span<const int64_t> shape) {
  return WrapInto(op, arg, dim, static_cast<int64_t>(shape.size()) + 1, shape);
}

void CheckDTypeArg(const char* op, const char* arg, const Tensor& t, DType dtype) {
  GS_CHECK_ARG(t.defined(), op, ": ", arg, " is missing");
  GS_CHECK_ARG(t.dtype() == dtype, op, ": ", arg, " must be ", DTypeName(dtype), ", got ",
               t.DebugString());
}

void CheckSameDTypeAndDevice(const char* op, const char* arg_a, const Tensor& a, const char* arg_b,
                             const Tensor& b) {
  GS_CHECK_ARG(a.dtype() == b.dtype() && a.device() == b.device(), op, ": ", arg_b, " (",
               b.DebugString(), ") must have the dtype and device of ", arg_a, " (",
               a.DebugString(), ")");
}

void CheckIndices(const char* op, const char* arg, const Tensor& index, int64_t bound,
                  std::optional<int64_t> skip, const std::string& what) {
  CheckDTypeArg(op, arg, index, DType::kInt64);
  // An index in GPU memory is copied to the host to be checked here, before any kernel reads
  // it: indices are small next to what they index, and an out-of-range one must be an
  // INVALID_ARGUMENT naming it, not a fault inside a kernel.
  const Tensor host =
      DeviceRegistry::Get().host_accessible(index.device()) ? index : index.To(kCPU);
  const int64_t* data = host.data<int64_t>();
  int64_t linear = 0;
  int64_t bad_linear = -1;
  int64_t bad_value = 0;
  ForEachStrided2(host.shape(), host.strides(), host.strides(), [&](int64_t o, int64_t) {
    const int64_t v = data[o];
    if (bad_linear < 0 && (v < 0 || v >= bound) && !(skip.has_value() && v == *skip)) {
      bad_linear = linear;
      bad_value = v;
    }
    ++linear;
  });
  if (bad_linear >= 0 && index.numel() > 0) {
    ThrowStatus(absl::InvalidArgumentError(
        absl::StrCat(op, ": ", arg, PositionString(index.shape(), bad_linear), " = ", bad_value,
                     " is out of range for ", what, " (expected [0, ", bound, ")",
                     skip.has_value() ? absl::StrCat(" or ", *skip) : std::string(), ")")));
  }
}

Shape ShapeWithout(absl::Span<const int64_t> shape, int64_t dim) {
  Shape out(shape.begin(), shape.end());
  out.erase(out.begin() + dim);
  return out;
}

Shape ShapeWith(absl::Span<const int64_t> shape, int64_t dim, int64_t size) {
  Shape out(shape.begin(), shape.end());
  out.insert(out.begin() + dim, size);
  return out;
}

int64_t OffsetAlong(const Tensor& t, int64_t dim, int64_t index) {
  return t.numel() == 0 ? t.storage_offset() : t.storage_offset() + index * t.strides()[dim];
}

int64_t ProductOf(absl::Span<const int64_t> shape, int64_t begin, int64_t end) {
  int64_t n = 1;
  for (int64_t d = begin; d < end; ++d) {
    if (shape[d] == 0) return 0;
    if (__builtin_mul_overflow(n, shape[d], &n)) n = std::numeric_limits<int64_t>::max();
  }
  return n;
}

}  // namespace gradserve::ops
