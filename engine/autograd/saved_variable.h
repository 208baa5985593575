// SavedVariable: a tensor a backward function keeps from the forward pass.

#ifndef GRADSERVE_ENGINE_AUTOGRAD_SAVED_VARIABLE_H_
#define GRADSERVE_ENGINE_AUTOGRAD_SAVED_VARIABLE_H_

#include <cstdint>
#include <memory>

#include "engine/tensor/tensor.h"

namespace gradserve::autograd {

class Node;

// Saves a tensor so that unpack() later gives back a tensor with the same data and, when grad
// mode records the backward (create_graph), the same place in the graph.
//
// A tensor that is an output of the saving Node itself is saved without its grad_fn (that would
// be a reference cycle); unpack(node) puts it back. Any other tensor (an input, a leaf, a
// constant) is kept as it is, as PyTorch keeps it: gradients of a double backward still reach
// its grad_fn or its AccumulateGrad. There are no in-place ops, so a kept tensor's place in the
// graph cannot change after it was saved.
//
// Errors: unpack() after reset() throws FAILED_PRECONDITION, the error of a second backward
// through a graph that was not retained.
// Thread safety: none of its own; the saving Node's mutex guards it (Note [Node thread safety]).
class SavedVariable {
 public:
  SavedVariable() = default;
  SavedVariable(const Tensor& t, bool is_output);

  // The saved tensor; `saved_for` is the Node that saved it (needed for outputs, and named in
  // the error if the tensor was freed). An undefined tensor saved gives an undefined tensor.
  // With grad mode off (a backward without create_graph) the data comes back without its
  // place in the graph, since nothing will be recorded from it.
  Tensor unpack(const Node* saved_for) const;
  // Frees the data (release_variables).
  void reset();

 private:
  Tensor data_;                  // an output's data, detached; else the tensor itself
  uint32_t output_nr_ = 0;       // an output's place among the saving Node's outputs
  bool saved_original_ = false;  // data_ is the tensor itself (not an output of the saver)
  bool was_defined_ = false;
  bool released_ = false;
};

}  // namespace gradserve::autograd

#endif  // GRADSERVE_ENGINE_AUTOGRAD_SAVED_VARIABLE_H_
