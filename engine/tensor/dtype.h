// Element types of a Tensor.
//
// float32 and float64 are differentiable; int64 and bool serve as indices, targets and masks.

#ifndef GRADSERVE_ENGINE_TENSOR_DTYPE_H_
#define GRADSERVE_ENGINE_TENSOR_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <optional>

#include "absl/strings/string_view.h"

namespace gradserve {

enum class DType : uint8_t { kFloat32, kFloat64, kInt64, kBool };

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
  }
  return 0;
}

// True for the dtypes gradients can flow through.
constexpr bool IsFloating(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat64;
}

// "float32", "float64", "int64", "bool": PyTorch's names.
const char* DTypeName(DType dtype);

// Parses a name given by DTypeName (also "float", "double", "long").
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

// Calls fn with a value of the C++ element type (float, double, int64_t or bool) for dtype, e.g.
//   DispatchDType(t.dtype(), [&](auto tag) { using T = decltype(tag); ... });
template <typename Fn>
decltype(auto) DispatchDType(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32:
      return fn(float{});
    case DType::kFloat64:
      return fn(double{});
    case DType::kInt64:
      return fn(int64_t{});
    case DType::kBool:
      break;
  }
  return fn(bool{});
}

// As DispatchDType, for the floating dtypes only; other dtypes are the caller's error to check
// first (they dispatch as float64).
template <typename Fn>
decltype(auto) DispatchFloating(DType dtype, Fn&& fn) {
  if (dtype == DType::kFloat32) return fn(float{});
  return fn(double{});
}

}  // namespace gradserve

#endif  // GRADSERVE_ENGINE_TENSOR_DTYPE_H_
