#include "engine/tensor/tensor.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/device/device_registry.h"
#include "engine/tensor/tensor_kernels.h"

namespace gradserve {
namespace {

// Set before main() by engine/kernels and engine/autograd; read-only after.
TensorKernels g_kernels;
AutogradMetaFactory g_autograd_meta_factory = nullptr;

const TensorKernels& Kernels() {
  GS_CHECK_INTERNAL(g_kernels.fill != nullptr && g_kernels.copy != nullptr,
                    "Tensor's fill and copy kernels are not installed: engine/kernels is not "
                    "linked (Note [Tensor's kernels])");
  return g_kernels;
}

void Fill(const Tensor& dst, double value) { Kernels().fill(dst, value); }
void CopyInto(const Tensor& dst, const Tensor& src) { Kernels().copy(dst, src); }

// Note [Tensors over max_tensor_elements]: the refusal, naming the outputs being computed.
[[noreturn]] void ThrowOverMaxTensorElements(absl::Span<const int64_t> shape, DType dtype,
                                             Device device, int64_t numel, int64_t limit) {
  std::string what = "a tensor ";
  if (const std::vector<std::string>* names = OutputNamesScope::Current();
      names != nullptr && !names->empty()) {
    what = names->size() == 1
               ? absl::StrCat("output '", names->front(), "' ")
               : absl::StrCat("a tensor of outputs '", absl::StrJoin(*names, "', '"), "': ");
  }
  ThrowStatus(absl::ResourceExhaustedError(absl::StrCat(
      what, DTypeName(dtype), ShapeToString(shape), " on ", DeviceName(device), " has ", numel,
      " elements, over the limit of ", limit, " (max_tensor_elements)")));
}

}  // namespace

void SetTensorKernels(const TensorKernels& kernels) { g_kernels = kernels; }

void SetAutogradMetaFactory(AutogradMetaFactory factory) { g_autograd_meta_factory = factory; }
AutogradMetaFactory GetAutogradMetaFactory() { return g_autograd_meta_factory; }

TensorImpl::TensorImpl(std::shared_ptr<Storage> storage, int64_t storage_offset, Shape shape,
                       Strides strides, DType dtype, int64_t numel)
    : storage(std::move(storage)),
      storage_offset(storage_offset),
      shape(std::move(shape)),
      strides(std::move(strides)),
      dtype(dtype),
      contiguous(IsContiguous(this->shape, this->strides)),
      numel(numel) {}

TensorImpl::TensorImpl(std::shared_ptr<Storage> storage, absl::Span<const int64_t> shape,
                       absl::Span<const int64_t> contiguous_strides, DType dtype, int64_t numel)
    : storage(std::move(storage)),
      storage_offset(0),
      shape(shape.begin(), shape.end()),
      strides(contiguous_strides.begin(), contiguous_strides.end()),
      dtype(dtype),
      contiguous(true),
      numel(numel) {}

TensorImpl::~TensorImpl() = default;

// Note [A fresh tensor in one pass]
// Every op's result and every backward formula's gradient is made here, so on a graph of small
// tensors this function is a sizeable part of a request (about 500 instructions a tensor, 18
// tensors in grad_tiny). The common shape has no zero and no product near 2^63: its element
// count and its packed strides come out of one pass, and the tensor is known to be contiguous
// without asking IsContiguous. A shape with a zero (or a negative size, a product that
// overflows, or a rank over kOnePassRank) takes the general path, whose checks and error messages
// (CheckedNumel) are the reference; both give the same tensor.
constexpr size_t kOnePassRank = 8;

Tensor Tensor::Empty(absl::Span<const int64_t> shape, DType dtype, Device device) {
  int64_t strides[kOnePassRank];
  int64_t numel = 1;
  bool one_pass = shape.size() <= kOnePassRank;
  for (size_t i = shape.size(); one_pass && i-- > 0;) {
    strides[i] = numel;
    one_pass = shape[i] > 0 && !__builtin_mul_overflow(numel, shape[i], &numel);
  }
  if (!one_pass) numel = ValueOrThrow(CheckedNumel(shape));
  const std::shared_ptr<MemoryBudget>& budget = CurrentMemoryBudget();
  if (budget != nullptr && numel > budget->max_tensor_elements()) {
    ThrowOverMaxTensorElements(shape, dtype, device, numel, budget->max_tensor_elements());
  }
  size_t nbytes = 0;
  if (__builtin_mul_overflow(static_cast<size_t>(numel), ElementSize(dtype), &nbytes)) {
    ThrowStatus(absl::InvalidArgumentError(
        absl::StrCat("shape ", ShapeToString(shape), " needs more bytes than memory can hold")));
  }
  // DeviceRegistry::allocator answers kCPU too, but through Get() and a call in another file:
  // asked here first, the host's is about 0.5k instructions fewer in a grad_tiny request.
  Allocator* allocator = device.is_cpu() ? CpuAllocator() : DeviceRegistry::Get().allocator(device);
  auto storage = std::make_shared<Storage>(nbytes, allocator, budget);
  if (one_pass) {
    return Tensor(std::make_shared<TensorImpl>(
        std::move(storage), shape, absl::MakeConstSpan(strides, shape.size()), dtype, numel));
  }
  return Tensor(std::make_shared<TensorImpl>(std::move(storage), 0,
                                             Shape(shape.begin(), shape.end()),
                                             ContiguousStrides(shape), dtype, numel));
}

Tensor Tensor::FromExternal(absl::Span<const int64_t> shape, DType dtype, void* data,
                            std::shared_ptr<const void> owner) {
  if (reinterpret_cast<uintptr_t>(data) % ElementSize(dtype) != 0) {
    Tensor copy = Empty(shape, dtype, kCPU);
    if (copy.nbytes() > 0) std::memcpy(copy.raw_data(), data, copy.nbytes());
    return copy;
  }
  const int64_t numel = ValueOrThrow(CheckedNumel(shape));
  const size_t nbytes = static_cast<size_t>(numel) * ElementSize(dtype);
  auto storage = std::make_shared<Storage>(data, nbytes, kCPU, std::move(owner));
  return Tensor(std::make_shared<TensorImpl>(std::move(storage), 0,
                                             Shape(shape.begin(), shape.end()),
                                             ContiguousStrides(shape), dtype, numel));
}

Tensor Tensor::Zeros(absl::Span<const int64_t> shape, DType dtype, Device device) {
  return Full(shape, 0.0, dtype, device);
}

Tensor Tensor::Full(absl::Span<const int64_t> shape, double value, DType dtype, Device device) {
  // Fill runs on the host and on GPUs; another device gets a filled host tensor copied over.
  if (device.type != DeviceType::kCUDA && !DeviceRegistry::Get().host_accessible(device)) {
    Tensor host = Full(shape, value, dtype, kCPU);
    return host.To(device);
  }
  Tensor t = Empty(shape, dtype, device);
  Fill(t, value);
  return t;
}

Tensor Tensor::Scalar(double value, DType dtype, Device device) {
  return Full({}, value, dtype, device);
}

std::string Tensor::DebugString() const {
  if (!defined()) return "undefined tensor";
  return absl::StrCat(DTypeName(dtype()), ShapeToString(shape()), " on ", DeviceName(device()));
}

double Tensor::item() const {
  GS_CHECK_ARG(numel() == 1, "item() needs a tensor with one element, got ",
               ShapeToString(shape()));
  Tensor host = device().is_cpu() ? *this : To(kCPU);
  return DispatchStorage(dtype(), [&](auto tag) -> double {
    using T = decltype(tag);
    return static_cast<double>(*host.data<T>());
  });
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return Clone();
}

Tensor Tensor::Clone() const {
  Tensor out = Empty(shape(), dtype(), device());
  CopyInto(out, *this);
  return out;
}

Tensor Tensor::To(DType new_dtype) const {
  if (new_dtype == dtype()) return *this;
  Tensor out = Empty(shape(), new_dtype, device());
  CopyInto(out, *this);
  return out;
}

Tensor Tensor::To(Device new_device) const {
  if (new_device == device()) return *this;
  Tensor src = contiguous();
  Tensor out = Empty(shape(), dtype(), new_device);
  CopyInto(out, src);
  return out;
}

bool Tensor::repeats_one_value() const {
  if (numel() < 2) return false;
  for (size_t d = 0; d < impl_->shape.size(); ++d) {
    if (impl_->shape[d] != 1 && impl_->strides[d] != 0) return false;
  }
  return true;
}

Tensor Tensor::AsStrided(absl::Span<const int64_t> new_shape, absl::Span<const int64_t> new_strides,
                         int64_t new_offset) const {
  GS_CHECK_INTERNAL(new_shape.size() == new_strides.size(), "AsStrided rank mismatch");
  return Tensor(std::make_shared<TensorImpl>(
      impl_->storage, new_offset, Shape(new_shape.begin(), new_shape.end()),
      Strides(new_strides.begin(), new_strides.end()), dtype(), Numel(new_shape)));
}

namespace {

// Note [Views written in place]: a view's history is remade before it is read once its elements
// were written in place since it was set.
const AutogradMetaInterface* FreshMeta(const Tensor& t) {
  AutogradMetaInterface* meta = t.autograd_meta();
  if (meta != nullptr && meta->tracks_view_ && meta->view_version_ != t.version()) [[unlikely]] {
    meta->RefreshViewHistory(t);
  }
  return meta;
}

}  // namespace

bool Tensor::requires_grad() const {
  const AutogradMetaInterface* meta = FreshMeta(*this);
  return meta != nullptr && meta->requires_grad();
}

void Tensor::set_requires_grad(bool requires_grad) {
  if (!requires_grad && autograd_meta() == nullptr) return;
  GS_CHECK_ARG(!requires_grad || IsFloating(dtype()),
               "only floating tensors can require gradients, got ", DTypeName(dtype()));
  GS_CHECK_ARG(is_leaf(), "requires_grad can only be set on leaf tensors");
  mutable_autograd_meta().set_requires_grad(requires_grad);
}

const std::shared_ptr<autograd::Node>& Tensor::grad_fn() const {
  static const std::shared_ptr<autograd::Node> kNone;
  const AutogradMetaInterface* meta = FreshMeta(*this);
  return meta != nullptr ? meta->grad_fn() : kNone;
}

uint32_t Tensor::output_nr() const {
  const AutogradMetaInterface* meta = FreshMeta(*this);
  return meta != nullptr ? meta->output_nr() : 0;
}

Tensor Tensor::grad() const {
  const AutogradMetaInterface* meta = autograd_meta();
  return meta != nullptr ? meta->grad() : Tensor();
}

void Tensor::set_grad(Tensor grad) { mutable_autograd_meta().set_grad(std::move(grad)); }

Tensor Tensor::detach() const {
  return Tensor(std::make_shared<TensorImpl>(impl_->storage, impl_->storage_offset, impl_->shape,
                                             impl_->strides, impl_->dtype, impl_->numel));
}

const std::string& Tensor::name() const {
  static const std::string kEmpty;
  const AutogradMetaInterface* meta = autograd_meta();
  return meta != nullptr ? meta->name() : kEmpty;
}

void Tensor::set_name(std::string name) { mutable_autograd_meta().set_name(std::move(name)); }

AutogradMetaInterface& Tensor::mutable_autograd_meta() const {
  if (impl_->autograd_meta == nullptr) {
    GS_CHECK_INTERNAL(g_autograd_meta_factory != nullptr,
                      "no autograd metadata factory: engine/autograd is not linked (Note "
                      "[Autograd metadata behind an interface])");
    impl_->autograd_meta = g_autograd_meta_factory();
  }
  return *impl_->autograd_meta;
}

}  // namespace gradserve
