#include "engine/autograd/functions/accumulate.h"

#include "engine/autograd/variable.h"
#include "engine/kernels/basic_kernels.h"

namespace gradserve::autograd {
namespace {

// d(a + b)/da = d(a + b)/db = identity: the incoming gradient goes to both inputs.
class AccumulateBackward final : public Node {
 public:
  TensorList apply(TensorList&& grads) override {
    return {should_compute_output(0) ? grads[0] : Tensor(),
            should_compute_output(1) ? grads[0] : Tensor()};
  }
  std::string name() const override { return "AddBackward0"; }
};

}  // namespace

Tensor AccumulateSum(const Tensor& a, const Tensor& b) {
  Tensor out = AddSameShape(a, b);
  if (ShouldRecord({a, b})) {
    auto node = MakeNode<AccumulateBackward>();
    node->set_next_edges(CollectNextEdges({a, b}));
    SetHistory(out, node);
  }
  return out;
}

}  // namespace gradserve::autograd
