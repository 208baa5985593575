#include "engine/ops/broadcast.h"

#include <string>
#include <type_traits>
#include <utility>

#include "engine/autograd/node.h"
#include "engine/kernels/functors.h"
#include "engine/kernels/op_kernels.h"
#include "engine/ops/record.h"

namespace gradserve::ops {
namespace {

// Expanded gradients of at most this many elements are copied out (SumOverBackward).
constexpr int64_t kMaterializeElements = 4096;

// Note [A gradient of one value]
// The gradient of a sum over every dim is one value expanded to the input's shape: every stride
// 0, as PyTorch's expand gives (SumOverBackward below). What comes after keeps it one value
// for as long as it can, where each step wrote out a full tensor before:
//  - a fused backward formula whose operands all repeat one value (FusedGrad in elementwise.cc:
//    the gradient of `x * 2` from a sum) computes that value once and hands on the same
//    expanded shape; PyTorch's writes a full tensor there;
//  - a map whose inputs all hold one value along a row fills the row (MapKernel), and packing
//    such a tensor (contiguous(), CopyInto) is a fill;
//  - so is writing it into a client's shared-memory range (ToSharedMemory in server/wire), and
//    a response carries its bytes as slices of one small block of the value (ChunkedResponse),
//    never packed: the kernel's send reads the block from cache again and again.
// Each element is fn of the same value, so the bits are those of the full computation. The
// gradient of `sum(x * 2)` over 16M floats, written into shared memory, went from one strided
// pass, one packed tensor and one 64 MiB copy to one 64 MiB fill: the call from 11 to 8 ms on
// the 2-CPU VM (docs/benchmarks.md).
//
// Backward of SumOver: the gradient is repeated over the summed dims. PyTorch returns the
// expanded view; a small one is copied out into a contiguous tensor instead (same values), so
// the fused kernels downstream take their contiguous loop and may reuse its buffer
// (Note [Reusing the gradient's buffer]). Not under create_graph, where the view is recorded.
class SumOverBackward final : public autograd::Node {
 public:
  SumOverBackward(const char* name, ReductionLayout layout)
      : name_(name), layout_(std::move(layout)) {}
  TensorList apply(TensorList&& grads) override {
    if (!grads[0].defined() || !should_compute_output(0)) return {Tensor()};
    Tensor expanded = ExpandOver(grads[0], layout_);
    if (expanded.numel() <= kMaterializeElements && !expanded.is_contiguous() &&
        !ShouldRecordAny({grads[0]})) {
      return {expanded.Clone()};
    }
    return {std::move(expanded)};
  }
  std::string name() const override { return name_; }

 private:
  const char* const name_;
  const ReductionLayout layout_;
};

// Backward of ExpandOver: the gradient is summed over the repeated dims.
class ExpandOverBackward final : public autograd::Node {
 public:
  explicit ExpandOverBackward(ReductionLayout layout) : layout_(std::move(layout)) {}
  TensorList apply(TensorList&& grads) override {
    if (!grads[0].defined() || !should_compute_output(0)) return {Tensor()};
    return {SumOver(grads[0], layout_, "SumBackward1")};
  }
  std::string name() const override { return "ExpandBackward0"; }

 private:
  const ReductionLayout layout_;
};

}  // namespace

ReductionLayout MakeReductionLayout(absl::Span<const int64_t> input_shape,
                                    absl::Span<const bool> reduced, bool keepdim) {
  ReductionLayout layout;
  layout.input_shape.assign(input_shape.begin(), input_shape.end());
  layout.reduced.assign(reduced.begin(), reduced.end());
  layout.kept.assign(reduced.size(), false);
  for (size_t d = 0; d < input_shape.size(); ++d) {
    if (!reduced[d]) {
      layout.output_shape.push_back(input_shape[d]);
    } else if (keepdim) {
      layout.kept[d] = true;
      layout.output_shape.push_back(1);
    }
  }
  return layout;
}

ReductionLayout SumToLayout(const char* op, absl::Span<const int64_t> from,
                            absl::Span<const int64_t> to) {
  bool ok = to.size() <= from.size();
  const size_t lead = ok ? from.size() - to.size() : 0;
  for (size_t d = 0; ok && d < to.size(); ++d) {
    ok = to[d] == from[lead + d] || to[d] == 1;
  }
  GS_CHECK_ARG(ok, op, ": shape ", ShapeToString(to), " cannot be broadcast to ",
               ShapeToString(from));
  ReductionLayout layout;
  layout.input_shape.assign(from.begin(), from.end());
  layout.output_shape.assign(to.begin(), to.end());
  layout.reduced.assign(from.size(), false);
  layout.kept.assign(from.size(), false);
  for (size_t d = 0; d < from.size(); ++d) {
    if (d < lead) {
      layout.reduced[d] = true;
    } else if (to[d - lead] == 1 && from[d] != 1) {
      layout.reduced[d] = true;
      layout.kept[d] = true;
    }
  }
  return layout;
}

Tensor SumOver(const Tensor& input, const ReductionLayout& layout, const char* node_name) {
  GS_CHECK_INTERNAL(input.shape() == layout.input_shape, "SumOver: input shape differs");
  const DType out_dtype = IsFloating(input.dtype()) ? input.dtype() : DType::kInt64;
  Tensor out = Tensor::Empty(layout.output_shape, out_dtype, input.device());
  if (IsHalfFloating(input.dtype())) {
    // Read as float32, summed in double as float32 is, rounded once (Note [16-bit elementwise
    // kernels] in engine/ops/elementwise.cc).
    DispatchHalf(input.dtype(), [&](auto tag) {
      using H = decltype(tag);
      ReduceKernel<H, double, H>(input, layout.reduced, out, 0.0, SumInto<double>{}, CastTo<H>{});
    });
  } else {
    DispatchDType(input.dtype(), [&](auto tag) {
      using T = decltype(tag);
      using Acc = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;
      using OutT = std::conditional_t<std::is_floating_point_v<T>, T, int64_t>;
      ReduceKernel<T, Acc, OutT>(input, layout.reduced, out, Acc{0}, SumInto<Acc>{},
                                 CastTo<OutT>{});
    });
  }
  RecordSumOver(out, input, layout, node_name);
  return out;
}

void RecordSumOver(Tensor& out, const Tensor& input, const ReductionLayout& layout,
                   const char* node_name) {
  RecordOp<SumOverBackward>(out, {input}, node_name, layout);
}

Tensor ExpandOver(const Tensor& reduced, const ReductionLayout& layout) {
  GS_CHECK_INTERNAL(reduced.shape() == layout.output_shape, "ExpandOver: shape differs");
  Strides strides(layout.input_shape.size(), 0);
  size_t j = 0;  // the dim of `reduced` that input dim d maps to
  for (size_t d = 0; d < layout.input_shape.size(); ++d) {
    if (!layout.reduced[d]) {
      strides[d] = reduced.strides()[j++];
    } else if (layout.kept[d]) {
      ++j;
    }
  }
  Tensor out = reduced.AsStrided(layout.input_shape, strides, reduced.storage_offset());
  RecordOp<ExpandOverBackward>(out, {reduced}, layout);
  return out;
}

Tensor sum_to(const Tensor& grad, absl::Span<const int64_t> shape) {
  if (SameShape(grad.shape(), shape)) return grad;
  return SumOver(grad, SumToLayout("sum_to", grad.shape(), shape), "SumBackward1");
}

Tensor broadcast_to(const Tensor& input, absl::Span<const int64_t> shape) {
  RequireDefined("broadcast_to", "input", input);
  GS_CHECK_ARG(CheckedNumel(shape).ok(), "broadcast_to: invalid shape ", ShapeToString(shape));
  if (SameShape(input.shape(), shape)) return input;
  return ExpandOver(input, SumToLayout("broadcast_to", shape, input.shape()));
}

}  // namespace gradserve::ops
