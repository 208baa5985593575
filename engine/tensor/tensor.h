// Tensor: a typed, shaped, strided view of a Storage, with optional autograd metadata.
//
// A Tensor is a cheap handle (one shared pointer); copies share the same TensorImpl, so setting
// requires_grad or .grad through one copy is seen through all. Tensors made by different calls
// never share an impl, though they may share storage (views such as detach()).
//
// Thread safety: the shape, dtype and storage of an impl never change after construction.
// Element data is not guarded (in-place ops write it while a graph is built, on one thread); the
// engine never writes into a tensor another thread may read (see Note [Accumulating in place]).
// Autograd metadata is set while a graph is built (one thread) and read during backward;
// AccumulateGrad guards .grad with its own mutex.

#ifndef GRADSERVE_ENGINE_TENSOR_TENSOR_H_
#define GRADSERVE_ENGINE_TENSOR_TENSOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/types/span.h"
#include "engine/device/device.h"
#include "engine/tensor/autograd_meta_interface.h"
#include "engine/tensor/dtype.h"
#include "engine/tensor/shape.h"
#include "engine/tensor/storage.h"
#include "engine/util/status_error.h"

namespace gradserve {

struct TensorImpl {
  TensorImpl(std::shared_ptr<Storage> storage, int64_t storage_offset, Shape shape, Strides strides,
             DType dtype, int64_t numel);
  // A fresh tensor at offset 0 whose strides the caller computed as the packed row-major ones
  // (Note [A fresh tensor in one pass] in tensor.cc): contiguous without asking.
  TensorImpl(std::shared_ptr<Storage> storage, absl::Span<const int64_t> shape,
             absl::Span<const int64_t> contiguous_strides, DType dtype, int64_t numel);
  ~TensorImpl();

  std::shared_ptr<Storage> storage;
  int64_t storage_offset;  // in elements
  Shape shape;
  Strides strides;
  DType dtype;
  // Made by a view op (narrow, select, a reshape that copies nothing, transpose, permute,
  // expand, squeeze, unsqueeze) over another value's elements, which an in-place op on it would
  // change too (Note [In-place ops] in engine/ops/inplace.h). Set before the tensor is shared.
  bool is_view = false;
  // Whether the strides are the packed row-major ones (dimensions of size 1 aside): set once
  // from shape and strides, which never change, since ops ask it of every input.
  bool contiguous;
  int64_t numel;
  // Null until autograd needs it (requires_grad, a grad_fn, a name); made by engine/autograd
  // (Note [Autograd metadata behind an interface]).
  std::unique_ptr<AutogradMetaInterface> autograd_meta;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // --- Making tensors. All throw StatusError on a bad shape or when out of memory. ---

  // Uninitialized contiguous memory. RESOURCE_EXHAUSTED over the current budget's bytes or
  // max_tensor_elements, before anything is allocated (Note [Tensors over
  // max_tensor_elements] in memory_budget.h).
  static Tensor Empty(absl::Span<const int64_t> shape, DType dtype, Device device = kCPU);
  static Tensor Zeros(absl::Span<const int64_t> shape, DType dtype, Device device = kCPU);
  static Tensor Full(absl::Span<const int64_t> shape, double value, DType dtype,
                     Device device = kCPU);
  // A 0-d tensor.
  static Tensor Scalar(double value, DType dtype, Device device = kCPU);
  // Copies values (on the CPU) into a tensor of the given shape; sizes must agree.
  template <typename T>
  static Tensor FromVector(const std::vector<T>& values, absl::Span<const int64_t> shape);
  // A contiguous CPU tensor over the writable bytes at data (numel times the element size of
  // them), which owner keeps alive: no copy (Note [Adopted storage]). If data is not aligned to the
  // dtype's element size, the bytes are copied into a new tensor instead and owner is not kept.
  static Tensor FromExternal(absl::Span<const int64_t> shape, DType dtype, void* data,
                             std::shared_ptr<const void> owner);
  // Empty/Zeros with this tensor's shape, dtype and device.
  Tensor EmptyLike() const { return Empty(shape(), dtype(), device()); }
  Tensor ZerosLike() const { return Zeros(shape(), dtype(), device()); }

  // --- Metadata. ---
  bool defined() const { return impl_ != nullptr; }
  DType dtype() const { return impl_->dtype; }
  Device device() const { return impl_->storage->device(); }
  const Shape& shape() const { return impl_->shape; }
  const Strides& strides() const { return impl_->strides; }
  int64_t dim() const { return static_cast<int64_t>(impl_->shape.size()); }
  // Size of dimension d; negative d counts from the end.
  int64_t size(int64_t d) const { return impl_->shape[d < 0 ? d + dim() : d]; }
  int64_t numel() const { return impl_->numel; }
  size_t nbytes() const { return static_cast<size_t>(numel()) * ElementSize(dtype()); }
  int64_t storage_offset() const { return impl_->storage_offset; }
  bool is_contiguous() const { return impl_->contiguous; }
  // Whether the tensor has two or more elements, all one element of its storage: every dim
  // longer than 1 has stride 0 (a scalar expanded, as a sum's gradient is).
  bool repeats_one_value() const;
  // PyTorch's _version: how many in-place writes this tensor's elements have had, counted on
  // the storage its views and aliases share (Note [Version counter]).
  uint32_t version() const { return impl_->storage->version(); }
  // Counts one in-place write; every op that writes into an existing tensor calls it.
  void BumpVersion() const { impl_->storage->BumpVersion(); }
  // Whether a view op made this tensor (TensorImpl::is_view).
  bool is_view() const { return impl_->is_view; }
  const std::shared_ptr<Storage>& storage() const { return impl_->storage; }
  TensorImpl* impl() const { return impl_.get(); }
  // A weak reference to the impl, for what must not keep the tensor alive (a hook on its own
  // grad_fn); Tensor(weak.lock()) makes the tensor again while it lives.
  std::weak_ptr<TensorImpl> weak_impl() const { return impl_; }
  // The same impl (not merely the same values).
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }
  long use_count() const { return impl_.use_count(); }
  // "float32[2, 3] on cpu".
  std::string DebugString() const;

  // --- Data. The pointer is to the first element; it is host memory only on host devices. ---
  // A tensor with no elements may have no memory at all (a null data pointer) and still an
  // offset, e.g. a slice of a [0, 5] tensor along its second dimension: then it is null, since
  // even adding the offset to null is undefined behaviour.
  void* raw_data() const {
    char* base = static_cast<char*>(impl_->storage->data());
    if (base == nullptr) [[unlikely]]
      return nullptr;
    return base + impl_->storage_offset * static_cast<int64_t>(ElementSize(impl_->dtype));
  }
  template <typename T>
  T* data() const {
    return static_cast<T*>(raw_data());
  }
  // The single element of a one-element tensor, converted to double.
  double item() const;

  // --- Data-level conversions and views: no autograd history. ---
  // This tensor if already contiguous, else a packed copy.
  Tensor contiguous() const;
  // A packed copy that owns its memory.
  Tensor Clone() const;
  // A copy converted to dtype and/or moved to device; this tensor itself if nothing changes.
  Tensor To(DType dtype) const;
  Tensor To(Device device) const;
  // A view of the same storage with other sizes and strides.
  Tensor AsStrided(absl::Span<const int64_t> shape, absl::Span<const int64_t> strides,
                   int64_t storage_offset) const;

  // --- Autograd (PyTorch's Variable). ---
  // A leaf that requires grad, or a tensor with a grad_fn.
  bool requires_grad() const;
  // Marks a leaf as requiring grad. Throws INVALID_ARGUMENT for a non-floating dtype, and for a
  // non-leaf (only leaves' requires_grad can be set).
  void set_requires_grad(bool requires_grad);
  // The Node that made this tensor in a recorded graph; null for leaves.
  const std::shared_ptr<autograd::Node>& grad_fn() const;
  // Which output of grad_fn this tensor is.
  uint32_t output_nr() const;
  bool is_leaf() const { return grad_fn() == nullptr; }
  // The gradient accumulated into a leaf by backward(); undefined until then.
  Tensor grad() const;
  void set_grad(Tensor grad);
  // A tensor sharing this one's storage with no history and requires_grad false.
  Tensor detach() const;
  // A name for error messages (the graph value name); empty if none.
  const std::string& name() const;
  void set_name(std::string name);

  // The autograd metadata; null if this tensor never had any.
  AutogradMetaInterface* autograd_meta() const { return impl_->autograd_meta.get(); }
  // Creates the metadata if missing (Note [Autograd metadata behind an interface]).
  AutogradMetaInterface& mutable_autograd_meta() const;

 private:
  std::shared_ptr<TensorImpl> impl_;
};

using TensorList = std::vector<Tensor>;

template <typename T>
Tensor Tensor::FromVector(const std::vector<T>& values, absl::Span<const int64_t> shape) {
  constexpr DType dtype = std::is_same_v<T, float>     ? DType::kFloat32
                          : std::is_same_v<T, double>  ? DType::kFloat64
                          : std::is_same_v<T, int64_t> ? DType::kInt64
                                                       : DType::kBool;
  Tensor t = Empty(shape, dtype);
  GS_CHECK_ARG(static_cast<int64_t>(values.size()) == t.numel(), "FromVector: ", values.size(),
               " values for shape ", ShapeToString(shape));
  T* out = t.data<T>();
  for (size_t i = 0; i < values.size(); ++i) out[i] = values[i];
  return t;
}

}  // namespace gradserve

#endif  // GRADSERVE_ENGINE_TENSOR_TENSOR_H_
