#include "engine/tensor/dtype.h"

namespace gradserve {

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kInt64:
      return "int64";
    case DType::kBool:
      return "bool";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
  }
  return "invalid";
}

std::optional<DType> ParseDType(absl::string_view name) {
  if (name == "float32" || name == "float") return DType::kFloat32;
  if (name == "float64" || name == "double") return DType::kFloat64;
  if (name == "int64" || name == "long") return DType::kInt64;
  if (name == "bool") return DType::kBool;
  if (name == "float16" || name == "half") return DType::kFloat16;
  if (name == "bfloat16") return DType::kBFloat16;
  return std::nullopt;
}

}  // namespace gradserve
