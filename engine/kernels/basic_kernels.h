// The few kernels the Engine itself needs: fill, copy, accumulate, add and the NaN check.
// The op set (engine/ops/) builds on these and adds its own.
//
// All of them work on tensors of any strides on host-accessible devices and on GPUs (there as
// asynchronous kernels on the tensor's current stream, through MapKernel and ReduceKernel of
// engine/kernels/op_kernels.h); CopyInto also moves bytes between devices through their backends.
// They record no autograd history.
// Errors: StatusError(INVALID_ARGUMENT) for mismatched shapes or dtypes. On the host they check
// the current cancellation token between blocks of a big tensor (Note [Stopping a running op]
// in engine/util/cancellation.h) and throw its status, leaving dst partly written.

#ifndef GRADSERVE_ENGINE_KERNELS_BASIC_KERNELS_H_
#define GRADSERVE_ENGINE_KERNELS_BASIC_KERNELS_H_

#include <cstdint>

#include "engine/tensor/tensor.h"
#include "engine/util/cancellation.h"

namespace gradserve {

// Sets every element of dst to value (converted to dst's dtype).
void Fill(const Tensor& dst, double value);

// dst = src elementwise; shapes must be equal; converts dtype; src and dst may be on different
// devices (then src is converted and packed on its device, the backend copies the bytes, and a
// strided dst is filled from a packed copy on its own device).
void CopyInto(const Tensor& dst, const Tensor& src);

// dst += src elementwise; same shape and dtype (and device, where one is a GPU).
void AccumulateInto(const Tensor& dst, const Tensor& src);

// A new tensor a + b; same shape and dtype; on a's device.
Tensor AddSameShape(const Tensor& a, const Tensor& b);

// True if t's memory may be written in place without anyone else seeing it: nothing else holds
// t or its storage, t is contiguous, and it is not part of a recorded graph. The Engine uses it
// to reuse a gradient's buffer (Note [Accumulating in place], Note [Reusing the gradient's
// buffer]).
bool OwnedExclusively(const Tensor& t);

// True if a floating tensor holds a NaN. For a GPU tensor this waits for the device (one value
// is copied back).
bool HasNaN(const Tensor& t);

// Calls fn(offset_a, offset_b) for each element in row-major order of `shape`, where the
// offsets are in elements along strides_a and strides_b. The strided walk every kernel shares.
// Checks the current cancellation token between blocks of elements (Note [Stopping a running
// op]): may throw StatusError(CANCELLED or DEADLINE_EXCEEDED) with the walk half done.
template <typename Fn>
void ForEachStrided2(absl::Span<const int64_t> shape, absl::Span<const int64_t> strides_a,
                     absl::Span<const int64_t> strides_b, Fn&& fn) {
  const int64_t rank = static_cast<int64_t>(shape.size());
  if (rank == 0) {
    fn(int64_t{0}, int64_t{0});
    return;
  }
  for (int64_t s : shape) {
    if (s == 0) return;
  }
  absl::InlinedVector<int64_t, 6> index(rank, 0);
  int64_t off_a = 0, off_b = 0;
  const int64_t inner = shape[rank - 1];
  const int64_t inner_a = strides_a[rank - 1], inner_b = strides_b[rank - 1];
  WorkMeter meter;
  while (true) {
    ForEachBlock(inner, meter, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) fn(off_a + i * inner_a, off_b + i * inner_b);
    });
    int64_t d = rank - 2;
    for (; d >= 0; --d) {
      if (++index[d] < shape[d]) {
        off_a += strides_a[d];
        off_b += strides_b[d];
        break;
      }
      off_a -= strides_a[d] * (shape[d] - 1);
      off_b -= strides_b[d] * (shape[d] - 1);
      index[d] = 0;
    }
    if (d < 0) return;
  }
}

}  // namespace gradserve

#endif  // GRADSERVE_ENGINE_KERNELS_BASIC_KERNELS_H_
