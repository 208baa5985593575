// AccumulateGrad: the Node at each leaf that sums incoming gradients into the leaf's .grad.

#ifndef GRADSERVE_ENGINE_AUTOGRAD_ACCUMULATE_GRAD_H_
#define GRADSERVE_ENGINE_AUTOGRAD_ACCUMULATE_GRAD_H_

#include <string>

#include "engine/autograd/node.h"

namespace gradserve::autograd {

// Holds its leaf strongly; the leaf holds it weakly (GradAccumulator), as in PyTorch.
//
// Note [Accumulating in place]
// Without create_graph, the first gradient is stored as is when nothing else holds it, and
// later ones are added into it in place; a gradient someone else holds is copied first, so no
// other tensor ever changes under its holder. With create_graph the sum is a new,
// differentiable tensor each time.
//
// Thread safety: the leaf's AutogradMeta::mutex_ guards its grad_ against concurrent backward
// passes.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(Tensor leaf);

  TensorList apply(TensorList&& grads) override;
  std::string name() const override { return "AccumulateGrad"; }

  const Tensor& variable() const { return variable_; }

 private:
  Tensor variable_;
};

// Makes t, a non-leaf, sum the gradients that reach it into its .grad from now on (PyTorch's
// retain_grad; Note [backward() into a non-leaf] in accumulate_grad.cc). Idempotent; does
// nothing for a leaf.
void RetainGrad(const Tensor& t);

}  // namespace gradserve::autograd

#endif  // GRADSERVE_ENGINE_AUTOGRAD_ACCUMULATE_GRAD_H_
