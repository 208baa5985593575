// Element types of a Tensor.
//
// float32, float64, float16 and bfloat16 are differentiable; int64 and bool serve as indices,
// targets and masks. float16 and bfloat16 are stored in 16 bits and computed in float32 (Note
// [Half precision computes in float32] in engine/tensor/half.h).

#ifndef GRADSERVE_ENGINE_TENSOR_DTYPE_H_
#define GRADSERVE_ENGINE_TENSOR_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>

#include "absl/strings/string_view.h"
#include "engine/tensor/half.h"
#include "engine/util/status_error.h"

namespace gradserve {

// The values are stable: they index tables and travel in the dispatcher's switches.
enum class DType : uint8_t { kFloat32, kFloat64, kInt64, kBool, kFloat16, kBFloat16 };

// Size in bytes of one element.
constexpr size_t ElementSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat64:
      return 8;
    case DType::kInt64:
      return 8;
    case DType::kBool:
      return 1;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
  }
  return 0;
}

// True for the dtypes gradients can flow through.
constexpr bool IsFloating(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat64 || dtype == DType::kFloat16 ||
         dtype == DType::kBFloat16;
}

// True for float16 and bfloat16, which ops compute in float32.
constexpr bool IsHalfFloating(DType dtype) {
  return dtype == DType::kFloat16 || dtype == DType::kBFloat16;
}

// "float32", "float64", "int64", "bool", "float16", "bfloat16": PyTorch's names.
const char* DTypeName(DType dtype);

// Parses a name given by DTypeName (also "float", "double", "long", "half").
std::optional<DType> ParseDType(absl::string_view name);

// The C++ type of each dtype, for kernels.
template <DType D>
struct DTypeTraits;
template <>
struct DTypeTraits<DType::kFloat32> {
  using type = float;
};
template <>
struct DTypeTraits<DType::kFloat64> {
  using type = double;
};
template <>
struct DTypeTraits<DType::kInt64> {
  using type = int64_t;
};
template <>
struct DTypeTraits<DType::kBool> {
  using type = bool;
};
template <>
struct DTypeTraits<DType::kFloat16> {
  using type = Half;
};
template <>
struct DTypeTraits<DType::kBFloat16> {
  using type = BFloat16;
};

// Calls fn(Half{}) for float16 and fn(BFloat16{}) for bfloat16; the caller has checked that
// dtype is one of them (IsHalfFloating).
template <typename Fn>
decltype(auto) DispatchHalf(DType dtype, Fn&& fn) {
  if (dtype == DType::kFloat16) return fn(Half{});
  return fn(BFloat16{});
}

namespace dtype_internal {

// The switch of DispatchStorage (k16Bit) and DispatchDType: fn is instantiated for Half and
// BFloat16 only with k16Bit.
template <bool k16Bit, typename Fn>
decltype(auto) Dispatch(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32:
      return fn(float{});
    case DType::kFloat64:
      return fn(double{});
    case DType::kInt64:
      return fn(int64_t{});
    case DType::kFloat16:
    case DType::kBFloat16:
      if constexpr (k16Bit) {
        return DispatchHalf(dtype, fn);
      } else {
        GS_CHECK_INTERNAL(false, "a 16-bit float reached a float32 kernel");
      }
      break;
    case DType::kBool:
      break;
  }
  return fn(bool{});
}

}  // namespace dtype_internal

// Calls fn with a value of the C++ element type of dtype (float, double, int64_t, bool, Half or
// BFloat16), e.g.
//   DispatchStorage(t.dtype(), [&](auto tag) { using T = decltype(tag); ... });
// For the kernels that read and write every dtype: copies, fills, accumulation.
template <typename Fn>
decltype(auto) DispatchStorage(DType dtype, Fn&& fn) {
  return dtype_internal::Dispatch<true>(dtype, std::forward<Fn>(fn));
}

// As DispatchStorage for the compute dtypes (float32, float64, int64, bool), which the ops'
// kernels are written for. float16 and bfloat16 reach them only where an op reads and writes
// 16 bits itself (Note [Half precision computes in float32]): one that does here is a bug,
// refused as INTERNAL rather than read as another type.
template <typename Fn>
decltype(auto) DispatchDType(DType dtype, Fn&& fn) {
  return dtype_internal::Dispatch<false>(dtype, std::forward<Fn>(fn));
}

// As DispatchDType, for float32 and float64 only; other dtypes are the caller's error to check
// first (INTERNAL here).
template <typename Fn>
decltype(auto) DispatchFloating(DType dtype, Fn&& fn) {
  if (dtype == DType::kFloat32) return fn(float{});
  GS_CHECK_INTERNAL(dtype == DType::kFloat64, "a dtype other than float32 or float64 reached",
                    " a floating kernel");
  return fn(double{});
}

}  // namespace gradserve

#endif  // GRADSERVE_ENGINE_TENSOR_DTYPE_H_
