// Op attributes: the named, typed arguments of an op that are not tensors (dim, keepdim, ...).

#ifndef GRADSERVE_ENGINE_OPS_ATTRIBUTES_H_
#define GRADSERVE_ENGINE_OPS_ATTRIBUTES_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace gradserve::ops {

using AttrValue = std::variant<int64_t, double, bool, std::string, std::vector<int64_t>,
                               std::vector<double>, std::vector<std::string>>;
enum class AttrType { kInt, kFloat, kBool, kString, kInts, kFloats, kStrings };

const char* AttrTypeName(AttrType type);
AttrType TypeOf(const AttrValue& value);

// The attributes of one op, by name. An ordered map so that iteration (and so error messages
// and hashing) is deterministic.
//
// The getters throw StatusError(INVALID_ARGUMENT) naming the attribute when it is missing (and
// no default is given) or of another type. An int is accepted where a float is wanted, and a
// single int where a list of ints is wanted, as PyTorch does.
class Attrs {
 public:
  Attrs() = default;
  explicit Attrs(std::map<std::string, AttrValue> values) : values_(std::move(values)) {}

  bool has(const std::string& name) const { return values_.count(name) > 0; }
  void set(const std::string& name, AttrValue value) { values_[name] = std::move(value); }
  const std::map<std::string, AttrValue>& values() const { return values_; }

  int64_t GetInt(const std::string& name) const;
  int64_t GetInt(const std::string& name, int64_t default_value) const;
  double GetFloat(const std::string& name) const;
  double GetFloat(const std::string& name, double default_value) const;
  // Optional float (clamp's min and max): nullopt if absent.
  std::optional<double> GetOptionalFloat(const std::string& name) const;
  bool GetBool(const std::string& name, bool default_value) const;
  std::string GetString(const std::string& name) const;
  std::string GetString(const std::string& name, const std::string& default_value) const;
  std::vector<int64_t> GetInts(const std::string& name) const;
  std::vector<int64_t> GetInts(const std::string& name, std::vector<int64_t> default_value) const;
  std::vector<double> GetFloats(const std::string& name) const;
  std::vector<std::string> GetStrings(const std::string& name) const;
  std::vector<std::string> GetStrings(const std::string& name,
                                      std::vector<std::string> default_value) const;

 private:
  const AttrValue* Find(const std::string& name) const;
  std::map<std::string, AttrValue> values_;
};

}  // namespace gradserve::ops

#endif  // GRADSERVE_ENGINE_OPS_ATTRIBUTES_H_
