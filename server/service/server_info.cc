#include "server/service/server_info.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/device/device_registry.h"
#include "engine/ops/op_registry.h"
#include "server/wire/wire.h"

#ifndef GRADSERVE_VERSION
#define GRADSERVE_VERSION "unknown"
#endif

namespace gradserve::server {
namespace {

void AddAttr(v1::OpInfo* op, const char* name, ops::AttrType type, bool required, const char* doc) {
  v1::AttrInfo* a = op->add_attrs();
  a->set_name(name);
  a->set_type(ops::AttrTypeName(type));
  a->set_required(required);
  a->set_doc(doc);
}

v1::OpInfo* AddGraphOp(v1::ServerInfo* info, const char* name, const char* torch, const char* doc,
                       std::vector<const char*> inputs, bool variadic, int num_outputs) {
  v1::OpInfo* op = info->add_ops();
  op->set_name(name);
  op->set_torch(torch);
  op->set_doc(doc);
  for (const char* input : inputs) op->add_inputs(input);
  op->set_variadic(variadic);
  op->set_num_outputs(num_outputs);
  op->add_dtypes(v1::DTYPE_FLOAT32);
  op->add_dtypes(v1::DTYPE_FLOAT64);
  op->add_dtypes(v1::DTYPE_FLOAT16);
  op->add_dtypes(v1::DTYPE_BFLOAT16);
  return op;
}

// The ops with graph-level meaning, as engine/graph/graph.h's Note [Graph values] defines them.
void AddGraphOps(v1::ServerInfo* info) {
  using ops::AttrType;
  v1::OpInfo* grad = AddGraphOp(info, "grad", "torch.autograd.grad",
                                "torch.autograd.grad inside the graph: gradients of the roots "
                                "(inputs) with respect to wrt, one output per wrt",
                                {"roots"}, true, -1);
  AddAttr(grad, "wrt", AttrType::kStrings, true, "values to differentiate with respect to");
  AddAttr(grad, "grad_outputs", AttrType::kStrings, false, "seed value per root (default: ones)");
  AddAttr(grad, "create_graph", AttrType::kBool, false, "record the backward (default true)");
  AddAttr(grad, "retain_graph", AttrType::kBool, false, "keep saved tensors (default true)");
  AddAttr(grad, "allow_unused", AttrType::kBool, false, "default false");
  AddAttr(grad, "materialize_grads", AttrType::kBool, false, "default false");

  AddGraphOp(info, "checkpoint", "torch.utils.checkpoint.checkpoint",
             "runs Op.body without saving tensors; its backward recomputes it (inputs bound to "
             "body.inputs, outputs to body.outputs)",
             {"inputs"}, true, -1);

  v1::OpInfo* hook = AddGraphOp(info, "hook", "Tensor.register_hook",
                                "changes the gradient flowing into its input in every later "
                                "backward; no outputs",
                                {"input"}, false, 0);
  AddAttr(hook, "kind", AttrType::kString, true, "scale, clamp, zero or nan_to_num");
  AddAttr(hook, "factor", AttrType::kFloat, false, "scale: the factor");
  AddAttr(hook, "min", AttrType::kFloat, false, "clamp: lower bound (optional)");
  AddAttr(hook, "max", AttrType::kFloat, false, "clamp: upper bound (optional)");
  AddAttr(hook, "nan", AttrType::kFloat, false, "nan_to_num: replacement for NaN (default 0)");
  AddAttr(hook, "posinf", AttrType::kFloat, false, "nan_to_num: replacement for +inf");
  AddAttr(hook, "neginf", AttrType::kFloat, false, "nan_to_num: replacement for -inf");

  AddGraphOp(info, "detach", "Tensor.detach", "the same data with no autograd history", {"input"},
             false, 1);
}

}  // namespace

const char* ServerVersion() { return GRADSERVE_VERSION; }

v1::ServerInfo DescribeServer(const ServerOptions& options) {
  v1::ServerInfo info;
  info.set_version(ServerVersion());

  v1::Limits* l = info.mutable_limits();
  l->set_max_message_bytes(options.max_message_bytes);
  l->set_max_request_bytes(options.max_request_bytes);
  l->set_max_ops(options.limits.max_ops);
  l->set_max_leaves(options.limits.max_leaves);
  l->set_max_tensor_elements(options.limits.max_tensor_elements);
  l->set_max_memory_bytes(options.limits.max_memory_bytes);
  l->set_max_nesting(options.limits.max_nesting);
  l->set_max_backward_calls(options.limits.max_backward_calls);
  l->set_max_name_bytes(options.limits.max_name_bytes);
  l->set_max_in_flight(options.max_in_flight);
  l->set_chunk_bytes(options.chunk_bytes);
  l->set_max_sessions_per_tenant(options.max_sessions_per_tenant);
  l->set_session_idle_ttl_ms(absl::ToInt64Milliseconds(options.session_idle_ttl));
  l->set_shared_memory_prefix(options.shared_memory.prefix);
  l->set_max_shared_memory_regions(options.shared_memory.max_per_tenant);
  l->set_shared_memory_idle_ttl_ms(absl::ToInt64Milliseconds(options.shared_memory.idle_ttl));

  const DeviceRegistry& devices = DeviceRegistry::Get();
  for (Device device : devices.devices()) {
    v1::DeviceInfo* d = info.add_devices();
    d->set_name(DeviceName(device));
    if (DeviceBackend* backend = devices.backend(device.type)) {
      d->set_description(backend->Describe(device.index));
    } else if (device.is_cpu()) {
      d->set_description("host CPU");
    }
  }

  for (const ops::OpSchema& schema : ops::OpRegistry::Get().ops()) {
    v1::OpInfo* op = info.add_ops();
    op->set_name(schema.name);
    op->set_torch(schema.torch);
    op->set_doc(schema.doc);
    for (const std::string& input : schema.input_names) op->add_inputs(input);
    op->set_variadic(schema.variadic);
    op->set_optional_inputs(schema.optional_inputs);
    op->set_num_outputs(schema.num_outputs);
    op->set_in_place(schema.in_place);
    for (const ops::AttrSpec& spec : schema.attrs) {
      AddAttr(op, spec.name.c_str(), spec.type, spec.required, spec.doc.c_str());
    }
    for (DType dtype : schema.dtypes) op->add_dtypes(ToProto(dtype));
  }
  AddGraphOps(&info);
  return info;
}

std::string DescribeLimits(const v1::Limits& limits) {
  const google::protobuf::Descriptor* descriptor = limits.GetDescriptor();
  const google::protobuf::Reflection* reflection = limits.GetReflection();
  std::string out;
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* field = descriptor->field(i);
    absl::StrAppend(&out, i == 0 ? "" : " ", field->name(), "=");
    if (field->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_STRING) {
      const std::string value = reflection->GetString(limits, field);
      absl::StrAppend(&out, value.empty() ? "''" : value);  // the operator's flag, not a client's
    } else {
      absl::StrAppend(&out, reflection->GetInt64(limits, field));
    }
  }
  return out;
}

}  // namespace gradserve::server
