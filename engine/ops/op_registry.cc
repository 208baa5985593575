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
    RegisterDeviceCopyOps(*r);
    std::sort(r->ops_.begin(), r->ops_.end(),
              [](const OpSchema& a, const OpSchema& b) { return a.name < b.name; });
    return r;
  }();
  return *registry;
}

const OpSchema* OpRegistry::Find(absl::string_view name) const {
  auto it = std::lower_bound(ops_.begin(), ops_.end(), name,
                             [](const OpSchema& op, absl::string_view n) { return op.name < n; });
  if (it == ops_.end() || it->name != name) return nullptr;
  return &*it;
}

void OpRegistry::Add(OpSchema schema) { ops_.push_back(std::move(schema)); }

}  // namespace gradserve::ops
