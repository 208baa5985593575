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
// fuzzer found the first two (negation and matmul, docs/fuzzing.md); the rest (add, sub, mul,
// sums, cumsum, ...) were found by IntegerWrapTest in tests/engine/integer_wrap_test.cc,
// which gives every op that takes int64 the extremes. Scalars from a request (add's alpha) are
// doubles: an integer op checks them against int64's range before converting.

#ifndef GRADSERVE_ENGINE_UTIL_WRAPPING_H_
#define GRADSERVE_ENGINE_UTIL_WRAPPING_H_

#include <limits>
#include <type_traits>

#include "engine/util/host_device.h"

namespace gradserve {

template <typename T>
inline constexpr bool kWrapsAround = std::is_integral_v<T>&& std::is_signed_v<T>;

// a + b.
template <typename T>
GS_HOST_DEVICE constexpr T WrapAdd(T a, T b) {
  if constexpr (kWrapsAround<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}

// a * b.
template <typename T>
GS_HOST_DEVICE constexpr T WrapMul(T a, T b) {
  if constexpr (kWrapsAround<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
  } else {
    return a * b;
  }
}

// -v.
template <typename T>
GS_HOST_DEVICE constexpr T WrapNeg(T v) {
  if constexpr (kWrapsAround<T>) {
    return static_cast<T>(std::make_unsigned_t<T>(0) - static_cast<std::make_unsigned_t<T>>(v));
  } else {
    return -v;
  }
}

// An integral double of magnitude below 2**64 as T, modulo 2**64 for an integer T (a scalar
// from a request, already checked: converting a double outside T's range is undefined).
template <typename T>
GS_HOST_DEVICE constexpr T WrapFromDouble(double v) {
  if constexpr (kWrapsAround<T>) {
    using U = std::make_unsigned_t<T>;
    return v < 0 ? WrapNeg(static_cast<T>(static_cast<U>(-v))) : static_cast<T>(static_cast<U>(v));
  } else {
    return static_cast<T>(v);
  }
}

// A floating v as the integer type To, as the x86 instruction PyTorch's CPU kernels compile to
// gives it: truncated toward zero, and To's minimum for NaN and for a value outside To's range
// (torch.tensor([1e300]).long() is -2**63), where C++'s conversion is undefined.
template <typename To, typename From>
GS_HOST_DEVICE constexpr To TruncateToInteger(From v) {
  static_assert(std::is_integral_v<To> && std::is_signed_v<To> && std::is_floating_point_v<From>);
  constexpr From kLimit = From(std::numeric_limits<To>::max()) + From(1);  // 2**(bits-1), exact
  return v >= -kLimit && v < kLimit ? static_cast<To>(v) : std::numeric_limits<To>::min();
}

// acc + a * b.
template <typename T>
GS_HOST_DEVICE constexpr T WrapMulAdd(T acc, T a, T b) {
  return WrapAdd(acc, WrapMul(a, b));
}

}  // namespace gradserve

#endif  // GRADSERVE_ENGINE_UTIL_WRAPPING_H_
