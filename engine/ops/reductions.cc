#include "engine/ops/reductions.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

#include "engine/autograd/saved_variable.h"
#include "engine/kernels/functors.h"
#include "engine/kernels/op_kernels.h"
#include "engine/ops/broadcast.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/op_registry.h"
#include "engine/ops/record.h"

namespace gradserve::ops {
namespace {

using autograd::SavedVariable;

// The layout of reducing input over `dim` (empty: every dim), checking each dim.
ReductionLayout ParseDims(const char* op, const Tensor& input, absl::Span<const int64_t> dim,
                          bool keepdim) {
  RequireDefined(op, "input", input);
  const int64_t rank = input.dim();
  absl::InlinedVector<bool, 6> reduced(rank, dim.empty());
  absl::InlinedVector<bool, 6> seen(std::max<int64_t>(rank, 1), false);
  for (int64_t d : dim) {
    absl::StatusOr<int64_t> wrapped = WrapDim(d, rank);
    GS_CHECK_ARG(wrapped.ok(), op, ": dim ", d, " is out of range for a tensor of shape ",
                 ShapeToString(input.shape()));
    GS_CHECK_ARG(!seen[*wrapped], op, ": dim ", d, " appears more than once in dim");
    seen[*wrapped] = true;
    if (rank > 0) reduced[*wrapped] = true;
  }
  return MakeReductionLayout(input.shape(), reduced, keepdim);
}

// At most int64's max: past it only when the kept dims hold a 0, so that nothing is reduced.
int64_t ReducedCount(const ReductionLayout& layout) {
  int64_t count = 1;
  for (size_t d = 0; d < layout.input_shape.size(); ++d) {
    if (!layout.reduced[d]) continue;
    if (layout.input_shape[d] == 0) return 0;
    if (__builtin_mul_overflow(count, layout.input_shape[d], &count)) {
      count = std::numeric_limits<int64_t>::max();
    }
  }
  return count;
}

const char* NodeName(absl::Span<const int64_t> dim, bool keepdim, const char* all,
                     const char* some) {
  return dim.empty() && !keepdim ? all : some;
}

// Backward of mean: the gradient spread evenly over the reduced elements.
class MeanBackward final : public autograd::Node {
 public:
  MeanBackward(const char* name, ReductionLayout layout)
      : name_(name), layout_(std::move(layout)), count_(ReducedCount(layout_)) {}
  TensorList apply(TensorList&& grads) override {
    if (!grads[0].defined() || !should_compute_output(0)) return {Tensor()};
    return {div(ExpandOver(grads[0], layout_), static_cast<double>(count_))};
  }
  std::string name() const override { return name_; }

 private:
  const char* const name_;
  const ReductionLayout layout_;
  const int64_t count_;
};

// 1 where x equals the maximum m it reduced into, else 0.
struct IsMax {
  template <typename T>
  GS_HOST_DEVICE T operator()(T x, T m) const {
    return x == m ? T(1) : T(0);
  }
};

// Backward of amax: the gradient of each maximum split evenly among the input elements equal
// to it. The split weights depend on the input only through ties, so they are constants.
class AmaxBackward final : public autograd::Node {
 public:
  explicit AmaxBackward(ReductionLayout layout) : layout_(std::move(layout)) {}
  TensorList apply(TensorList&& grads) override {
    if (!grads[0].defined() || !should_compute_output(0)) return {Tensor()};
    const Tensor input = input_.unpack(this).detach();
    const Tensor result = result_.unpack(this).detach();
    const Tensor expanded = ExpandOver(result, layout_);
    Tensor is_max = Tensor::Empty(input.shape(), input.dtype(), input.device());
    DispatchFloating(input.dtype(), [&](auto tag) {
      using T = decltype(tag);
      MapKernel<T, T, T>(is_max, IsMax{}, input, expanded);
    });
    const Tensor ties = ExpandOver(SumOver(is_max, layout_, "SumBackward1"), layout_);
    Tensor weights = Tensor::Empty(input.shape(), input.dtype(), input.device());
    DispatchFloating(input.dtype(), [&](auto tag) {
      using T = decltype(tag);
      MapKernel<T, T, T>(weights, Divide{}, is_max, ties);
    });
    return {mul(ExpandOver(grads[0], layout_), weights)};
  }
  std::string name() const override { return "AmaxBackward0"; }
  void release_variables() override {
    input_.reset();
    result_.reset();
  }

  SavedVariable input_;
  SavedVariable result_;

 private:
  const ReductionLayout layout_;
};

// The mean from a sum accumulated in double: acc / count as T.
template <typename T>
struct MeanOf {
  double count;
  GS_HOST_DEVICE T operator()(double acc) const { return static_cast<T>(acc / count); }
};

// The larger of the accumulator and v; NaN wins and stays, as in PyTorch.
struct MaxOf {
  template <typename T>
  GS_HOST_DEVICE T operator()(T acc, T v) const {
    if constexpr (std::is_floating_point_v<T>) {
      return v > acc || std::isnan(v) ? v : acc;
    } else {
      return v > acc ? v : acc;
    }
  }
};

}  // namespace

Tensor sum(const Tensor& input, absl::Span<const int64_t> dim, bool keepdim) {
  return SumOver(input, ParseDims("sum", input, dim, keepdim),
                 NodeName(dim, keepdim, "SumBackward0", "SumBackward1"));
}

Tensor mean(const Tensor& input, absl::Span<const int64_t> dim, bool keepdim) {
  RequireFloating("mean", "input", input);
  ReductionLayout layout = ParseDims("mean", input, dim, keepdim);
  const double count = static_cast<double>(ReducedCount(layout));
  Tensor out = Tensor::Empty(layout.output_shape, input.dtype(), input.device());
  DispatchFloating(input.dtype(), [&](auto tag) {
    using T = decltype(tag);
    ReduceKernel<T, double, T>(input, layout.reduced, out, 0.0, SumInto<double>{},
                               MeanOf<T>{count});
  });
  RecordOp<MeanBackward>(out, {input}, NodeName(dim, keepdim, "MeanBackward0", "MeanBackward1"),
                         std::move(layout));
  return out;
}

Tensor amax(const Tensor& input, absl::Span<const int64_t> dim, bool keepdim) {
  ReductionLayout layout = ParseDims("amax", input, dim, keepdim);
  for (size_t d = 0; d < layout.input_shape.size(); ++d) {
    GS_CHECK_ARG(!layout.reduced[d] || layout.input_shape[d] > 0, "amax: cannot reduce dim ", d,
                 " of size 0 in a tensor of shape ", ShapeToString(input.shape()));
  }
  Tensor out = Tensor::Empty(layout.output_shape, input.dtype(), input.device());
  DispatchDType(input.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T lowest = std::numeric_limits<T>::has_infinity ? -std::numeric_limits<T>::infinity()
                                                          : std::numeric_limits<T>::lowest();
    ReduceKernel<T, T, T>(input, layout.reduced, out, lowest, MaxOf{}, CastTo<T>{});
  });
  if (auto node = RecordOp<AmaxBackward>(out, {input}, std::move(layout))) {
    node->input_ = SavedVariable(input, false);
    node->result_ = SavedVariable(out, true);
  }
  return out;
}

void RegisterReductionOps(OpRegistry& registry) {
  struct Entry {
    const char* name;
    const char* doc;
    Tensor (*fn)(const Tensor&, absl::Span<const int64_t>, bool);
    std::vector<DType> dtypes;
  };
  const Entry entries[] = {
      {"sum",
       "sum over dim (all dims if not given); int64 and bool sum to int64",
       &sum,
       {DType::kFloat32, DType::kFloat64, DType::kInt64, DType::kBool}},
      {"mean", "mean over dim (all dims if not given)", &mean, {DType::kFloat32, DType::kFloat64}},
      {"amax",
       "maximum over dim (all dims if not given); ties share the gradient",
       &amax,
       {DType::kFloat32, DType::kFloat64, DType::kInt64, DType::kBool}},
  };
  for (const Entry& e : entries) {
    OpSchema schema;
    schema.name = e.name;
    schema.doc = e.doc;
    schema.input_names = {"input"};
    schema.attrs = {
        {"dim", AttrType::kInts, false, "dims to reduce, negative from the end (default: all)"},
        {"keepdim", AttrType::kBool, false, "keep reduced dims as size 1 (default false)"}};
    schema.dtypes = e.dtypes;
    auto* fn = e.fn;
    schema.run = [fn](const TensorList& in, const Attrs& attrs) {
      const std::vector<int64_t> dim = attrs.GetInts("dim", {});
      return TensorList{fn(in[0], dim, attrs.GetBool("keepdim", false))};
    };
    registry.Add(std::move(schema));
  }
}

}  // namespace gradserve::ops
