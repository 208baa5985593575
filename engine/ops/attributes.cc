#include "engine/ops/attributes.h"

#include "absl/strings/str_cat.h"
#include "engine/util/status_error.h"

namespace gradserve::ops {

const char* AttrTypeName(AttrType type) {
  switch (type) {
    case AttrType::kInt:
      return "int";
    case AttrType::kFloat:
      return "float";
    case AttrType::kBool:
      return "bool";
    case AttrType::kString:
      return "string";
    case AttrType::kInts:
      return "int list";
    case AttrType::kFloats:
      return "float list";
    case AttrType::kStrings:
      return "string list";
  }
  return "invalid";
}

AttrType TypeOf(const AttrValue& value) { return static_cast<AttrType>(value.index()); }

namespace {
[[noreturn]] void WrongType(const std::string& name, AttrType want, const AttrValue& got) {
  ThrowStatus(absl::InvalidArgumentError(absl::StrCat(
      "attribute '", name, "' must be ", AttrTypeName(want), ", got ", AttrTypeName(TypeOf(got)))));
}
[[noreturn]] void Missing(const std::string& name) {
  ThrowStatus(absl::InvalidArgumentError(absl::StrCat("missing required attribute '", name, "'")));
}
}  // namespace

const AttrValue* Attrs::Find(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? nullptr : &it->second;
}

int64_t Attrs::GetInt(const std::string& name) const {
  const AttrValue* v = Find(name);
  if (v == nullptr) Missing(name);
  if (const auto* i = std::get_if<int64_t>(v)) return *i;
  WrongType(name, AttrType::kInt, *v);
}

int64_t Attrs::GetInt(const std::string& name, int64_t default_value) const {
  return has(name) ? GetInt(name) : default_value;
}

double Attrs::GetFloat(const std::string& name) const {
  const AttrValue* v = Find(name);
  if (v == nullptr) Missing(name);
  if (const auto* d = std::get_if<double>(v)) return *d;
  if (const auto* i = std::get_if<int64_t>(v)) return static_cast<double>(*i);
  WrongType(name, AttrType::kFloat, *v);
}

double Attrs::GetFloat(const std::string& name, double default_value) const {
  return has(name) ? GetFloat(name) : default_value;
}

std::optional<double> Attrs::GetOptionalFloat(const std::string& name) const {
  if (!has(name)) return std::nullopt;
  return GetFloat(name);
}

bool Attrs::GetBool(const std::string& name, bool default_value) const {
  const AttrValue* v = Find(name);
  if (v == nullptr) return default_value;
  if (const auto* b = std::get_if<bool>(v)) return *b;
  WrongType(name, AttrType::kBool, *v);
}

std::string Attrs::GetString(const std::string& name) const {
  const AttrValue* v = Find(name);
  if (v == nullptr) Missing(name);
  if (const auto* s = std::get_if<std::string>(v)) return *s;
  WrongType(name, AttrType::kString, *v);
}

std::string Attrs::GetString(const std::string& name, const std::string& default_value) const {
  return has(name) ? GetString(name) : default_value;
}

std::vector<int64_t> Attrs::GetInts(const std::string& name) const {
  const AttrValue* v = Find(name);
  if (v == nullptr) Missing(name);
  if (const auto* l = std::get_if<std::vector<int64_t>>(v)) return *l;
  if (const auto* i = std::get_if<int64_t>(v)) return {*i};
  WrongType(name, AttrType::kInts, *v);
}

std::vector<int64_t> Attrs::GetInts(const std::string& name,
                                    std::vector<int64_t> default_value) const {
  return has(name) ? GetInts(name) : default_value;
}

std::vector<double> Attrs::GetFloats(const std::string& name) const {
  const AttrValue* v = Find(name);
  if (v == nullptr) Missing(name);
  if (const auto* l = std::get_if<std::vector<double>>(v)) return *l;
  if (const auto* l = std::get_if<std::vector<int64_t>>(v)) {
    return std::vector<double>(l->begin(), l->end());
  }
  WrongType(name, AttrType::kFloats, *v);
}

std::vector<std::string> Attrs::GetStrings(const std::string& name) const {
  const AttrValue* v = Find(name);
  if (v == nullptr) Missing(name);
  if (const auto* l = std::get_if<std::vector<std::string>>(v)) return *l;
  if (const auto* s = std::get_if<std::string>(v)) return {*s};
  WrongType(name, AttrType::kStrings, *v);
}

std::vector<std::string> Attrs::GetStrings(const std::string& name,
                                           std::vector<std::string> default_value) const {
  return has(name) ? GetStrings(name) : default_value;
}

}  // namespace gradserve::ops
