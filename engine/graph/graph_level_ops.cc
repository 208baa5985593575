#include "engine/graph/graph_level_ops.h"

#include <string>
#include <vector>

namespace gradserve::graph {
namespace {

using ops::AttrSpec;
using ops::AttrType;
using ops::OpSchema;

const std::vector<DType> kFloating = {DType::kFloat32, DType::kFloat64};

std::vector<OpSchema> MakeSchemas() {
  std::vector<OpSchema> schemas(4);

  OpSchema& grad = schemas[0];
  grad.name = std::string(kGradOp);
  grad.doc = "torch.autograd.grad inside the graph: the gradients of the inputs (roots)";
  grad.torch = "torch.autograd.grad";
  grad.input_names = {"outputs"};
  grad.variadic = true;
  grad.num_outputs = -1;
  grad.attrs = {
      {"wrt", AttrType::kStrings, true, "the values to differentiate with respect to"},
      {"grad_outputs", AttrType::kStrings, false,
       "one seed value per root; default: ones (one-element roots only)"},
      {"create_graph", AttrType::kBool, false, "record the gradients' history; default true"},
      {"retain_graph", AttrType::kBool, false, "keep the saved tensors; default true"},
      {"allow_unused", AttrType::kBool, false,
       "an unreached wrt gets an undefined gradient instead of an error; default false"},
      {"materialize_grads", AttrType::kBool, false,
       "an unreached wrt gets zeros (implies allow_unused); default false"},
  };
  grad.dtypes = kFloating;

  OpSchema& checkpoint = schemas[1];
  checkpoint.name = std::string(kCheckpointOp);
  checkpoint.doc = "runs its body without saving anything; backward recomputes it";
  checkpoint.torch = "torch.utils.checkpoint.checkpoint";
  checkpoint.input_names = {"inputs"};
  checkpoint.variadic = true;
  checkpoint.num_outputs = -1;
  checkpoint.dtypes = {DType::kFloat32, DType::kFloat64, DType::kInt64, DType::kBool};

  OpSchema& hook = schemas[2];
  hook.name = std::string(kHookOp);
  hook.doc = "changes the gradient that flows into its input during every later backward";
  hook.torch = "Tensor.register_hook";
  hook.input_names = {"input"};
  hook.num_outputs = 0;
  hook.attrs = {
      {"kind", AttrType::kString, true, "scale, clamp, zero or nan_to_num"},
      {"factor", AttrType::kFloat, false, "scale: the factor (required)"},
      {"min", AttrType::kFloat, false, "clamp: the lower bound; default none"},
      {"max", AttrType::kFloat, false, "clamp: the upper bound; default none"},
      {"nan", AttrType::kFloat, false, "nan_to_num: replaces NaN; default 0"},
      {"posinf", AttrType::kFloat, false,
       "nan_to_num: replaces +inf; default the dtype's largest finite value"},
      {"neginf", AttrType::kFloat, false,
       "nan_to_num: replaces -inf; default the dtype's lowest finite value"},
  };
  hook.dtypes = kFloating;

  OpSchema& detach = schemas[3];
  detach.name = std::string(kDetachOp);
  detach.doc = "the same data with no history";
  detach.torch = "Tensor.detach";
  detach.input_names = {"input"};
  detach.dtypes = checkpoint.dtypes;
  return schemas;
}

}  // namespace

const ops::OpSchema* FindGraphLevelOp(absl::string_view name) {
  static const std::vector<OpSchema>* const schemas = new std::vector<OpSchema>(MakeSchemas());
  for (const OpSchema& schema : *schemas) {
    if (schema.name == name) return &schema;
  }
  return nullptr;
}

const ops::OpSchema* FindOpSchema(absl::string_view name) {
  if (const OpSchema* schema = FindGraphLevelOp(name)) return schema;
  return ops::OpRegistry::Get().Find(name);
}

}  // namespace gradserve::graph
