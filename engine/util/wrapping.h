// Integer arithmetic on tensor values that wraps around on overflow, as PyTorch's integer
// tensors do, without C++'s undefined behaviour for a signed overflow.
//
// Note [Integer tensors wrap around]
// PyTorch computes int64 tensors in two's complement: -torch.tensor([-2**63]) is -2**63 again,
// and an int64 matmul whose sums pass 2**63 gives them modulo 2**64. In C++ a signed overflow is
// undefined behaviour, which UBSan reports and an optimizer may exploit, so the kernels that
// compute integer values do it in the unsigned type of the same width, where arithmetic is
// modulo 2**64 by definition, and convert back (modular since C++20). For floating types and
// bool these are the plain operators, so float kernels compile exactly as before. The request
// fuzzer found the first two (negation and matmul, docs/fuzzing.md); the other integer kernels
// (add, mul, sum, ...) are to follow.

#ifndef GRADSERVE_ENGINE_UTIL_WRAPPING_H_
#define GRADSERVE_ENGINE_UTIL_WRAPPING_H_

#include <type_traits>

#include "engine/util/host_device.h"

namespace gradserve {

template <typename T>
inline constexpr bool kWrapsAround = std::is_integral_v<T>&& std::is_signed_v<T>;

// -v.
template <typename T>
GS_HOST_DEVICE constexpr T WrapNeg(T v) {
  if constexpr (kWrapsAround<T>) {
    return static_cast<T>(std::make_unsigned_t<T>(0) - static_cast<std::make_unsigned_t<T>>(v));
  } else {
    return -v;
  }
}

// acc + a * b.
template <typename T>
GS_HOST_DEVICE constexpr T WrapMulAdd(T acc, T a, T b) {
  if constexpr (kWrapsAround<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(acc) + static_cast<U>(a) * static_cast<U>(b));
  } else {
    return acc + a * b;
  }
}

}  // namespace gradserve

#endif  // GRADSERVE_ENGINE_UTIL_WRAPPING_H_
