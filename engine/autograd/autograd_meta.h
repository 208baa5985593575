// The autograd half of a Tensor: what makes it PyTorch's Variable.

#ifndef GRADSERVE_ENGINE_AUTOGRAD_AUTOGRAD_META_H_
#define GRADSERVE_ENGINE_AUTOGRAD_AUTOGRAD_META_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "engine/tensor/tensor.h"
#include "engine/util/mutex.h"

namespace gradserve::autograd {

class Node;

struct AutogradMeta {
  // The Node whose output_nr-th output this tensor is; null for leaves. Set once, when the op
  // that made the tensor records it.
  std::shared_ptr<Node> grad_fn;
  uint32_t output_nr = 0;
  // Leaves only: whether gradients flow into this tensor.
  bool requires_grad = false;
  std::string name;

  // Guards a leaf's gradient state against concurrent backward passes.
  Mutex mutex;
  // The leaf's AccumulateGrad, made on first use (GradAccumulator). Weak, as in PyTorch: the
  // recorded graph owns it, and a new one is made once that graph is gone.
  std::weak_ptr<Node> grad_accumulator ABSL_GUARDED_BY(mutex);
  // The gradient summed into the leaf by backward() calls.
  Tensor grad ABSL_GUARDED_BY(mutex);
};

}  // namespace gradserve::autograd

#endif  // GRADSERVE_ENGINE_AUTOGRAD_AUTOGRAD_META_H_
