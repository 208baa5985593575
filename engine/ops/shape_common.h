// Checks and small helpers shared by the shape ops (shape.cc) and the NN ops (nn.cc).
//
// Every check throws StatusError(INVALID_ARGUMENT) whose message starts with the op's name and
// names the argument, its value and the shapes involved (Note [Errors inside the engine]).
// Stateless; safe from any thread.

#ifndef GRADSERVE_ENGINE_OPS_SHAPE_COMMON_H_
#define GRADSERVE_ENGINE_OPS_SHAPE_COMMON_H_

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <utility>

#include "absl/types/span.h"
#include "engine/autograd/node.h"
#include "engine/autograd/variable.h"
#include "engine/kernels/op_kernels.h"
#include "engine/ops/record.h"
#include "engine/tensor/tensor.h"

namespace gradserve::ops {

// Wraps a possibly negative dim into [0, rank) (a 0-d tensor accepts -1 and 0). `arg` names the
// attribute ("dim", "dim0"); `shape` is the tensor's, for the message.
int64_t WrapDimArg(const char* op, const char* arg, int64_t dim, absl::Span<const int64_t> shape);
// As WrapDimArg for an op that inserts a dimension (unsqueeze, stack): wraps into [0, rank].
int64_t WrapInsertDimArg(const char* op, const char* arg, int64_t dim,
                         absl::Span<const int64_t> shape);

// The int64 index [position(0), ..., position(n - 1)] on device, built on
// the host.
template <typename Fn>
Tensor PositionIndex(int64_t n, Device device, Fn&& position) {
  Tensor index = Tensor::Empty({n}, DType::kInt64);
  int64_t* p = index.data<int64_t>();
  for (int64_t k = 0; k < n; ++k) p[k] = position(k);
  return device == kCPU ? index : index.To(device);
}

// Requires a defined tensor of the given dtype.
// (RequireFloating in op_kernels.h checks for a floating dtype.)
void CheckDTypeArg(const char* op, const char* arg, const Tensor& t, DType dtype);
// Requires b to have a's dtype and device (a named arg_a, b named arg_b).
void CheckSameDTypeAndDevice(const char* op, const char* arg_a, const Tensor& a, const char* arg_b,
                             const Tensor& b);

// Checks every element of an int64 tensor against [0, bound); `skip`, if given, is also allowed
// (ignore_index, padding_idx). The message names the first bad element by position, its value
// and what it indexes, e.g. "gather: index[1, 0] = 7 is out of range for dimension 1 of input
// with shape [2, 3]". `what` completes "for <what>". An index in GPU memory is copied to the
// host for the check.
void CheckIndices(const char* op, const char* arg, const Tensor& index, int64_t bound,
                  std::optional<int64_t> skip, const std::string& what);

// Checks index_select / index_add arguments against a tensor of `shape`: index is 0-d or 1-d
// int64 within shape[dim] (or equal to skip); returns the wrapped dim. `source_arg` names the
// tensor of `shape` in messages.
int64_t CheckIndexSelectArgs(const char* op, const char* source_arg,
                             absl::Span<const int64_t> shape, int64_t dim, const Tensor& index,
                             std::optional<int64_t> skip);

// The shape with dimension `dim` removed / inserted with `size`.
Shape ShapeWithout(absl::Span<const int64_t> shape, int64_t dim);
Shape ShapeWith(absl::Span<const int64_t> shape, int64_t dim, int64_t size);

// The storage offset of element `index` along dim of t, for a view. An empty tensor's views
// reach no memory, and their offsets stay: its sizes may be huge (2^63 - 1), so index * stride
// could overflow.
int64_t OffsetAlong(const Tensor& t, int64_t dim, int64_t index);

// The product of shape[begin, end), at most int64's max: only an empty tensor's sizes (its 0
// outside the range) can pass it, and then the product counts no element (the request fuzzer
// found such a product overflowing in cumsum).
int64_t ProductOf(absl::Span<const int64_t> shape, int64_t begin, int64_t end);

// --- Kernels without autograd, shared by the index ops and embedding (defined in shape.cc).
// Indices must have been checked (CheckIndices) by the caller. They run on any device with
// kernels for the index ops (shape_kernels.h); the index is moved to the data's device if needed.

// The slices of input along dim named by the 0-d or 1-d index, in a new contiguous tensor whose
// dim has index.numel() entries (a 0-d input gives index's shape). Slices whose index equals
// skip read as zeros. Any dtype.
Tensor IndexSelectKernel(const Tensor& input, int64_t dim, const Tensor& index,
                         std::optional<int64_t> skip);
// dst[.., index[j], ..] += src[.., j, ..] along dim, in order, skipping index == skip. dst is
// contiguous; both floating of one dtype.
void IndexAddKernel(const Tensor& dst, int64_t dim, const Tensor& index, const Tensor& src,
                    std::optional<int64_t> skip);

// Recording: RecordIfNeeded and RecordOp in op_kernels.h.

}  // namespace gradserve::ops

#endif  // GRADSERVE_ENGINE_OPS_SHAPE_COMMON_H_
