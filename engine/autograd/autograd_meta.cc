#include "engine/autograd/autograd_meta.h"

#include <utility>

#include "engine/autograd/variable.h"

namespace gradserve::autograd {
namespace {

std::unique_ptr<AutogradMetaInterface> MakeAutogradMeta() {
  return std::make_unique<AutogradMeta>();
}

// Note [Autograd metadata behind an interface]: installed before main() runs.
[[maybe_unused]] const bool kFactoryInstalled = (SetAutogradMetaFactory(&MakeAutogradMeta), true);

}  // namespace

Tensor AutogradMeta::grad() const {
  MutexLock lock(&mutex_);
  return grad_;
}

void AutogradMeta::set_grad(Tensor grad) {
  MutexLock lock(&mutex_);
  grad_ = std::move(grad);
}

void AutogradMeta::RefreshViewHistory(const Tensor& self) {
  // A base that requires no grad has no history to replay (and neither has the view).
  if (!view_base_.requires_grad()) {
    view_version_ = self.version();
    return;
  }
  ReplayViewFromBase(self);
}

// Every metadata is an AutogradMeta: MakeAutogradMeta is the only factory.
AutogradMeta* MetaOf(const Tensor& t) { return static_cast<AutogradMeta*>(t.autograd_meta()); }

AutogradMeta& MutableMetaOf(const Tensor& t) {
  return static_cast<AutogradMeta&>(t.mutable_autograd_meta());
}

}  // namespace gradserve::autograd
