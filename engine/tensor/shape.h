// Shapes and strides, and the arithmetic on them that must never overflow.

#ifndef GRADSERVE_ENGINE_TENSOR_SHAPE_H_
#define GRADSERVE_ENGINE_TENSOR_SHAPE_H_

#include <cstdint>
#include <string>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace gradserve {

// Sizes of each dimension, outermost first. Up to four dimensions live inline.
using Shape = absl::InlinedVector<int64_t, 4>;
// Steps in elements (not bytes) between neighbours along each dimension.
using Strides = absl::InlinedVector<int64_t, 4>;

// The number of elements; every size must be non-negative, and the product and the row-major
// strides (ContiguousStrides, zeros counted as ones) must fit in int64 (otherwise
// INVALID_ARGUMENT naming the shape).
absl::StatusOr<int64_t> CheckedNumel(absl::Span<const int64_t> shape);

// The number of elements of a shape already known to be valid.
int64_t Numel(absl::Span<const int64_t> shape);

// Row-major strides for a shape that CheckedNumel accepts.
Strides ContiguousStrides(absl::Span<const int64_t> shape);

// Whether strides are shape's row-major ones, dimensions of size 1 aside (their stride is never
// stepped over).
bool IsContiguous(absl::Span<const int64_t> shape, absl::Span<const int64_t> strides);

// Whether a and b are the same shape. Inline and elementwise: the backward pass compares
// every gradient's shape with what its Node expects, and the comparison of two vectors (a call
// to memcmp for a few bytes) was about 2% of a small Node's instructions.
inline bool SameShape(absl::Span<const int64_t> a, absl::Span<const int64_t> b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

// "[2, 3]"; "[]" for a 0-d tensor.
std::string ShapeToString(absl::Span<const int64_t> shape);

// The broadcast shape of a and b under NumPy/PyTorch rules, or INVALID_ARGUMENT.
absl::StatusOr<Shape> BroadcastShapes(absl::Span<const int64_t> a, absl::Span<const int64_t> b);

// Wraps a possibly negative dimension index into [0, rank), or INVALID_ARGUMENT. A 0-d tensor
// accepts dims -1 and 0, as in PyTorch.
absl::StatusOr<int64_t> WrapDim(int64_t dim, int64_t rank);

}  // namespace gradserve

#endif  // GRADSERVE_ENGINE_TENSOR_SHAPE_H_
