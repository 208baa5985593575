// What a Node expects of the gradient for one of its inputs.

#ifndef GRADSERVE_ENGINE_AUTOGRAD_INPUT_METADATA_H_
#define GRADSERVE_ENGINE_AUTOGRAD_INPUT_METADATA_H_

#include "engine/device/stream.h"
#include "engine/tensor/tensor.h"

namespace gradserve::autograd {

// A Node's input i is the gradient of its forward op's output i; the metadata records that
// output's shape, dtype and device, so the Engine can check every gradient it passes on
// (validate_outputs) and make zeros for an input that received none, and the stream the
// forward op ran on (Note [Streams in the backward pass]).
struct InputMetadata {
  InputMetadata() = default;
  explicit InputMetadata(const Tensor& t)
      : shape(t.shape()),
        dtype(t.dtype()),
        device(t.device()),
        stream(device.is_cpu() ? Stream{} : CurrentStream(device)) {}

  Tensor Zeros() const { return Tensor::Zeros(shape, dtype, device); }

  Shape shape;
  DType dtype = DType::kFloat32;
  Device device = kCPU;
  Stream stream;
};

}  // namespace gradserve::autograd

#endif  // GRADSERVE_ENGINE_AUTOGRAD_INPUT_METADATA_H_
