// Half and BFloat16: the storage types of the float16 and bfloat16 dtypes.
//
// Each is 16 bits that convert to and from float, as c10::Half and c10::BFloat16 do: float to
// Half or BFloat16 rounds to nearest, ties to even, with overflow to infinity and NaN kept a
// (quiet) NaN; back to float is exact. Arithmetic on them is float arithmetic: `a + b` is a
// float, and assigning it back rounds once. The same code runs on the host and in CUDA kernels.
//
// Note [Half precision computes in float32]
// gradserve stores float16 and bfloat16 tensors in 16 bits and computes with them in float32, as
// PyTorch's kernels do with their "opmath" type: an op reads its 16-bit inputs as float32,
// computes and accumulates in float32, and rounds its result to 16 bits once. Most ops get this
// from the op registry, which converts their 16-bit inputs to float32 and their results back
// (Note [Ops on 16-bit floats] in engine/ops/op_registry.cc). The elementwise maps and the sum
// read and write 16 bits around float32 arithmetic themselves (Note [16-bit elementwise
// kernels] in engine/ops/elementwise.cc), as do the basic kernels (fill, copy, accumulate, the
// NaN check), which the Engine runs on gradients of any dtype.
//
// Thread safety: plain values.

#ifndef GRADSERVE_ENGINE_TENSOR_HALF_H_
#define GRADSERVE_ENGINE_TENSOR_HALF_H_

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "engine/util/host_device.h"

namespace gradserve {

namespace half_internal {

GS_HOST_DEVICE inline uint32_t FloatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
#endif
}

GS_HOST_DEVICE inline float BitsToFloat(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

// IEEE 754 binary16: 1 sign bit, 5 exponent bits (bias 15), 10 mantissa bits.
GS_HOST_DEVICE inline uint16_t FloatToHalfBits(float f) {
  const uint32_t x = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) {  // infinity, or NaN (kept quiet)
    return sign | (abs > 0x7F800000u ? 0x7E00u : 0x7C00u);
  }
  if (abs >= 0x477FF000u) return sign | 0x7C00u;  // 65520 and above round to infinity
  const uint32_t exponent = abs >> 23;
  if (exponent < 113) {               // below 2^-14: a subnormal half, or zero
    if (exponent < 102) return sign;  // below 2^-25: rounds to zero
    const uint32_t mantissa = (abs & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126 - exponent;  // 14 to 24
    uint32_t m = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (m & 1u))) ++m;  // 1024 is the least normal
    return sign | static_cast<uint16_t>(m);
  }
  uint32_t bits = ((exponent - 112) << 10) | ((abs & 0x7FFFFFu) >> 13);
  const uint32_t rest = abs & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (bits & 1u))) ++bits;  // may carry into the exponent
  return sign | static_cast<uint16_t>(bits);
}

GS_HOST_DEVICE inline float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  const uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0x1F) return BitsToFloat(sign | 0x7F800000u | (mantissa << 13));
  if (exponent == 0) {
    // mantissa * 2^-24, exact in float.
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign != 0 ? -magnitude : magnitude;
  }
  return BitsToFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

// bfloat16: the upper 16 bits of a float, rounded to nearest even.
GS_HOST_DEVICE inline uint16_t FloatToBFloat16Bits(float f) {
  const uint32_t x = FloatBits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

GS_HOST_DEVICE inline float BFloat16BitsToFloat(uint16_t b) {
  return BitsToFloat(static_cast<uint32_t>(b) << 16);
}

}  // namespace half_internal

struct Half {
  uint16_t bits;  // uninitialized by default, as a float is

  Half() = default;
  GS_HOST_DEVICE Half(float value)  // NOLINT(google-explicit-constructor): as c10::Half
      : bits(half_internal::FloatToHalfBits(value)) {}
  GS_HOST_DEVICE operator float() const {  // NOLINT(google-explicit-constructor)
    return half_internal::HalfBitsToFloat(bits);
  }
  GS_HOST_DEVICE Half& operator+=(float other) { return *this = Half(float(*this) + other); }

  static Half FromBits(uint16_t b) {
    Half h;
    h.bits = b;
    return h;
  }
};

struct BFloat16 {
  uint16_t bits;

  BFloat16() = default;
  GS_HOST_DEVICE BFloat16(float value)  // NOLINT(google-explicit-constructor)
      : bits(half_internal::FloatToBFloat16Bits(value)) {}
  GS_HOST_DEVICE operator float() const {  // NOLINT(google-explicit-constructor)
    return half_internal::BFloat16BitsToFloat(bits);
  }
  GS_HOST_DEVICE BFloat16& operator+=(float other) {
    return *this = BFloat16(float(*this) + other);
  }

  static BFloat16 FromBits(uint16_t b) {
    BFloat16 h;
    h.bits = b;
    return h;
  }
};

static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2);
static_assert(std::is_trivial_v<Half> && std::is_trivial_v<BFloat16>);

// True for Half and BFloat16.
template <typename T>
inline constexpr bool kIsHalfType = false;
template <>
inline constexpr bool kIsHalfType<Half> = true;
template <>
inline constexpr bool kIsHalfType<BFloat16> = true;

}  // namespace gradserve

#endif  // GRADSERVE_ENGINE_TENSOR_HALF_H_
