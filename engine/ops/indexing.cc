#include "engine/ops/indexing.h"

#include <algorithm>
#include <vector>

#include "engine/kernels/op_kernels.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/formula_node.h"
#include "engine/ops/inplace.h"
#include "engine/ops/shape.h"
#include "engine/ops/shape_common.h"
#include "engine/util/cancellation.h"

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
            total += static_cast<Acc>(in[base + k * inner]);
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
  const int64_t length = (stop - begin + step - 1) / step;
  if (step == 1) return narrow(input, dim, begin, length);
  Shape shape = input.shape();
  shape[dim] = length;
  Strides strides = input.strides();
  const int64_t offset = input.storage_offset() + begin * strides[dim];
  strides[dim] *= step;
  Tensor out = input.AsStrided(shape, strides, offset);
  RecordFormula(out, {input}, "SliceBackward0",
                [in_shape = Shape(input.shape()), dim, begin, step, length](
                    const FormulaBackward&, const Tensor& g) -> TensorList {
                  const Tensor index = PositionIndex(
                      length, g.device(), [begin, step](int64_t k) { return begin + k * step; });
                  return {IndexAddIntoZeros(in_shape, dim, index, g)};
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
