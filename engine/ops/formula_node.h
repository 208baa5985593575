// FormulaBackward: the backward Node of an op whose gradient is a short formula written with
// differentiable ops, over tensors the forward pass saved: the ops of statistics.h and
// indexing.h that are not plain compositions of other ops (std's guarded square root, slice
// with a step, cumsum) record one, so that each need not repeat the Node plumbing.
//
// Thread safety: the Engine holds mutex() around apply and release_variables (Note [Node
// thread safety]); the op fills the saved tensors before the node is shared.

#ifndef GRADSERVE_ENGINE_OPS_FORMULA_NODE_H_
#define GRADSERVE_ENGINE_OPS_FORMULA_NODE_H_

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "engine/autograd/node.h"
#include "engine/autograd/saved_variable.h"
#include "engine/ops/record.h"
#include "engine/tensor/tensor.h"

namespace gradserve::ops {

class FormulaBackward final : public autograd::Node {
 public:
  // The gradients of the op's inputs (one per input; undefined where none is needed) from the
  // gradient of its one output. Written with differentiable ops, so that create_graph records
  // it.
  using Formula = std::function<TensorList(const FormulaBackward& node, const Tensor& grad)>;

  FormulaBackward(const char* name, Formula formula) : name_(name), formula_(std::move(formula)) {}

  TensorList apply(TensorList&& grads) override {
    if (grads.empty() || !grads[0].defined()) return TensorList(num_outputs());
    return formula_(*this, grads[0]);
  }
  std::string name() const override { return name_; }
  void release_variables() override {
    for (autograd::SavedVariable& s : saved_) s.reset();
  }

  // Saves t as saved tensor i; is_output: t is this node's own output.
  void Save(size_t i, const Tensor& t, bool is_output = false) {
    if (saved_.size() <= i) saved_.resize(i + 1);
    saved_[i] = autograd::SavedVariable(t, is_output);
  }
  Tensor Saved(size_t i) const { return saved_[i].unpack(this); }
  bool Needs(size_t i) const { return should_compute_output(i); }

 private:
  const char* const name_;
  const Formula formula_;
  std::vector<autograd::SavedVariable> saved_;
};

// Records a FormulaBackward for out over inputs if grad mode is on and an input requires grad;
// null otherwise.
inline std::shared_ptr<FormulaBackward> RecordFormula(Tensor& out, TensorRefs inputs,
                                                      const char* name,
                                                      FormulaBackward::Formula formula) {
  return RecordOp<FormulaBackward>(out, inputs, name, std::move(formula));
}

}  // namespace gradserve::ops

#endif  // GRADSERVE_ENGINE_OPS_FORMULA_NODE_H_
