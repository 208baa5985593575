#include "engine/ops/op_registry.h"

#include <algorithm>

#include "engine/ops/device_copy.h"

namespace gradserve::ops {

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
  for (const OpSchema& op : ops_) by_name_.emplace(op.name, &op);
}

const OpSchema* OpRegistry::Find(absl::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

void OpRegistry::Add(OpSchema schema) { ops_.push_back(std::move(schema)); }

}  // namespace gradserve::ops
