// torch.nn.functional.dropout with a seed, so that a request is reproducible: the same seed,
// shape and p give the same mask on every server and device.
//
// The mask is drawn on the host from a std::mt19937_64 seeded with `seed` (one uniform draw in
// [0, 1) per element, in row-major order; an element is kept when its draw is >= p) and is an
// output, so a client can replay the call elsewhere (PyTorch: input * mask / (1 - p)). The
// output is input * mask * (1 / (1 - p)), differentiable as mul (create_graph included).
//
// Dtypes: float32 and float64. Errors: INVALID_ARGUMENT for p outside [0, 1].
// Thread safety: stateless; concurrent calls are safe.

#ifndef GRADSERVE_ENGINE_OPS_DROPOUT_H_
#define GRADSERVE_ENGINE_OPS_DROPOUT_H_

#include <cstdint>
#include <utility>

#include "engine/tensor/tensor.h"

namespace gradserve::ops {

// (output, mask): mask is bool of input's shape (all true when not training or p is 0).
std::pair<Tensor, Tensor> dropout(const Tensor& input, double p = 0.5, bool training = true,
                                  uint64_t seed = 0);

}  // namespace gradserve::ops

#endif  // GRADSERVE_ENGINE_OPS_DROPOUT_H_
