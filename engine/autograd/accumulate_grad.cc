#include "engine/autograd/accumulate_grad.h"

#include "engine/autograd/autograd_meta.h"
#include "engine/autograd/function_hook.h"
#include "engine/autograd/functions/accumulate.h"
#include "engine/autograd/grad_mode.h"
#include "engine/kernels/basic_kernels.h"

namespace gradserve::autograd {

AccumulateGrad::AccumulateGrad(Tensor leaf) : variable_(std::move(leaf)) {
  add_input_metadata(InputMetadata(variable_));
}

namespace {

// Sums new_grad into meta's grad_ (Note [Accumulating in place]).
void SumIntoGrad(AutogradMeta& meta, Tensor new_grad) {
  MutexLock lock(&meta.mutex_);
  // Note [Accumulating in place].
  if (GradMode::is_enabled()) {
    meta.grad_ = meta.grad_.defined() ? AccumulateSum(meta.grad_, new_grad) : new_grad;
  } else if (!meta.grad_.defined()) {
    const bool owned = new_grad.use_count() == 1 && new_grad.is_contiguous() &&
                       new_grad.storage().use_count() == 1 && !new_grad.requires_grad();
    meta.grad_ = owned ? std::move(new_grad) : new_grad.detach().Clone();
  } else if (meta.grad_.requires_grad()) {
    // A graph-connected .grad from an earlier create_graph backward is never changed in place.
    meta.grad_ = AddSameShape(meta.grad_.detach(), new_grad);
  } else {
    AccumulateInto(meta.grad_, new_grad);
  }
}

// Note [backward() into a non-leaf]
// PyTorch's backward(inputs=[h]) for a non-leaf h calls h.retain_grad(): a hook on h's
// grad_fn, for h's output, sums each gradient that reaches h into h.grad, from then on, in
// every later backward pass that runs that grad_fn, whatever its inputs (as retain_grad does).
// The engine then runs h's grad_fn (backward() marks its output edges needed, not captured) and
// the hook fires there, in registration order among h's other hooks (PyTorch 1.13's order).
// The hook holds h weakly: h owns its grad_fn, which owns the hook.
class RetainGradHook final : public TensorHook {
 public:
  explicit RetainGradHook(std::weak_ptr<TensorImpl> tensor) : tensor_(std::move(tensor)) {}

  Tensor operator()(const Tensor& grad) override {
    if (!grad.defined()) return grad;
    std::shared_ptr<TensorImpl> impl = tensor_.lock();
    if (impl == nullptr) return grad;
    SumIntoGrad(MutableMetaOf(Tensor(std::move(impl))), grad);
    return grad;
  }

 private:
  std::weak_ptr<TensorImpl> tensor_;
};

}  // namespace

TensorList AccumulateGrad::apply(TensorList&& grads) {
  Tensor new_grad = std::move(grads[0]);
  if (!new_grad.defined()) return {};
  SumIntoGrad(MutableMetaOf(variable_), std::move(new_grad));
  return {};
}

void RetainGrad(const Tensor& t) {
  const std::shared_ptr<Node>& fn = t.grad_fn();
  if (fn == nullptr) return;  // a leaf: AccumulateGrad already sums into its .grad
  AutogradMeta& meta = MutableMetaOf(t);
  {
    MutexLock lock(&meta.mutex_);
    if (meta.retains_grad_) return;
    meta.retains_grad_ = true;
  }
  fn->add_tensor_pre_hook(t.output_nr(), std::make_shared<RetainGradHook>(t.weak_impl()));
}

}  // namespace gradserve::autograd
