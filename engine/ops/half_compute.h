// Computing float16 and bfloat16 tensors in float32 (Note [Half precision computes in float32] in
// engine/tensor/half.h, Note [Ops on 16-bit floats] in engine/ops/op_registry.cc).
//
// Errors: those of fn, and of `to`.
// Thread safety: stateless.

#ifndef GRADSERVE_ENGINE_OPS_HALF_COMPUTE_H_
#define GRADSERVE_ENGINE_OPS_HALF_COMPUTE_H_

#include <utility>

#include "engine/ops/elementwise.h"
#include "engine/tensor/tensor.h"

namespace gradserve::ops {

// fn(t) for a tensor of any dtype; a float16 or bfloat16 t goes to fn converted to float32 and
// fn's result comes back rounded to t's dtype, both conversions recorded (`to`), so the result
// differentiates as fn does. For the few formulas that must compute on a gradient of a 16-bit
// dtype outside the op registry (expand's sum_to, a strided slice's index_add).
template <typename Fn>
Tensor ComputeInFloat32(const Tensor& t, Fn&& fn) {
  if (!t.defined() || !IsHalfFloating(t.dtype())) return std::forward<Fn>(fn)(t);
  return to(std::forward<Fn>(fn)(to(t, DType::kFloat32)), t.dtype());
}

}  // namespace gradserve::ops

#endif  // GRADSERVE_ENGINE_OPS_HALF_COMPUTE_H_
