#include "engine/tensor/shape.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace gradserve {

absl::StatusOr<int64_t> CheckedNumel(absl::Span<const int64_t> shape) {
  int64_t n = 1;
  bool overflow = false;
  // The outermost stride ContiguousStrides makes: the sizes after the first, a zero counted
  // as one. It must fit even when the product is zero, as PyTorch's TensorImpl requires ("Stride
  // calculation overflowed"): [0, 2, 2^62] has no element, but a stride of 2^63.
  int64_t stride = 1;
  bool stride_overflow = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    const int64_t size = shape[i];
    if (size < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("negative dimension ", size, " in shape ", ShapeToString(shape)));
    }
    if (!overflow && __builtin_mul_overflow(n, size, &n)) overflow = true;
    if (i > 0 && !stride_overflow &&
        __builtin_mul_overflow(stride, std::max<int64_t>(size, 1), &stride)) {
      stride_overflow = true;
    }
  }
  // A zero anywhere makes the product zero even if a partial product overflowed. (Without a
  // zero, strides that overflow mean a product that does.)
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) {
    if (stride_overflow) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeToString(shape), " has strides larger than int64 can count"));
    }
    return 0;
  }
  if (overflow) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape ", ShapeToString(shape), " has more elements than int64 can count"));
  }
  return n;
}

int64_t Numel(absl::Span<const int64_t> shape) {
  // A shape with a zero has no elements, however large its other sizes: their product may pass
  // int64 ([1, 2^63 - 1, 4, 0], a view of a tensor CheckedNumel accepted), so it is not made.
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  int64_t n = 1;
  for (int64_t size : shape) n *= size;
  return n;
}

Strides ContiguousStrides(absl::Span<const int64_t> shape) {
  Strides strides(shape.size());
  int64_t step = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = step;
    // The outermost size scales no stride: multiplying by it could overflow (CheckedNumel bounds
    // only the strides used, e.g. [2^62, 4, 0] has none above 4).
    if (i > 0) step *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

bool IsContiguous(absl::Span<const int64_t> shape, absl::Span<const int64_t> strides) {
  int64_t expected = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    if (shape[d] == 1) continue;
    if (strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

std::string ShapeToString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<Shape> BroadcastShapes(absl::Span<const int64_t> a, absl::Span<const int64_t> b) {
  const size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da != db && da != 1 && db != 1) {
      return absl::InvalidArgumentError(absl::StrCat("shapes ", ShapeToString(a), " and ",
                                                     ShapeToString(b), " cannot be broadcast"));
    }
    out[i] = da == 1 ? db : da;
  }
  return out;
}

absl::StatusOr<int64_t> WrapDim(int64_t dim, int64_t rank) {
  const int64_t bound = std::max<int64_t>(rank, 1);
  if (dim < -bound || dim >= bound) {
    return absl::InvalidArgumentError(absl::StrCat("dimension ", dim, " out of range for a ", rank,
                                                   "-d tensor (expected [", -bound, ", ", bound - 1,
                                                   "])"));
  }
  return dim < 0 ? dim + bound : dim;
}

}  // namespace gradserve
