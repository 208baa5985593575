// The autograd half of a Tensor: what makes it PyTorch's Variable. Tensor reaches it through
// AutogradMetaInterface (Note [Autograd metadata behind an interface],
// engine/tensor/autograd_meta_interface.h); autograd code reaches the fields through MetaOf and
// MutableMetaOf.

#ifndef GRADSERVE_ENGINE_AUTOGRAD_AUTOGRAD_META_H_
#define GRADSERVE_ENGINE_AUTOGRAD_AUTOGRAD_META_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "engine/tensor/autograd_meta_interface.h"
#include "engine/tensor/tensor.h"
#include "engine/util/mutex.h"

namespace gradserve::autograd {

class Node;

struct AutogradMeta final : AutogradMetaInterface {
  // grad_fn_, output_nr_, requires_grad_ and name_ are the interface's plain data (Note [Hot
  // metadata is plain data]).
  Tensor grad() const override;
  void set_grad(Tensor grad) override;
  void RefreshViewHistory(const Tensor& self) override;

  // A tracked view's base (tracks_view_): the tensor that is no view whose elements it shows,
  // kept alive by it, as PyTorch's view metadata keeps base_ (Note [Views written in place]).
  // Set once, when the view op makes the view, before the view is shared.
  Tensor view_base_;
  // A view made under no_grad of a tensor that requires grad: PyTorch's NO_GRAD_MODE creation
  // meta, which refuses an in-place op with grad mode on (Note [Views written in place]).
  bool view_made_under_no_grad_ = false;
  // Only on a SavedVariable's alias of a view that an in-place op wrote and saved as its
  // output: the view's grad_fn then, its view-replay Node, which unpack gives the output
  // instead of the saving Node (PyTorch's is_inplace_on_view). Weak: that Node's history
  // reaches the saving Node.
  std::weak_ptr<Node> saved_view_grad_fn_;

  // Guards a leaf's gradient state against concurrent backward passes.
  mutable FastMutex mutex_;
  // The leaf's AccumulateGrad, made on first use (GradAccumulator). Weak, as in PyTorch: the
  // recorded graph owns it, and a new one is made once that graph is gone.
  std::weak_ptr<Node> grad_accumulator_ ABSL_GUARDED_BY(mutex_);
  // The gradient summed into the leaf by backward() calls (or into a non-leaf that retains
  // its gradient, RetainGrad).
  Tensor grad_ ABSL_GUARDED_BY(mutex_);
  // A non-leaf whose grad_fn has its RetainGrad hook.
  bool retains_grad_ ABSL_GUARDED_BY(mutex_) = false;
};

// t's metadata; null if it has none.
AutogradMeta* MetaOf(const Tensor& t);
// t's metadata, made if missing.
AutogradMeta& MutableMetaOf(const Tensor& t);

}  // namespace gradserve::autograd

#endif  // GRADSERVE_ENGINE_AUTOGRAD_AUTOGRAD_META_H_
