// Moving a tensor between devices, differentiably: PyTorch's tensor.to(device).

#ifndef GRADSERVE_ENGINE_OPS_DEVICE_COPY_H_
#define GRADSERVE_ENGINE_OPS_DEVICE_COPY_H_

#include "engine/ops/op_registry.h"
#include "engine/tensor/tensor.h"

namespace gradserve::ops {

// input copied to device (Tensor.to(device)); input itself if it is already there. The device
// must be registered (INVALID_ARGUMENT naming it otherwise). Differentiable for floating dtypes:
// the backward (ToCopyBackward0) moves the gradient back to the input's device.
Tensor to(const Tensor& input, Device device);

// Registers the graph op "to": inputs: input; attrs: device (string: "cpu", "sim:0", "cuda:0")
// and/or dtype (string: "float32", "float64", "int64", "bool"), at least one. With both, the
// dtype is converted first on the input's device, then the result is moved.
void RegisterDeviceCopyOps(OpRegistry& registry);

}  // namespace gradserve::ops

#endif  // GRADSERVE_ENGINE_OPS_DEVICE_COPY_H_
