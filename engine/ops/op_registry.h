// The op registry: every op a graph may name, with its schema and how to run it.

#ifndef GRADSERVE_ENGINE_OPS_OP_REGISTRY_H_
#define GRADSERVE_ENGINE_OPS_OP_REGISTRY_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "engine/ops/attributes.h"
#include "engine/tensor/tensor.h"

namespace gradserve::ops {

struct AttrSpec {
  std::string name;
  AttrType type;
  bool required = false;
  std::string doc;  // one line, including the default when not required
  // Strings accepted instead of a value of `type` (conv2d's padding: "valid", "same"); any
  // other string is refused by validation.
  std::vector<std::string> keywords = {};
};

struct OpSchema {
  std::string name;  // PyTorch's name: "add", "log_softmax", ...
  std::string doc;   // one line
  // PyTorch's equivalent ("torch.add", "torch.nn.functional.conv2d", "Tensor.to"), for server
  // info and docs/ops.md. Seal() fills it from Note [PyTorch equivalents] when an op leaves it
  // empty; nothing on a request's path reads it.
  std::string torch = {};
  // Input names in order (PyTorch's argument names: "input", "other", "weight", ...). If
  // variadic, the op takes one or more inputs (cat, stack) and input_names has one entry.
  std::vector<std::string> input_names;
  bool variadic = false;
  // How many of the trailing inputs may be left out (layer_norm's weight and bias, conv2d's
  // bias).
  int optional_inputs = 0;
  int num_outputs = 1;
  // Writes its result into its first input and returns it (add_, relu_, copy_, ...: Note
  // [In-place ops] in engine/ops/inplace.h). A graph may leave its output unnamed: the first
  // input's name then refers to the written tensor (Note [Graph values] in engine/graph/graph.h).
  bool in_place = false;
  std::vector<AttrSpec> attrs;
  // The dtypes the op accepts for its tensor inputs, as a summary for server info.
  std::vector<DType> dtypes;
  // Runs the op with autograd recording (when grad mode is on). The caller has checked the
  // input count and that no attribute is unknown; the op checks everything else and throws
  // StatusError(INVALID_ARGUMENT) with a message that names the argument and shapes involved.
  std::function<TensorList(const TensorList& inputs, const Attrs& attrs)> run;
};

// Thread safety: filled once on first use; read-only afterwards.
class OpRegistry {
 public:
  static const OpRegistry& Get();

  // Null if no op has that name.
  const OpSchema* Find(absl::string_view name) const;
  // All ops, sorted by name.
  const std::vector<OpSchema>& ops() const { return ops_; }

  void Add(OpSchema schema);

 private:
  // Sorts the ops and builds by_name_; once, after every Add.
  void Seal();

  std::vector<OpSchema> ops_;
  // Find's index: every request looks up each of its ops by name, twice (validation and the
  // run). Keys view ops_'s names, which do not move once sealed.
  absl::flat_hash_map<absl::string_view, const OpSchema*> by_name_;
};

// The ops that compute float16 and bfloat16 tensors themselves rather than in float32 copies
// (Note [Ops on 16-bit floats] in op_registry.cc), for the test that checks each of them.
absl::Span<const absl::string_view> OpsComputing16Bit();

// Each op family registers itself from its own file.
void RegisterElementwiseOps(OpRegistry& registry);
void RegisterReductionOps(OpRegistry& registry);
void RegisterLinalgOps(OpRegistry& registry);
void RegisterShapeOps(OpRegistry& registry);
void RegisterNNOps(OpRegistry& registry);
// The ops real models need beside those (model_ops_registry.cc).
void RegisterModelOps(OpRegistry& registry);

}  // namespace gradserve::ops

#endif  // GRADSERVE_ENGINE_OPS_OP_REGISTRY_H_
