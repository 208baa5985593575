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
// be a reference cycle); unpack(node) puts it back. An output that is a view the saving
// in-place op wrote gets back the view's grad_fn at save time instead, its view-replay Node
// (the saving Node runs only inside the base's CopySlices, Note [Views written in place]). Any
// other tensor (an input, a leaf, a constant) is kept as it is, as PyTorch keeps it: gradients of a
// double backward still reach its grad_fn or its AccumulateGrad.
//
// Note [Saved versions]
// An in-place op writes into a tensor's elements and bumps its version (Note [Version counter]
// in engine/tensor/storage.h). A SavedVariable records the version of the tensor it saves and
// unpack() compares it with the current one: a backward formula must never read data written
// after it was saved, and a saved tensor whose version moved is refused, as PyTorch refuses it,
// before the formula runs. The compare is the only cost a graph without in-place ops pays. An
// in-place op also rebases the history of the tensor it writes (its grad_fn becomes the op's
// Node); a saved tensor kept as it is would then carry the new history, but it is refused
// first, since that op also bumped its version.
//
// Errors: unpack() after reset() throws FAILED_PRECONDITION, the error of a second backward
// through a graph that was not retained; unpack() of a tensor modified in place since it was
// saved throws FAILED_PRECONDITION naming the node, the value, and the two versions.
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
  // The message of unpack()'s refusal of data modified in place (Note [Saved versions]).
  [[noreturn]] void ThrowModified(const Node* saved_for) const;

  Tensor data_;                  // an output's data, detached; else the tensor itself
  uint32_t output_nr_ = 0;       // an output's place among the saving Node's outputs
  uint32_t saved_version_ = 0;   // data_.version() when saved
  bool saved_original_ = false;  // data_ is the tensor itself (not an output of the saver)
  // An output that is a view written in place (Note [Views written in place]): its history is
  // the view's, kept on data_'s metadata (AutogradMeta::saved_view_grad_fn_).
  bool is_inplace_on_view_ = false;
  bool was_defined_ = false;
  bool released_ = false;
};

}  // namespace gradserve::autograd

#endif  // GRADSERVE_ENGINE_AUTOGRAD_SAVED_VARIABLE_H_
