// AutogradMetaInterface: how a Tensor reaches its autograd metadata without knowing autograd.
//
// Note [Autograd metadata behind an interface]
// The tensor layer lies below autograd (engine/README.md), yet a Tensor answers requires_grad(),
// grad_fn(), grad() and name(), as PyTorch's does. As c10's TensorImpl does, TensorImpl holds its
// metadata through this interface, which engine/tensor/ defines and engine/autograd/ implements
// (AutogradMeta, engine/autograd/autograd_meta.h). Autograd installs its factory when the program
// starts (SetAutogradMetaFactory, from a static initializer), and Tensor makes the metadata
// through it on first need. autograd::Node is only declared here: the tensor layer passes the
// pointer along and never looks inside.
//
// Thread safety: the factory is set before main() runs and only read after. The methods are as
// Tensor's that forward to them document.
// Errors: a Tensor that needs metadata in a program without engine/autograd linked throws
// INTERNAL naming this note.

#ifndef GRADSERVE_ENGINE_TENSOR_AUTOGRAD_META_INTERFACE_H_
#define GRADSERVE_ENGINE_TENSOR_AUTOGRAD_META_INTERFACE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

namespace gradserve {

namespace autograd {
class Node;
}  // namespace autograd

class Tensor;

class AutogradMetaInterface {
 public:
  virtual ~AutogradMetaInterface() = default;

  // A leaf that requires grad, or a tensor with a grad_fn.
  bool requires_grad() const { return requires_grad_ || grad_fn_ != nullptr; }
  void set_requires_grad(bool requires_grad) { requires_grad_ = requires_grad; }
  // The Node that made the tensor in a recorded graph; null for leaves.
  const std::shared_ptr<autograd::Node>& grad_fn() const { return grad_fn_; }
  // Which output of grad_fn the tensor is.
  uint32_t output_nr() const { return output_nr_; }
  // The graph value name, for error messages.
  const std::string& name() const { return name_; }
  void set_name(std::string name) { name_ = std::move(name); }

  // The gradient accumulated into a leaf; undefined until then. Both lock the metadata, which
  // autograd defines.
  virtual Tensor grad() const = 0;
  virtual void set_grad(Tensor grad) = 0;

  // A view whose base was written in place since its grad_fn was set: gives it the grad_fn
  // that replays the view from its base's current history (Note [Views written in place] in
  // engine/autograd/variable.h). `self` is the tensor this metadata belongs to. Called by
  // Tensor's accessors when tracks_view_ and view_version_ differs from self.version().
  virtual void RefreshViewHistory(const Tensor& self) = 0;

  // Note [Hot metadata is plain data]
  // The fields below are read on every recorded op and every Node of a backward pass (is this
  // input recorded? which Node and output made it?). They live here, as plain data that
  // engine/autograd sets (SetHistory, SavedVariable::unpack), so that reading them costs a load,
  // not a virtual call: behind virtual accessors the 10,000-node chain's backward took about
  // 4% longer than with the fields in the tensor layer. Only the leaf's gradient, which needs
  // autograd's lock and its Tensor arithmetic, stays behind the interface.

  // The Node whose output_nr_-th output this tensor is; null for leaves. Set once, when the op
  // that made the tensor records it.
  std::shared_ptr<autograd::Node> grad_fn_;
  uint32_t output_nr_ = 0;
  // Leaves only: whether gradients flow into this tensor.
  bool requires_grad_ = false;
  // A view whose base autograd tracks (Note [Views written in place]): grad_fn_ holds for the
  // base's history at version view_version_ of the shared elements, and is remade when the
  // version moves.
  bool tracks_view_ = false;
  uint32_t view_version_ = 0;
  std::string name_;
};

// Makes the metadata of one tensor. Installed once by engine/autograd.
using AutogradMetaFactory = std::unique_ptr<AutogradMetaInterface> (*)();
void SetAutogradMetaFactory(AutogradMetaFactory factory);
// The installed factory; null if engine/autograd is not linked.
AutogradMetaFactory GetAutogradMetaFactory();

}  // namespace gradserve

#endif  // GRADSERVE_ENGINE_TENSOR_AUTOGRAD_META_INTERFACE_H_
