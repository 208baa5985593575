#include "engine/ops/shape.h"

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/autograd/node.h"
#include "engine/autograd/saved_variable.h"
#include "engine/device/device_registry.h"
#include "engine/kernels/basic_kernels.h"
#include "engine/ops/broadcast.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/inplace.h"
#include "engine/ops/record.h"
#include "engine/ops/shape_common.h"
#include "engine/ops/shape_kernels.h"
#include "engine/util/cancellation.h"

namespace gradserve::ops {
namespace {

using autograd::MakeNode;
using autograd::Node;
using autograd::SavedVariable;

// ---------------------------------------------------------------------------------------------
// Views without autograd.

// Elements [start, start + length) of dim.
Tensor NarrowView(const Tensor& t, int64_t dim, int64_t start, int64_t length) {
  Shape shape = t.shape();
  shape[dim] = length;
  return t.AsStrided(shape, t.strides(), OffsetAlong(t, dim, start));
}

// The slice at index along dim, with dim removed.
Tensor SelectView(const Tensor& t, int64_t dim, int64_t index) {
  Strides strides = t.strides();
  strides.erase(strides.begin() + dim);
  return t.AsStrided(ShapeWithout(t.shape(), dim), strides, OffsetAlong(t, dim, index));
}

// The strides that let a tensor of `shape` and `strides` be read as `new_shape` (same numel)
// without copying, or nullopt if none do.
//
// The input's non-1 dims are grouped into runs that are uniformly strided (dim d and d + 1 are
// in one run when stride[d] == stride[d + 1] * size[d + 1]); element k of a run lies k * s
// from its start, s being the run's innermost stride. The new dims are then laid over the runs
// from the outside in: each must divide what is left of the current run, whose remaining count
// sets its stride. A new dim that would straddle two runs makes a view impossible.
std::optional<Strides> ViewStrides(absl::Span<const int64_t> shape,
                                   absl::Span<const int64_t> strides,
                                   absl::Span<const int64_t> new_shape) {
  if (Numel(new_shape) == 0) return ContiguousStrides(new_shape);
  struct Run {
    int64_t numel;
    int64_t stride;
  };
  std::vector<Run> runs;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!runs.empty() && runs.back().stride == strides[d] * shape[d]) {
      runs.back().numel *= shape[d];
      runs.back().stride = strides[d];
    } else {
      runs.push_back({shape[d], strides[d]});
    }
  }
  // Built in place: moving an InlinedVector into the optional trips GCC's maybe-uninitialized.
  std::optional<Strides> result(std::in_place, new_shape.size());
  Strides& out = *result;
  size_t run = 0;
  int64_t left = runs.empty() ? 1 : runs[0].numel;  // elements of runs[run] not yet laid over
  for (size_t d = 0; d < new_shape.size(); ++d) {
    const int64_t size = new_shape[d];
    if (size == 1) {
      out[d] = run < runs.size() ? left * runs[run].stride : 1;
      continue;
    }
    while (left == 1 && run + 1 < runs.size()) left = runs[++run].numel;
    if (run >= runs.size() || left % size != 0) return std::nullopt;
    left /= size;
    out[d] = left * runs[run].stride;
  }
  return result;
}

// The shape reshape makes: `shape` with its -1 (if any) inferred from input's element count.
Shape InferReshape(const Tensor& input, absl::Span<const int64_t> shape) {
  int64_t infer_at = -1;
  Shape known;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == -1) {
      GS_CHECK_ARG(infer_at < 0, "reshape: shape ", ShapeToString(shape), " has more than one -1");
      infer_at = static_cast<int64_t>(d);
      continue;
    }
    GS_CHECK_ARG(shape[d] >= 0, "reshape: shape ", ShapeToString(shape), " has invalid size ",
                 shape[d], " at dimension ", d);
    known.push_back(shape[d]);
  }
  const int64_t known_numel = ValueOrThrow(CheckedNumel(known));
  Shape out(shape.begin(), shape.end());
  if (infer_at >= 0) {
    GS_CHECK_ARG(known_numel != 0 && input.numel() % known_numel == 0, "reshape: shape ",
                 ShapeToString(shape), " is invalid for input of shape ",
                 ShapeToString(input.shape()), " (", input.numel(), " elements)");
    out[infer_at] = input.numel() / known_numel;
  } else {
    GS_CHECK_ARG(known_numel == input.numel(), "reshape: shape ", ShapeToString(shape),
                 " is invalid for input of shape ", ShapeToString(input.shape()), " (",
                 input.numel(), " elements)");
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Backward Nodes. Each is made by one op below; its apply() runs with the Node's mutex held
// (Note [Node thread safety]) and, under create_graph, records its own formula through the ops
// it calls. An undefined incoming gradient means zero, so every output is then undefined.

bool NoIncomingGrad(const TensorList& grads) { return grads.empty() || !grads[0].defined(); }

// Gradient = the incoming gradient reshaped to the input's shape: the backward of reshape and
// squeeze, which only relabel dims.
class ReshapeToInputBackward final : public Node {
 public:
  ReshapeToInputBackward(const char* name, Shape input_shape)
      : name_(name), input_shape_(std::move(input_shape)) {}
  TensorList apply(TensorList&& grads) override {
    if (NoIncomingGrad(grads)) return {Tensor()};
    return {reshape(grads[0], input_shape_)};
  }
  std::string name() const override { return name_; }

 private:
  const char* const name_;
  const Shape input_shape_;
};

class TransposeBackward final : public Node {
 public:
  TransposeBackward(int64_t dim0, int64_t dim1) : dim0_(dim0), dim1_(dim1) {}
  TensorList apply(TensorList&& grads) override {
    if (NoIncomingGrad(grads)) return {Tensor()};
    return {transpose(grads[0], dim0_, dim1_)};
  }
  std::string name() const override { return "TransposeBackward0"; }

 private:
  const int64_t dim0_, dim1_;
};

class PermuteBackward final : public Node {
 public:
  explicit PermuteBackward(std::vector<int64_t> inverse) : inverse_(std::move(inverse)) {}
  TensorList apply(TensorList&& grads) override {
    if (NoIncomingGrad(grads)) return {Tensor()};
    return {permute(grads[0], inverse_)};
  }
  std::string name() const override { return "PermuteBackward0"; }

 private:
  const std::vector<int64_t> inverse_;
};

class ExpandBackward final : public Node {
 public:
  explicit ExpandBackward(Shape input_shape) : input_shape_(std::move(input_shape)) {}
  TensorList apply(TensorList&& grads) override {
    if (NoIncomingGrad(grads)) return {Tensor()};
    return {sum_to(grads[0], input_shape_)};
  }
  std::string name() const override { return "ExpandBackward0"; }

 private:
  const Shape input_shape_;
};

class UnsqueezeBackward final : public Node {
 public:
  explicit UnsqueezeBackward(int64_t dim) : dim_(dim) {}
  TensorList apply(TensorList&& grads) override {
    if (NoIncomingGrad(grads)) return {Tensor()};
    return {squeeze(grads[0], dim_)};
  }
  std::string name() const override { return "UnsqueezeBackward0"; }

 private:
  const int64_t dim_;
};

// Input i of cat receives the slice of the gradient it filled.
class CatBackward final : public Node {
 public:
  CatBackward(int64_t dim, std::vector<int64_t> sizes) : dim_(dim), sizes_(std::move(sizes)) {}
  TensorList apply(TensorList&& grads) override {
    TensorList out(sizes_.size());
    if (NoIncomingGrad(grads)) return out;
    int64_t offset = 0;
    for (size_t i = 0; i < sizes_.size(); ++i) {
      if (sizes_[i] == kSkipped) {  // a legacy empty input: an empty gradient
        if (should_compute_output(i))
          out[i] = Tensor::Zeros({0}, grads[0].dtype(), grads[0].device());
        continue;
      }
      if (should_compute_output(i)) out[i] = narrow(grads[0], dim_, offset, sizes_[i]);
      offset += sizes_[i];
    }
    return out;
  }
  std::string name() const override { return "CatBackward0"; }
  static constexpr int64_t kSkipped = -1;

 private:
  const int64_t dim_;
  const std::vector<int64_t> sizes_;
};

class StackBackward final : public Node {
 public:
  StackBackward(int64_t dim, int64_t count) : dim_(dim), count_(count) {}
  TensorList apply(TensorList&& grads) override {
    TensorList out(count_);
    if (NoIncomingGrad(grads)) return out;
    for (int64_t i = 0; i < count_; ++i) {
      if (should_compute_output(i)) out[i] = select(grads[0], dim_, i);
    }
    return out;
  }
  std::string name() const override { return "StackBackward0"; }

 private:
  const int64_t dim_, count_;
};

// The backward of narrow (SliceBackward0) and select (SelectBackward0): the gradient padded
// with zeros back to the input's shape. select's gradient first gets its dim back.
class PadBackward final : public Node {
 public:
  PadBackward(const char* name, Shape input_shape, int64_t dim, int64_t start, bool unsqueeze)
      : name_(name),
        input_shape_(std::move(input_shape)),
        dim_(dim),
        start_(start),
        unsqueeze_(unsqueeze) {}
  TensorList apply(TensorList&& grads) override {
    if (NoIncomingGrad(grads)) return {Tensor()};
    const Tensor slice = unsqueeze_ ? unsqueeze(grads[0], dim_) : grads[0];
    return {PadAlongDim(slice, input_shape_, dim_, start_)};
  }
  std::string name() const override { return name_; }

 private:
  const char* const name_;
  const Shape input_shape_;
  const int64_t dim_, start_;
  const bool unsqueeze_;
};

// The two halves of the index_select / index_add pair: each one's backward is the other with
// the same index and skip.
class IndexSelectBackward final : public Node {
 public:
  IndexSelectBackward(Shape input_shape, int64_t dim, const Tensor& index,
                      std::optional<int64_t> skip)
      : input_shape_(std::move(input_shape)), dim_(dim), index_(index, false), skip_(skip) {}
  TensorList apply(TensorList&& grads) override {
    const Tensor index = index_.unpack(this);
    if (NoIncomingGrad(grads)) return {Tensor()};
    return {IndexAddIntoZeros(input_shape_, dim_, index, grads[0], skip_)};
  }
  std::string name() const override { return "IndexSelectBackward0"; }
  void release_variables() override { index_.reset(); }

 private:
  const Shape input_shape_;
  const int64_t dim_;
  SavedVariable index_;
  const std::optional<int64_t> skip_;
};

class IndexAddBackward final : public Node {
 public:
  IndexAddBackward(int64_t dim, const Tensor& index, std::optional<int64_t> skip)
      : dim_(dim), index_(index, false), skip_(skip) {}
  TensorList apply(TensorList&& grads) override {
    const Tensor index = index_.unpack(this);
    if (NoIncomingGrad(grads)) return {Tensor()};
    return {IndexSelectSkipping(grads[0], dim_, index, skip_)};
  }
  std::string name() const override { return "IndexAddBackward0"; }
  void release_variables() override { index_.reset(); }

 private:
  const int64_t dim_;
  SavedVariable index_;
  const std::optional<int64_t> skip_;
};

// The gather / scatter_add pair, likewise.
class GatherBackward final : public Node {
 public:
  GatherBackward(Shape input_shape, int64_t dim, const Tensor& index)
      : input_shape_(std::move(input_shape)), dim_(dim), index_(index, false) {}
  TensorList apply(TensorList&& grads) override {
    const Tensor index = index_.unpack(this);
    if (NoIncomingGrad(grads)) return {Tensor()};
    return {ScatterAddIntoZeros(input_shape_, dim_, index, grads[0])};
  }
  std::string name() const override { return "GatherBackward0"; }
  void release_variables() override { index_.reset(); }

 private:
  const Shape input_shape_;
  const int64_t dim_;
  SavedVariable index_;
};

class ScatterAddBackward final : public Node {
 public:
  ScatterAddBackward(int64_t dim, const Tensor& index) : dim_(dim), index_(index, false) {}
  TensorList apply(TensorList&& grads) override {
    const Tensor index = index_.unpack(this);
    if (NoIncomingGrad(grads)) return {Tensor()};
    return {gather(grads[0], dim_, index)};
  }
  std::string name() const override { return "ScatterAddBackward0"; }
  void release_variables() override { index_.reset(); }

 private:
  const int64_t dim_;
  SavedVariable index_;
};

// ---------------------------------------------------------------------------------------------
// Index checks shared by each pair.

}  // namespace

int64_t CheckIndexSelectArgs(const char* op, const char* source_arg,
                             absl::Span<const int64_t> shape, int64_t dim, const Tensor& index,
                             std::optional<int64_t> skip) {
  dim = WrapDimArg(op, "dim", dim, shape);
  CheckDTypeArg(op, "index", index, DType::kInt64);
  GS_CHECK_ARG(index.dim() <= 1, op, ": index must be 0-d or 1-d, got shape ",
               ShapeToString(index.shape()));
  const int64_t bound = shape.empty() ? 1 : shape[dim];
  CheckIndices(
      op, "index", index, bound, skip,
      absl::StrCat("dimension ", dim, " of ", source_arg, " with shape ", ShapeToString(shape)));
  return dim;
}

namespace {

// The shape IndexSelectKernel makes.
Shape IndexSelectShape(absl::Span<const int64_t> input_shape, int64_t dim, const Tensor& index) {
  if (input_shape.empty()) return index.shape();
  Shape out(input_shape.begin(), input_shape.end());
  out[dim] = index.numel();
  return out;
}

// Checks gather / scatter_add arguments: index has the rank of a tensor of `shape`, is no larger
// in other dims than dim, and its values index dim. Returns the wrapped dim.
int64_t CheckGatherArgs(const char* op, absl::Span<const int64_t> shape, int64_t dim,
                        const Tensor& index) {
  dim = WrapDimArg(op, "dim", dim, shape);
  CheckDTypeArg(op, "index", index, DType::kInt64);
  const int64_t rank = static_cast<int64_t>(shape.size());
  GS_CHECK_ARG(index.dim() == rank, op, ": index (shape ", ShapeToString(index.shape()),
               ") must have as many dimensions as input (shape ", ShapeToString(shape), ")");
  for (int64_t d = 0; d < rank; ++d) {
    GS_CHECK_ARG(d == dim || index.size(d) <= shape[d], op, ": index has size ", index.size(d),
                 " in dimension ", d, ", larger than input's ", shape[d], " (index shape ",
                 ShapeToString(index.shape()), ", input shape ", ShapeToString(shape), ")");
  }
  CheckIndices(op, "index", index, rank == 0 ? 1 : shape[dim], std::nullopt,
               absl::StrCat("dimension ", dim, " of input with shape ", ShapeToString(shape)));
  return dim;
}

// Walks the elements of a contiguous index (and a contiguous tensor of its shape) together with
// the element of `target` (any strides) each one addresses along dim: calls fn(i, t) where i is
// the position in index and t the offset in target. Indices must have been checked.
template <typename Fn>
void ForEachGathered(const Tensor& index, const Tensor& target, int64_t dim, Fn&& fn) {
  const int64_t* idx = index.data<int64_t>();
  Strides target_strides = target.strides();
  int64_t dim_stride = 0;
  if (!target_strides.empty()) {
    dim_stride = target_strides[dim];
    target_strides[dim] = 0;
  }
  ForEachStrided2(index.shape(), ContiguousStrides(index.shape()), target_strides,
                  [&](int64_t i, int64_t t) { fn(i, t + idx[i] * dim_stride); });
}

// ---------------------------------------------------------------------------------------------
// The CPU kernels of the stubs in shape_kernels.h.

void IndexSelectCpu(const Tensor& out, const Tensor& in, const Tensor& index,
                    const IndexGeometry& g) {
  const int64_t row_bytes = g.inner * ElementSize(in.dtype());
  if (row_bytes == 0) return;
  const char* src = static_cast<const char*>(in.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  const int64_t* iv = index.data<int64_t>();
  const int64_t element = static_cast<int64_t>(ElementSize(in.dtype()));
  WorkMeter meter;  // Note [Stopping a running op]: rows, and blocks of a long row
  for (int64_t o = 0; o < g.outer; ++o) {
    for (int64_t j = 0; j < g.n; ++j) {
      char* row = dst + (o * g.n + j) * row_bytes;
      const bool skip = g.has_skip && iv[j] == g.skip;
      const char* from = skip ? nullptr : src + (o * g.size + iv[j]) * row_bytes;
      ForEachBlock(g.inner, meter, [&](int64_t begin, int64_t end) {
        if (skip) {
          std::memset(row + begin * element, 0, (end - begin) * element);
        } else {
          std::memcpy(row + begin * element, from + begin * element, (end - begin) * element);
        }
      });
    }
  }
}

void IndexAddCpu(const Tensor& dst, const Tensor& src, const Tensor& index,
                 const IndexGeometry& g) {
  const int64_t* iv = index.data<int64_t>();
  DispatchFloating(dst.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* out = dst.data<T>();
    const T* in = src.data<T>();
    WorkMeter meter;  // Note [Stopping a running op]
    for (int64_t o = 0; o < g.outer; ++o) {
      for (int64_t j = 0; j < g.n; ++j) {
        if (g.has_skip && iv[j] == g.skip) {
          meter.Add(1);
          continue;
        }
        T* to = out + (o * g.size + iv[j]) * g.inner;
        const T* from = in + (o * g.n + j) * g.inner;
        ForEachBlock(g.inner, meter, [&](int64_t begin, int64_t end) {
          for (int64_t k = begin; k < end; ++k) to[k] += from[k];
        });
      }
    }
  });
}

void GatherCpu(const Tensor& out, const Tensor& input, const Tensor& index, int64_t dim) {
  DispatchDType(input.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* to = out.data<T>();
    const T* from = input.data<T>();
    ForEachGathered(index, input, dim, [&](int64_t i, int64_t t) { to[i] = from[t]; });
  });
}

void ScatterAddCpu(const Tensor& out, const Tensor& src, const Tensor& index, int64_t dim) {
  DispatchFloating(src.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* to = out.data<T>();
    const T* from = src.data<T>();
    ForEachGathered(index, out, dim, [&](int64_t i, int64_t t) { to[t] += from[i]; });
  });
}

// The index as a contiguous tensor the kernels for `device` can read: moved there when it is
// elsewhere and one of the two is not host memory (a GPU's kernels cannot read a host index).
Tensor IndexFor(const Tensor& index, Device device) {
  auto& registry = DeviceRegistry::Get();
  if (index.device() != device &&
      !(registry.host_accessible(index.device()) && registry.host_accessible(device))) {
    return index.To(device).contiguous();
  }
  return index.contiguous();
}

// The [outer, size, inner] view of index_select / index_add around dim of `shape` (a 0-d
// shape counts as [1]), with n indices and the skip.
IndexGeometry IndexGeometryOf(absl::Span<const int64_t> shape, int64_t dim, int64_t n,
                              std::optional<int64_t> skip) {
  const Shape s = shape.empty() ? Shape{1} : Shape(shape.begin(), shape.end());
  IndexGeometry g;
  g.outer = ProductOf(s, 0, dim);
  g.size = s[dim];
  g.inner = ProductOf(s, dim + 1, s.size());
  g.n = n;
  g.has_skip = skip.has_value();
  g.skip = skip.value_or(0);
  return g;
}

}  // namespace

StubFor<IndexSelectFn> index_select_stub("index_select", &IndexSelectCpu);
StubFor<IndexAddFn> index_add_stub("index_add", &IndexAddCpu);
StubFor<GatherFn> gather_stub("gather", &GatherCpu);
StubFor<ScatterAddFn> scatter_add_stub("scatter_add", &ScatterAddCpu);

// ---------------------------------------------------------------------------------------------
// Kernels declared in shape_common.h.

Tensor IndexSelectKernel(const Tensor& input, int64_t dim, const Tensor& index,
                         std::optional<int64_t> skip) {
  const Tensor in = input.contiguous();
  const Tensor idx = IndexFor(index, input.device());
  Tensor out =
      Tensor::Empty(IndexSelectShape(input.shape(), dim, index), input.dtype(), input.device());
  if (out.numel() == 0) return out;
  index_select_stub(input.device(), out, in, idx,
                    IndexGeometryOf(input.shape(), dim, idx.numel(), skip));
  return out;
}

void IndexAddKernel(const Tensor& dst, int64_t dim, const Tensor& index, const Tensor& src,
                    std::optional<int64_t> skip) {
  // Nothing to add into an empty dst or from an empty src (an empty tensor's strides need not
  // be contiguous ones).
  if (dst.numel() == 0 || src.numel() == 0) return;
  GS_CHECK_INTERNAL(dst.is_contiguous() && IsFloating(dst.dtype()) && dst.dtype() == src.dtype());
  GS_CHECK_INTERNAL(dst.device() == src.device(), "index_add across devices");
  const Tensor s = src.contiguous();
  const Tensor idx = IndexFor(index, dst.device());
  if (s.numel() == 0) return;
  index_add_stub(dst.device(), dst, s, idx, IndexGeometryOf(dst.shape(), dim, idx.numel(), skip));
}

// ---------------------------------------------------------------------------------------------
// Ops.

Tensor reshape(const Tensor& input, absl::Span<const int64_t> shape) {
  GS_CHECK_ARG(input.defined(), "reshape: input is missing");
  const Shape new_shape = InferReshape(input, shape);
  Tensor out;
  const auto strides = ViewStrides(input.shape(), input.strides(), new_shape);
  if (strides.has_value()) {
    out = input.AsStrided(new_shape, *strides, input.storage_offset());
  } else {
    const Tensor packed = input.Clone();
    out = packed.AsStrided(new_shape, ContiguousStrides(new_shape), packed.storage_offset());
  }
  RecordIfNeeded(out, {input},
                 [&] { return MakeNode<ReshapeToInputBackward>("ViewBackward0", input.shape()); });
  if (strides.has_value()) MarkView(out, input);
  return out;
}

Tensor transpose(const Tensor& input, int64_t dim0, int64_t dim1) {
  GS_CHECK_ARG(input.defined(), "transpose: input is missing");
  dim0 = WrapDimArg("transpose", "dim0", dim0, input.shape());
  dim1 = WrapDimArg("transpose", "dim1", dim1, input.shape());
  Shape shape = input.shape();
  Strides strides = input.strides();
  if (input.dim() > 0) {
    std::swap(shape[dim0], shape[dim1]);
    std::swap(strides[dim0], strides[dim1]);
  }
  Tensor out = input.AsStrided(shape, strides, input.storage_offset());
  RecordIfNeeded(out, {input}, [&] { return MakeNode<TransposeBackward>(dim0, dim1); });
  MarkView(out, input);
  return out;
}

Tensor permute(const Tensor& input, absl::Span<const int64_t> dims) {
  GS_CHECK_ARG(input.defined(), "permute: input is missing");
  const int64_t rank = input.dim();
  GS_CHECK_ARG(static_cast<int64_t>(dims.size()) == rank, "permute: dims ", ShapeToString(dims),
               " must name each of the ", rank, " dimensions of input with shape ",
               ShapeToString(input.shape()), " once");
  Shape shape(rank);
  Strides strides(rank);
  std::vector<int64_t> inverse(rank, -1);
  for (int64_t i = 0; i < rank; ++i) {
    const int64_t d = WrapDimArg("permute", "dims", dims[i], input.shape());
    GS_CHECK_ARG(inverse[d] < 0, "permute: dims ", ShapeToString(dims), " repeats dimension ", d);
    inverse[d] = i;
    shape[i] = input.shape()[d];
    strides[i] = input.strides()[d];
  }
  Tensor out = input.AsStrided(shape, strides, input.storage_offset());
  RecordIfNeeded(out, {input}, [&] { return MakeNode<PermuteBackward>(std::move(inverse)); });
  MarkView(out, input);
  return out;
}

Tensor expand(const Tensor& input, absl::Span<const int64_t> size) {
  GS_CHECK_ARG(input.defined(), "expand: input is missing");
  const int64_t rank = input.dim();
  const int64_t new_rank = static_cast<int64_t>(size.size());
  GS_CHECK_ARG(new_rank >= rank, "expand: size ", ShapeToString(size), " has fewer dimensions ",
               "than input with shape ", ShapeToString(input.shape()));
  const int64_t lead = new_rank - rank;
  Shape shape(new_rank);
  Strides strides(new_rank);
  for (int64_t i = 0; i < new_rank; ++i) {
    if (i < lead) {
      GS_CHECK_ARG(size[i] >= 0, "expand: size ", ShapeToString(size), " has ", size[i],
                   " at new leading dimension ", i, "; only existing dimensions may be -1");
      shape[i] = size[i];
      strides[i] = 0;
      continue;
    }
    const int64_t have = input.shape()[i - lead];
    const int64_t want = size[i] == -1 ? have : size[i];
    if (want == have) {
      shape[i] = have;
      strides[i] = input.strides()[i - lead];
    } else {
      GS_CHECK_ARG(have == 1 && want >= 0, "expand: size ", ShapeToString(size), " asks for ",
                   size[i], " at dimension ", i, " where input with shape ",
                   ShapeToString(input.shape()), " has ", have,
                   "; only size-1 dimensions can be expanded");
      shape[i] = want;
      strides[i] = 0;
    }
  }
  ValueOrThrow(CheckedNumel(shape));
  Tensor out = input.AsStrided(shape, strides, input.storage_offset());
  RecordIfNeeded(out, {input}, [&] { return MakeNode<ExpandBackward>(input.shape()); });
  MarkView(out, input);
  return out;
}

Tensor squeeze(const Tensor& input, std::optional<int64_t> dim) {
  GS_CHECK_ARG(input.defined(), "squeeze: input is missing");
  Shape shape;
  Strides strides;
  std::optional<int64_t> only;
  if (dim.has_value()) only = WrapDimArg("squeeze", "dim", *dim, input.shape());
  for (int64_t d = 0; d < input.dim(); ++d) {
    const bool drop = input.shape()[d] == 1 && (!only.has_value() || *only == d);
    if (drop) continue;
    shape.push_back(input.shape()[d]);
    strides.push_back(input.strides()[d]);
  }
  Tensor out = input.AsStrided(shape, strides, input.storage_offset());
  RecordIfNeeded(out, {input}, [&] {
    return MakeNode<ReshapeToInputBackward>(
        dim.has_value() ? "SqueezeBackward1" : "SqueezeBackward0", input.shape());
  });
  MarkView(out, input);
  return out;
}

Tensor unsqueeze(const Tensor& input, int64_t dim) {
  GS_CHECK_ARG(input.defined(), "unsqueeze: input is missing");
  dim = WrapInsertDimArg("unsqueeze", "dim", dim, input.shape());
  // PyTorch's stride for the new dim: the span of the dim it goes before. That product can
  // pass int64 only when the tensor has no elements (shape [2^63 - 1, 4, 0]: the fuzzer's find),
  // whose strides reach no memory; then any stride will do.
  int64_t stride = 1;
  if (dim < input.dim() &&
      __builtin_mul_overflow(input.shape()[dim], input.strides()[dim], &stride)) {
    stride = 1;
  }
  Strides strides = input.strides();
  strides.insert(strides.begin() + dim, stride);
  Tensor out = input.AsStrided(ShapeWith(input.shape(), dim, 1), strides, input.storage_offset());
  RecordIfNeeded(out, {input}, [&] { return MakeNode<UnsqueezeBackward>(dim); });
  MarkView(out, input);
  return out;
}

// Note [Promotion in cat and stack]
// cat and stack take tensors of any dtypes and make the result in their promoted dtype
// (torch.cat's result_type over the list: bool < int64 < float32 < float64; the tensors all
// have dims, so none is a "wrapped number"). Each tensor of another dtype is converted with the
// differentiable `to`, so its gradient comes back in its own dtype, as PyTorch's CatBackward0
// converts it. As PyTorch 1.13 still does, cat skips a 1-d tensor of size 0 (a legacy "empty"
// tensor) when it checks and joins the shapes; it gets an empty gradient.
namespace {

// The tensors converted to their promoted dtype (Note [Promotion in cat and stack]).
std::vector<Tensor> Promoted(absl::Span<const Tensor> tensors) {
  DType dtype = tensors[0].dtype();
  for (const Tensor& t : tensors) dtype = PromoteTypes(dtype, t.dtype());
  std::vector<Tensor> out;
  out.reserve(tensors.size());
  for (const Tensor& t : tensors) out.push_back(t.dtype() == dtype ? t : to(t, dtype));
  return out;
}

bool LegacyEmpty(const Tensor& t) { return t.dim() == 1 && t.size(0) == 0; }

}  // namespace

Tensor cat(absl::Span<const Tensor> tensors_in, int64_t dim) {
  GS_CHECK_ARG(!tensors_in.empty(), "cat: expected a non-empty list of tensors");
  for (size_t i = 0; i < tensors_in.size(); ++i) {
    GS_CHECK_ARG(tensors_in[i].defined(), "cat: tensors[", i, "] is missing");
    GS_CHECK_ARG(tensors_in[i].dim() > 0, "cat: tensors[", i,
                 "] is 0-d; zero-dimensional tensors cannot be concatenated");
    GS_CHECK_ARG(tensors_in[i].device() == tensors_in[0].device(), "cat: tensors[", i, "] is ",
                 tensors_in[i].DebugString(), " but tensors[0] is ", tensors_in[0].DebugString());
  }
  const std::vector<Tensor> tensors = Promoted(tensors_in);
  // The shape comes from the first tensor that is not a legacy empty one (if all are, the
  // result is one of them: empty, 1-d).
  size_t reference = 0;
  while (reference + 1 < tensors.size() && LegacyEmpty(tensors[reference])) ++reference;
  const Tensor& first = tensors[reference];
  dim = WrapDimArg("cat", "dim", dim, first.shape());
  Shape shape = first.shape();
  std::vector<int64_t> sizes;
  sizes.reserve(tensors.size());
  int64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (i != reference && LegacyEmpty(t) && !LegacyEmpty(first)) {
      sizes.push_back(CatBackward::kSkipped);
      continue;
    }
    bool match = t.dim() == first.dim();
    for (int64_t d = 0; match && d < t.dim(); ++d) match = d == dim || t.size(d) == first.size(d);
    GS_CHECK_ARG(match, "cat: sizes must match except in dimension ", dim, ": tensors[", reference,
                 "] has shape ", ShapeToString(first.shape()), " but tensors[", i, "] has shape ",
                 ShapeToString(t.shape()));
    GS_CHECK_ARG(!__builtin_add_overflow(total, t.size(dim), &total),
                 "cat: the result is too large");
    sizes.push_back(t.size(dim));
  }
  shape[dim] = total;
  Tensor out = Tensor::Empty(shape, first.dtype(), first.device());
  int64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (sizes[i] == CatBackward::kSkipped) continue;
    CopyInto(NarrowView(out, dim, offset, sizes[i]), tensors[i]);
    offset += sizes[i];
  }
  RecordIfNeeded(out, absl::MakeConstSpan(tensors),
                 [&] { return MakeNode<CatBackward>(dim, std::move(sizes)); });
  return out;
}

Tensor stack(absl::Span<const Tensor> tensors_in, int64_t dim) {
  GS_CHECK_ARG(!tensors_in.empty(), "stack: expected a non-empty list of tensors");
  GS_CHECK_ARG(tensors_in[0].defined(), "stack: tensors[0] is missing");
  for (size_t i = 0; i < tensors_in.size(); ++i) {
    const Tensor& t = tensors_in[i];
    GS_CHECK_ARG(t.defined(), "stack: tensors[", i, "] is missing");
    GS_CHECK_ARG(t.shape() == tensors_in[0].shape(), "stack: tensors must have one shape, but ",
                 "tensors[0] has shape ", ShapeToString(tensors_in[0].shape()), " and tensors[", i,
                 "] has shape ", ShapeToString(t.shape()));
    GS_CHECK_ARG(t.device() == tensors_in[0].device(), "stack: tensors[", i, "] is ",
                 t.DebugString(), " but tensors[0] is ", tensors_in[0].DebugString());
  }
  const std::vector<Tensor> tensors = Promoted(tensors_in);  // Note [Promotion in cat and stack]
  const Tensor& first = tensors[0];
  dim = WrapInsertDimArg("stack", "dim", dim, first.shape());
  const int64_t count = static_cast<int64_t>(tensors.size());
  Tensor out = Tensor::Empty(ShapeWith(first.shape(), dim, count), first.dtype(), first.device());
  for (int64_t i = 0; i < count; ++i) CopyInto(SelectView(out, dim, i), tensors[i]);
  RecordIfNeeded(out, absl::MakeConstSpan(tensors),
                 [&] { return MakeNode<StackBackward>(dim, count); });
  return out;
}

Tensor narrow(const Tensor& input, int64_t dim, int64_t start, int64_t length) {
  GS_CHECK_ARG(input.defined(), "narrow: input is missing");
  GS_CHECK_ARG(input.dim() > 0, "narrow: input must have at least one dimension, got shape []");
  dim = WrapDimArg("narrow", "dim", dim, input.shape());
  const int64_t size = input.size(dim);
  GS_CHECK_ARG(start >= -size && start <= size, "narrow: start = ", start,
               " is out of range for dimension ", dim, " of size ", size, " (input shape ",
               ShapeToString(input.shape()), ")");
  const int64_t begin = start < 0 ? start + size : start;
  GS_CHECK_ARG(length >= 0 && length <= size - begin, "narrow: length = ", length, " from start ",
               begin, " exceeds dimension ", dim, " of size ", size, " (input shape ",
               ShapeToString(input.shape()), ")");
  Tensor out = NarrowView(input, dim, begin, length);
  RecordIfNeeded(out, {input}, [&] {
    return MakeNode<PadBackward>("SliceBackward0", input.shape(), dim, begin, false);
  });
  MarkView(out, input);
  return out;
}

Tensor select(const Tensor& input, int64_t dim, int64_t index) {
  GS_CHECK_ARG(input.defined(), "select: input is missing");
  GS_CHECK_ARG(input.dim() > 0, "select: input must have at least one dimension, got shape []");
  dim = WrapDimArg("select", "dim", dim, input.shape());
  const int64_t size = input.size(dim);
  GS_CHECK_ARG(index >= -size && index < size, "select: index = ", index,
               " is out of range for dimension ", dim, " of size ", size, " (input shape ",
               ShapeToString(input.shape()), ")");
  const int64_t at = index < 0 ? index + size : index;
  Tensor out = SelectView(input, dim, at);
  RecordIfNeeded(out, {input}, [&] {
    return MakeNode<PadBackward>("SelectBackward0", input.shape(), dim, at, true);
  });
  MarkView(out, input);
  return out;
}

Tensor index_select(const Tensor& input, int64_t dim, const Tensor& index) {
  return IndexSelectSkipping(input, dim, index, std::nullopt);
}

Tensor IndexSelectSkipping(const Tensor& input, int64_t dim, const Tensor& index,
                           std::optional<int64_t> skip) {
  GS_CHECK_ARG(input.defined(), "index_select: input is missing");
  dim = CheckIndexSelectArgs("index_select", "input", input.shape(), dim, index, skip);
  Tensor out = IndexSelectKernel(input, dim, index, skip);
  RecordIfNeeded(out, {input},
                 [&] { return MakeNode<IndexSelectBackward>(input.shape(), dim, index, skip); });
  return out;
}

Tensor IndexAddIntoZeros(absl::Span<const int64_t> shape, int64_t dim, const Tensor& index,
                         const Tensor& source, std::optional<int64_t> skip) {
  RequireFloating("index_add", "source", source);
  dim = CheckIndexSelectArgs("index_add", "self", shape, dim, index, skip);
  const Shape want = IndexSelectShape(shape, dim, index);
  GS_CHECK_ARG(source.shape() == want, "index_add: source has shape ",
               ShapeToString(source.shape()), " but ", ShapeToString(want),
               " is needed to add into shape ", ShapeToString(shape), " along dimension ", dim);
  Tensor out = Tensor::Zeros(shape, source.dtype(), source.device());
  IndexAddKernel(out, dim, index, source, skip);
  RecordIfNeeded(out, {source}, [&] { return MakeNode<IndexAddBackward>(dim, index, skip); });
  return out;
}

Tensor gather(const Tensor& input, int64_t dim, const Tensor& index) {
  GS_CHECK_ARG(input.defined(), "gather: input is missing");
  dim = CheckGatherArgs("gather", input.shape(), dim, index);
  const Tensor idx = IndexFor(index, input.device());
  Tensor out = Tensor::Empty(index.shape(), input.dtype(), input.device());
  if (out.numel() > 0) gather_stub(input.device(), out, input, idx, dim);
  RecordIfNeeded(out, {input}, [&] { return MakeNode<GatherBackward>(input.shape(), dim, index); });
  return out;
}

Tensor ScatterAddIntoZeros(absl::Span<const int64_t> shape, int64_t dim, const Tensor& index,
                           const Tensor& src) {
  RequireFloating("scatter_add", "src", src);
  dim = CheckGatherArgs("scatter_add", shape, dim, index);
  GS_CHECK_ARG(src.shape() == index.shape(), "scatter_add: src has shape ",
               ShapeToString(src.shape()), " but index has shape ", ShapeToString(index.shape()));
  const Tensor idx = IndexFor(index, src.device());
  const Tensor s = src.contiguous();
  Tensor out = Tensor::Zeros(shape, src.dtype(), src.device());
  if (s.numel() > 0) scatter_add_stub(src.device(), out, s, idx, dim);
  RecordIfNeeded(out, {src}, [&] { return MakeNode<ScatterAddBackward>(dim, index); });
  return out;
}

Tensor PadAlongDim(const Tensor& slice, absl::Span<const int64_t> shape, int64_t dim,
                   int64_t start) {
  const int64_t after = shape[dim] - start - slice.size(dim);
  GS_CHECK_INTERNAL(start >= 0 && after >= 0, "PadAlongDim outside the shape");
  if (start == 0 && after == 0) return slice;
  TensorList parts;
  Shape pad(shape.begin(), shape.end());
  if (start > 0) {
    pad[dim] = start;
    parts.push_back(Tensor::Zeros(pad, slice.dtype(), slice.device()));
  }
  parts.push_back(slice);
  if (after > 0) {
    pad[dim] = after;
    parts.push_back(Tensor::Zeros(pad, slice.dtype(), slice.device()));
  }
  return cat(parts, dim);
}

}  // namespace gradserve::ops
