// Functors shared by several ops' kernels (Note [Kernels for every device]): structs whose
// operator() runs on the host and on GPUs. An op's own functors live beside the op.

#ifndef GRADSERVE_ENGINE_KERNELS_FUNCTORS_H_
#define GRADSERVE_ENGINE_KERNELS_FUNCTORS_H_

#include <type_traits>

#include "engine/tensor/half.h"
#include "engine/util/host_device.h"
#include "engine/util/wrapping.h"

namespace gradserve::ops {

// Defines struct Name, a functor whose operator() returns `expr` of its argument v (of any
// element type T): the one-line forward formulas of the unary ops.
#define GS_UNARY_FUNCTOR(Name, expr)         \
  struct Name {                              \
    template <typename T>                    \
    GS_HOST_DEVICE T operator()(T v) const { \
      return expr;                           \
    }                                        \
  }

// acc + v in the accumulator's type: sums (ReduceKernel's combine).
template <typename Acc>
struct SumInto {
  template <typename V>
  GS_HOST_DEVICE Acc operator()(Acc acc, V v) const {
    return WrapAdd(acc, static_cast<Acc>(v));  // Note [Integer tensors wrap around]
  }
};

// v converted to To: a cast (MapKernel), or a sum's finalize.
template <typename To>
struct CastTo {
  template <typename V>
  GS_HOST_DEVICE To operator()(V v) const {
    if constexpr (kIsHalfType<V>) {
      return (*this)(static_cast<float>(v));  // through float, as any 16-bit float is read
    } else if constexpr (kIsHalfType<To>) {
      return To(static_cast<float>(v));
    } else if constexpr (kWrapsAround<To> && std::is_floating_point_v<V>) {
      return TruncateToInteger<To>(v);  // Note [Integer tensors wrap around]
    } else {
      return static_cast<To>(v);
    }
  }
};

// a / b: div's kernel, and amax's backward splitting a gradient among ties.
struct Divide {
  template <typename T>
  GS_HOST_DEVICE T operator()(T a, T b) const {
    return a / b;
  }
};

}  // namespace gradserve::ops

#endif  // GRADSERVE_ENGINE_KERNELS_FUNCTORS_H_
