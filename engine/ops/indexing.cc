#include "engine/ops/indexing.h"

#include <algorithm>
#include <vector>

#include "engine/kernels/basic_kernels.h"
#include "engine/kernels/op_kernels.h"
#include "engine/ops/broadcast.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/formula_node.h"
#include "engine/ops/inplace.h"
#include "engine/ops/shape.h"
#include "engine/ops/shape_common.h"
#include "engine/util/cancellation.h"
#include "engine/util/wrapping.h"

namespace gradserve::ops {
namespace {

// Wraps each of dims for op, refusing repeats.
std::vector<int64_t> DistinctDims(const char* op, absl::Span<const int64_t> dims,
                                  const Tensor& input) {
  std::vector<int64_t> out;
  for (int64_t d : dims) {
    const int64_t w = WrapDimArg(op, "dims", d, input.shape());
    GS_CHECK_ARG(std::find(out.begin(), out.end(), w) == out.end(), op, ": dim ", w,
                 " appears more than once in dims");
    out.push_back(w);
  }
  return out;
}

// out[.., k, ..] = sum of in[.., 0..k, ..] along the middle dim of [outer, size, inner], in
// accumulators of type Acc.
template <typename T, typename Acc, typename Out>
void CumsumKernel(const T* in, Out* out, int64_t outer, int64_t size, int64_t inner) {
  WorkMeter meter;  // Note [Stopping a running op]
  ForEachBlock(
      outer * inner, meter,
      [&](int64_t begin, int64_t end) {
        for (int64_t row = begin; row < end; ++row) {
          const int64_t base = (row / inner) * size * inner + row % inner;
          Acc total = 0;
          for (int64_t k = 0; k < size; ++k) {
            total = WrapAdd(total, static_cast<Acc>(in[base + k * inner]));
            out[base + k * inner] = static_cast<Out>(total);
          }
        }
      },
      std::max<int64_t>(1, kWorkPerCheck / std::max<int64_t>(1, size)));
}

// cumsum without autograd, on the host.
Tensor CumsumValues(const Tensor& input, int64_t dim) {
  const Tensor x = (input.device().type == DeviceType::kCUDA ? input.To(kCPU) : input).contiguous();
  const DType out_dtype = IsFloating(x.dtype()) ? x.dtype() : DType::kInt64;
  Tensor out = Tensor::Empty(x.shape(), out_dtype, x.device());
  const int64_t rank = x.dim();
  const int64_t size = rank == 0 ? 1 : x.size(dim);
  const int64_t outer = rank == 0 ? 1 : ProductOf(x.shape(), 0, dim);
  const int64_t inner = rank == 0 ? 1 : ProductOf(x.shape(), dim + 1, rank);
  if (out.numel() > 0) {
    switch (x.dtype()) {
      case DType::kFloat32:
        CumsumKernel<float, double>(x.data<float>(), out.data<float>(), outer, size, inner);
        break;
      case DType::kFloat64:
        CumsumKernel<double, double>(x.data<double>(), out.data<double>(), outer, size, inner);
        break;
      case DType::kInt64:
        CumsumKernel<int64_t, int64_t>(x.data<int64_t>(), out.data<int64_t>(), outer, size, inner);
        break;
      case DType::kBool:
        CumsumKernel<bool, int64_t>(x.data<bool>(), out.data<int64_t>(), outer, size, inner);
        break;
      case DType::kFloat16:
      case DType::kBFloat16:
        GS_CHECK_INTERNAL(false, "a 16-bit float reached a float32 kernel");
    }
  }
  return input.device() == out.device() ? out : out.To(input.device());
}

}  // namespace

Tensor flip(const Tensor& input, absl::Span<const int64_t> dims) {
  RequireDefined("flip", "input", input);
  Tensor out = input;
  for (int64_t d : DistinctDims("flip", dims, input)) {
    if (input.dim() == 0) break;
    const int64_t n = input.size(d);
    out = index_select(out, d,
                       PositionIndex(n, input.device(), [n](int64_t k) { return n - 1 - k; }));
  }
  return out;
}

Tensor roll(const Tensor& input, absl::Span<const int64_t> shifts, absl::Span<const int64_t> dims) {
  RequireDefined("roll", "input", input);
  if (dims.empty()) {
    GS_CHECK_ARG(shifts.size() == 1, "roll: without dims, shifts must hold one value, got ",
                 shifts.size());
    const int64_t flat[] = {-1};
    const int64_t zero[] = {0};
    return reshape(roll(reshape(input, flat), shifts, zero), input.shape());
  }
  GS_CHECK_ARG(shifts.size() == dims.size(), "roll: shifts (", shifts.size(), " values) and dims (",
               dims.size(), " values) must have the same length");
  Tensor out = input;
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = WrapDimArg("roll", "dims", dims[i], input.shape());
    const int64_t n = input.dim() == 0 ? 1 : input.size(d);
    if (n == 0 || input.dim() == 0) continue;
    const int64_t shift = ((shifts[i] % n) + n) % n;
    if (shift == 0) continue;
    // Position k takes the element shift places before it.
    out = index_select(out, d, PositionIndex(n, input.device(), [n, shift](int64_t k) {
                         return (k - shift + n) % n;
                       }));
  }
  return out;
}

Tensor slice(const Tensor& input, int64_t dim, std::optional<int64_t> start,
             std::optional<int64_t> end, int64_t step) {
  RequireDefined("slice", "input", input);
  GS_CHECK_ARG(input.dim() > 0, "slice: input must have at least one dimension, got shape []");
  GS_CHECK_ARG(step >= 1, "slice: step = ", step, " must be positive");
  dim = WrapDimArg("slice", "dim", dim, input.shape());
  const int64_t size = input.size(dim);
  // Python's rules: negative counts from the end, then clamped into [0, size].
  auto clamp_bound = [size](int64_t v) {
    if (v < 0) v += size;
    return std::clamp<int64_t>(v, 0, size);
  };
  const int64_t begin = clamp_bound(start.value_or(0));
  const int64_t stop = std::max(begin, clamp_bound(end.value_or(size)));
  // Rounded up, without stop - begin + step - 1, which overflows for a huge step.
  const int64_t length = stop == begin ? 0 : 1 + (stop - begin - 1) / step;
  if (step == 1) return narrow(input, dim, begin, length);
  Shape shape = input.shape();
  shape[dim] = length;
  Strides strides = input.strides();
  const int64_t offset = OffsetAlong(input, dim, begin);
  // With two or more elements, step < size, so the product is within the storage's reach.
  if (length > 1) strides[dim] *= step;
  Tensor out = input.AsStrided(shape, strides, offset);
  RecordFormula(
      out, {input}, "SliceBackward0",
      [in_shape = Shape(input.shape()), dim, begin, step, length](const FormulaBackward&,
                                                                  const Tensor& g) -> TensorList {
        const Tensor index = PositionIndex(length, g.device(),
                                           [begin, step](int64_t k) { return begin + k * step; });
        // The index_add kernel is float32's: a 16-bit gradient goes through it in
        // float32, both conversions recorded (Note [Ops on 16-bit floats]).
        if (!IsHalfFloating(g.dtype())) return {IndexAddIntoZeros(in_shape, dim, index, g)};
        return {to(IndexAddIntoZeros(in_shape, dim, index, to(g, DType::kFloat32)), g.dtype())};
      });
  MarkView(out, input);
  return out;
}

Tensor scatter_add(const Tensor& input, int64_t dim, const Tensor& index, const Tensor& src) {
  RequireDefined("scatter_add", "input", input);
  RequireDefined("scatter_add", "index", index);
  RequireDefined("scatter_add", "src", src);
  GS_CHECK_ARG(src.dtype() == input.dtype(), "scatter_add: src is ", DTypeName(src.dtype()),
               " but input is ", DTypeName(input.dtype()));
  GS_CHECK_ARG(index.dim() == src.dim(), "scatter_add: index (shape ", ShapeToString(index.shape()),
               ") must have as many dimensions as src (shape ", ShapeToString(src.shape()), ")");
  Tensor used = src;
  for (int64_t d = 0; d < index.dim(); ++d) {
    GS_CHECK_ARG(index.size(d) <= src.size(d), "scatter_add: index has size ", index.size(d),
                 " in dimension ", d, ", larger than src's ", src.size(d), " (index shape ",
                 ShapeToString(index.shape()), ", src shape ", ShapeToString(src.shape()), ")");
    if (index.size(d) < src.size(d)) used = narrow(used, d, 0, index.size(d));
  }
  return add(input, ScatterAddIntoZeros(input.shape(), dim, index, used));
}

Tensor index_add(const Tensor& input, int64_t dim, const Tensor& index, const Tensor& source,
                 double alpha) {
  RequireDefined("index_add", "input", input);
  RequireDefined("index_add", "source", source);
  GS_CHECK_ARG(source.dtype() == input.dtype(), "index_add: source is ", DTypeName(source.dtype()),
               " but input is ", DTypeName(input.dtype()));
  return add(input, IndexAddIntoZeros(input.shape(), dim, index,
                                      alpha == 1 ? source : mul(source, alpha)));
}

// --- index_copy, index_put (Note [Indexed writes]) ---

namespace {

// Refuses a position written twice: `where` names what the positions index.
void CheckNoRepeats(const char* op, const Tensor& positions, const std::string& where) {
  const Tensor host = positions.To(kCPU).contiguous();
  const int64_t* p = host.data<int64_t>();
  std::vector<int64_t> sorted(p, p + host.numel());
  std::sort(sorted.begin(), sorted.end());
  const auto repeat = std::adjacent_find(sorted.begin(), sorted.end());
  GS_CHECK_ARG(repeat == sorted.end(), op, ": ", where, " ", *repeat,
               " is written more than once; which write would win is undefined (in PyTorch "
               "too): pass accumulate to add them, or write each position once");
}

// The write both ops reduce to: into `into` (self) or else a copy of input, seen as
// `layout` = [outer, size, inner], source ([outer, index.numel(), inner], the same dtype) is
// written (accumulate: added) at slices index[j] of the middle dim; index is 1-d int64 in
// [0, size), checked. Records node_name over (input, source).
Tensor IndexWrite(const char* op, const char* node_name, const Tensor& input, const Tensor* into,
                  const std::array<int64_t, 3>& layout, const Tensor& index, const Tensor& source,
                  bool accumulate) {
  if (!accumulate) CheckNoRepeats(op, index, "position");
  const Tensor dst = into != nullptr ? *into : input.Clone();
  // Read before the write when it shares self's elements (Note [In-place ops]).
  const Tensor src = OriginalSelf(source, into != nullptr && SharesElements(source, *into));
  const Tensor work = dst.is_contiguous() ? dst : dst.Clone();
  const Tensor flat = work.AsStrided(layout, ContiguousStrides(layout), work.storage_offset());
  if (!accumulate) {
    const Tensor host = index.To(kCPU);
    const int64_t* at = host.data<int64_t>();
    for (int64_t j = 0; j < host.numel(); ++j) {
      const int64_t slice_shape[] = {layout[0], layout[2]};
      const int64_t slice_strides[] = {layout[1] * layout[2], 1};
      Fill(flat.AsStrided(slice_shape, slice_strides, flat.storage_offset() + at[j] * layout[2]),
           0);
    }
  }
  IndexAddKernel(flat, 1, index, src.detach(), std::nullopt);
  if (!work.is_same(dst)) CopyInto(dst, work);
  if (into != nullptr) dst.BumpVersion();
  Tensor out = dst;
  const Shape input_shape = input.shape();
  RecordFormula(out, {input, src}, node_name,
                [input_shape, layout, index, accumulate](const FormulaBackward& n,
                                                         const Tensor& g) -> TensorList {
                  TensorList r(2);
                  const Tensor g3 = reshape(g, layout);
                  if (n.Needs(0)) {
                    if (accumulate) {
                      r[0] = g;
                    } else {
                      Tensor written = Tensor::Zeros({layout[1]}, DType::kBool);
                      const Tensor host = index.To(kCPU);
                      for (int64_t j = 0; j < host.numel(); ++j) {
                        written.data<bool>()[host.data<int64_t>()[j]] = true;
                      }
                      const int64_t mask_shape[] = {1, layout[1], 1};
                      written = reshape(written.To(g.device()), mask_shape);
                      r[0] = reshape(where(written, Tensor::Scalar(0, g.dtype(), g.device()), g3),
                                     input_shape);
                    }
                  }
                  if (n.Needs(1)) r[1] = index_select(g3, 1, index);
                  return r;
                });
  return out;
}

// The checks and layout of index_copy; source reshaped to the layout.
Tensor IndexCopy(const char* op, const Tensor& input, const Tensor* into, int64_t dim,
                 const Tensor& index, const Tensor& source) {
  RequireDefined(op, "input", input);
  RequireFloating(op, "input", input);
  RequireDefined(op, "source", source);
  GS_CHECK_ARG(source.dtype() == input.dtype(), op, ": source is ", DTypeName(source.dtype()),
               " but input is ", DTypeName(input.dtype()));
  GS_CHECK_ARG(
      source.device() == input.device() && index.defined() && index.device() == input.device(), op,
      ": input, index and source must be on one device");
  const Shape shape = input.dim() == 0 ? Shape{1} : input.shape();
  dim = CheckIndexSelectArgs(op, "input", shape, dim, index, std::nullopt);
  const Shape want =
      input.dim() == 0 ? index.shape() : ShapeWith(ShapeWithout(shape, dim), dim, index.numel());
  GS_CHECK_ARG(source.shape() == want, op, ": source has shape ", ShapeToString(source.shape()),
               " but ", ShapeToString(want), " is needed to write into input with shape ",
               ShapeToString(input.shape()), " along dimension ", dim);
  const std::array<int64_t, 3> layout = {ProductOf(shape, 0, dim), shape[dim],
                                         ProductOf(shape, dim + 1, shape.size())};
  const int64_t source_layout[] = {layout[0], index.numel(), layout[2]};
  const int64_t flat[] = {-1};
  return IndexWrite(op, "IndexCopyBackward0", input, into, layout, reshape(index, flat),
                    reshape(source, source_layout), false);
}

// The checks of index_put, and its indices as one flat position along input's leading
// indices.size() dims flattened; source is values broadcast and reshaped to the layout.
Tensor IndexPut(const char* op, const Tensor& input, const Tensor* into,
                absl::Span<const Tensor> indices, const Tensor& values, bool accumulate) {
  RequireDefined(op, "input", input);
  RequireFloating(op, "input", input);
  RequireDefined(op, "values", values);
  GS_CHECK_ARG(values.dtype() == input.dtype(), op, ": values is ", DTypeName(values.dtype()),
               " but input is ", DTypeName(input.dtype()));
  GS_CHECK_ARG(values.device() == input.device(), op, ": values is on ", values.DebugString(),
               " but input is ", input.DebugString());
  const int64_t k = static_cast<int64_t>(indices.size());
  GS_CHECK_ARG(k >= 1 && k <= input.dim(), op, ": ", k, " index tensors for input with shape ",
               ShapeToString(input.shape()), "; give one to ", input.dim(),
               ", for its leading "
               "dims");
  Shape index_shape;
  for (int64_t i = 0; i < k; ++i) {
    const std::string arg = absl::StrCat("indices[", i, "]");
    CheckDTypeArg(op, arg.c_str(), indices[i], DType::kInt64);
    index_shape = BroadcastShapesOrThrow(op, index_shape, indices[i].shape());
  }
  const int64_t n = ValueOrThrow(CheckedNumel(index_shape));
  // position = sum over i of index_i (wrapped) * the product of input's dims i+1..k-1.
  Tensor position = Tensor::Zeros({n}, DType::kInt64);
  int64_t* p = position.data<int64_t>();
  int64_t step = 1;
  for (int64_t i = k - 1; i >= 0; --i) {
    const int64_t size = input.size(i);
    const Tensor idx = broadcast_to(indices[i].To(kCPU), index_shape).contiguous();
    const int64_t* v = idx.data<int64_t>();
    for (int64_t j = 0; j < n; ++j) {
      GS_CHECK_ARG(v[j] >= -size && v[j] < size, op, ": indices[", i, "] holds ", v[j],
                   ", out of range for dimension ", i, " of input with shape ",
                   ShapeToString(input.shape()));
      p[j] += (v[j] < 0 ? v[j] + size : v[j]) * step;
    }
    step *= size;
  }
  const Shape rest(input.shape().begin() + k, input.shape().end());
  Shape target = index_shape;
  target.insert(target.end(), rest.begin(), rest.end());
  const std::array<int64_t, 3> layout = {1, step, ProductOf(input.shape(), k, input.dim())};
  const int64_t source_layout[] = {1, n, layout[2]};
  return IndexWrite(op, "IndexPutBackward0", input, into, layout, position.To(input.device()),
                    reshape(broadcast_to(values, target), source_layout), accumulate);
}

}  // namespace

Tensor index_copy(const Tensor& input, int64_t dim, const Tensor& index, const Tensor& source) {
  return IndexCopy("index_copy", input, nullptr, dim, index, source);
}

Tensor index_copy_(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& source) {
  CheckInPlace("index_copy_", self, {source});
  return IndexCopy("index_copy_", self, &self, dim, index, source);
}

Tensor index_put(const Tensor& input, absl::Span<const Tensor> indices, const Tensor& values,
                 bool accumulate) {
  return IndexPut("index_put", input, nullptr, indices, values, accumulate);
}

Tensor index_put_(const Tensor& self, absl::Span<const Tensor> indices, const Tensor& values,
                  bool accumulate) {
  CheckInPlace("index_put_", self, {values});
  return IndexPut("index_put_", self, &self, indices, values, accumulate);
}

Tensor cumsum(const Tensor& input, int64_t dim) {
  RequireDefined("cumsum", "input", input);
  dim = WrapDimArg("cumsum", "dim", dim, input.shape());
  Tensor out = CumsumValues(input, dim);
  RecordFormula(out, {input}, "CumsumBackward0",
                [dim](const FormulaBackward&, const Tensor& g) -> TensorList {
                  const int64_t dims[] = {dim};
                  if (g.dim() == 0) return {g};
                  return {flip(cumsum(flip(g, dims), dim), dims)};
                });
  return out;
}

}  // namespace gradserve::ops
