#include "engine/ops/dropout.h"

#include <random>

#include "engine/kernels/op_kernels.h"
#include "engine/ops/elementwise.h"
#include "engine/util/cancellation.h"

namespace gradserve::ops {

std::pair<Tensor, Tensor> dropout(const Tensor& input, double p, bool training, uint64_t seed) {
  RequireFloating("dropout", "input", input);
  GS_CHECK_ARG(p >= 0 && p <= 1, "dropout: p = ", p, " must be in [0, 1]");
  if (!training || p == 0) {
    return {input, Tensor::Full(input.shape(), 1, DType::kBool, input.device())};
  }
  Tensor mask = Tensor::Empty(input.shape(), DType::kBool);
  bool* m = mask.data<bool>();
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  WorkMeter meter;  // Note [Stopping a running op]
  ForEachBlock(mask.numel(), meter, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) m[i] = uniform(rng) >= p;
  });
  if (input.device() != kCPU) mask = mask.To(input.device());
  // p = 1 drops everything: the scale is then 0, as PyTorch's.
  const double scale = p == 1 ? 0.0 : 1.0 / (1.0 - p);
  return {mul(input, mul(mask.To(input.dtype()), scale)), mask};
}

}  // namespace gradserve::ops
