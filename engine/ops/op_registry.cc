#include "engine/ops/op_registry.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/ops/device_copy.h"

namespace gradserve::ops {
namespace {

// Note [PyTorch equivalents]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every op names the PyTorch function it reproduces (OpSchema::torch), which server info sends
// and docs/ops.md lists. Most ops are torch.<name>; the ones that live elsewhere in PyTorch
// (torch.nn.functional, Tensor methods) are listed here, so an op family's file need not say
// it; an in-place op (its name ends in '_') is the Tensor method of that name. An op that sets
// OpSchema::torch itself keeps its own. Read once, when the registry is sealed; nothing on a
// request's path reads it.
const absl::flat_hash_map<absl::string_view, absl::string_view>& TorchElsewhere() {
  static const auto* const names = new absl::flat_hash_map<absl::string_view, absl::string_view>{
      {"adaptive_avg_pool2d", "torch.nn.functional.adaptive_avg_pool2d"},
      {"avg_pool2d", "torch.nn.functional.avg_pool2d"},
      {"batch_norm", "torch.nn.functional.batch_norm"},
      {"conv2d", "torch.nn.functional.conv2d"},
      {"cross_entropy", "torch.nn.functional.cross_entropy"},
      {"dropout", "torch.nn.functional.dropout"},
      {"elu", "torch.nn.functional.elu"},
      {"embedding", "torch.nn.functional.embedding"},
      {"expand", "Tensor.expand"},
      {"gelu", "torch.nn.functional.gelu"},
      {"group_norm", "torch.nn.functional.group_norm"},
      {"layer_norm", "torch.nn.functional.layer_norm"},
      {"leaky_relu", "torch.nn.functional.leaky_relu"},
      {"linear", "torch.nn.functional.linear"},
      {"max_pool2d", "torch.nn.functional.max_pool2d"},
      {"mse_loss", "torch.nn.functional.mse_loss"},
      {"nll_loss", "torch.nn.functional.nll_loss"},
      {"scaled_dot_product_attention", "torch.nn.functional.scaled_dot_product_attention"},
      {"silu", "torch.nn.functional.silu"},
      {"slice", "Tensor.__getitem__ (x[..., start:end:step])"},
      {"softplus", "torch.nn.functional.softplus"},
      {"to", "Tensor.to"},
      {"view", "Tensor.view"},
  };
  return *names;
}

}  // namespace

const OpRegistry& OpRegistry::Get() {
  static const OpRegistry* const registry = [] {
    auto* r = new OpRegistry;
    RegisterElementwiseOps(*r);
    RegisterReductionOps(*r);
    RegisterLinalgOps(*r);
    RegisterShapeOps(*r);
    RegisterNNOps(*r);
    RegisterModelOps(*r);
    RegisterDeviceCopyOps(*r);
    r->Seal();
    return r;
  }();
  return *registry;
}

void OpRegistry::Seal() {
  std::sort(ops_.begin(), ops_.end(),
            [](const OpSchema& a, const OpSchema& b) { return a.name < b.name; });
  for (OpSchema& op : ops_) {
    if (op.torch.empty()) {
      auto it = TorchElsewhere().find(op.name);
      if (it != TorchElsewhere().end()) {
        op.torch = std::string(it->second);
      } else if (absl::EndsWith(op.name, "_")) {
        op.torch = absl::StrCat("Tensor.", op.name);
      } else {
        op.torch = absl::StrCat("torch.", op.name);
      }
    }
    by_name_.emplace(op.name, &op);
  }
}

const OpSchema* OpRegistry::Find(absl::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

void OpRegistry::Add(OpSchema schema) { ops_.push_back(std::move(schema)); }

}  // namespace gradserve::ops
