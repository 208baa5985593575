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

namespace gradserve {

namespace autograd {
class Node;
}  // namespace autograd

class Tensor;

class AutogradMetaInterface {
 public:
  virtual ~AutogradMetaInterface() = default;

  // A leaf that requires grad, or a tensor with a grad_fn.
  virtual bool requires_grad() const = 0;
  virtual void set_requires_grad(bool requires_grad) = 0;
  // The Node that made the tensor in a recorded graph; null for leaves.
  virtual const std::shared_ptr<autograd::Node>& grad_fn() const = 0;
  // Which output of grad_fn the tensor is.
  virtual uint32_t output_nr() const = 0;
  // The gradient accumulated into a leaf; undefined until then. Both lock the metadata.
  virtual Tensor grad() const = 0;
  virtual void set_grad(Tensor grad) = 0;
  // The graph value name, for error messages.
  virtual const std::string& name() const = 0;
  virtual void set_name(std::string name) = 0;
};

// Makes the metadata of one tensor. Installed once by engine/autograd.
using AutogradMetaFactory = std::unique_ptr<AutogradMetaInterface> (*)();
void SetAutogradMetaFactory(AutogradMetaFactory factory);
// The installed factory; null if engine/autograd is not linked.
AutogradMetaFactory GetAutogradMetaFactory();

}  // namespace gradserve

#endif  // GRADSERVE_ENGINE_TENSOR_AUTOGRAD_META_INTERFACE_H_
