#include "engine/autograd/accumulate_grad.h"

#include "engine/autograd/autograd_meta.h"
#include "engine/autograd/functions/accumulate.h"
#include "engine/autograd/grad_mode.h"
#include "engine/kernels/basic_kernels.h"

namespace gradserve::autograd {

AccumulateGrad::AccumulateGrad(Tensor leaf) : variable_(std::move(leaf)) {
  add_input_metadata(InputMetadata(variable_));
}

TensorList AccumulateGrad::apply(TensorList&& grads) {
  Tensor new_grad = std::move(grads[0]);
  if (!new_grad.defined()) return {};
  AutogradMeta& meta = MutableMetaOf(variable_);
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
  return {};
}

}  // namespace gradserve::autograd
