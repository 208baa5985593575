// TensorKernels: the two kernels Tensor's own conversions need, reached through pointers that
// the kernel layer installs.
//
// Note [Tensor's kernels]
// Tensor::Full, Clone, contiguous, To and item fill or copy elements, and filling and copying a
// strided tensor of any dtype on any device is a kernel: engine/kernels/basic_kernels.cc, above
// the tensor layer (engine/README.md). So the tensor layer declares what it needs here and
// engine/kernels installs Fill and CopyInto when the program starts (a static initializer), as
// Note [Autograd metadata behind an interface] does for autograd.
//
// Thread safety: installed before main() runs and only read after.
// Errors: a conversion in a program without engine/kernels linked throws INTERNAL naming this
// note.

#ifndef GRADSERVE_ENGINE_TENSOR_TENSOR_KERNELS_H_
#define GRADSERVE_ENGINE_TENSOR_TENSOR_KERNELS_H_

namespace gradserve {

class Tensor;

struct TensorKernels {
  // Sets every element of dst to value (converted to dst's dtype).
  void (*fill)(const Tensor& dst, double value) = nullptr;
  // dst = src elementwise, converting dtype, across devices; shapes equal.
  void (*copy)(const Tensor& dst, const Tensor& src) = nullptr;
};

void SetTensorKernels(const TensorKernels& kernels);

}  // namespace gradserve

#endif  // GRADSERVE_ENGINE_TENSOR_TENSOR_KERNELS_H_
