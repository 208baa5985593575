#include "engine/ops/elementwise.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "engine/autograd/grad_mode.h"
#include "engine/autograd/saved_variable.h"
#include "engine/kernels/basic_kernels.h"
#include "engine/kernels/functors.h"
#include "engine/kernels/op_kernels.h"
#include "engine/ops/broadcast.h"
#include "engine/ops/inplace.h"
#include "engine/ops/op_registry.h"
#include "engine/ops/record.h"
#include "engine/tensor/memory_budget.h"
#include "engine/util/quote.h"
#include "engine/util/wrapping.h"

namespace gradserve::ops {
namespace {

using autograd::SavedVariable;

constexpr double kSqrt2 = 1.41421356237309504880;
constexpr double kSqrtPi = 1.77245385090551602730;
constexpr double kSqrt2Pi = 2.50662827463100050242;
constexpr double kGeluTanhK = 0.79788456080286535588;  // sqrt(2 / pi)
constexpr double kGeluTanhC = 0.044715;

// The backward Node of every elementwise op: a formula (a plain function of this node and the
// gradient of the op's output) and what the formula needs from the forward pass, which each
// op's code next to its formula spells out. One class serves all ops so that none repeats the
// Node plumbing; the formula pointer is the only indirection, once per node.
//
// Thread safety: the Engine holds mutex() around apply and release_variables
// (Note [Node thread safety]); the op fills the fields before the node is shared.
//
// Note [Reusing the gradient's buffer]
// The gradient a node receives is usually held by nobody else: the InputBuffer handed it over
// and the node that produced it kept no reference. Then a fused backward loop (FusedGrad) writes
// its result over the gradient instead of allocating a new tensor, as PyTorch's InputBuffer
// does when it accumulates (Note [Accumulating in place]). apply moves the gradient out of its
// list so that the formula's `grad` is that only reference; a formula must not read grad after
// handing it to FusedGrad. OwnedExclusively decides, so a gradient that a hook, a capture, the
// caller's seed or another branch of the graph also holds is never overwritten.
class ElementwiseBackward final : public autograd::Node {
 public:
  // grad is the formula's to consume (Note [Reusing the gradient's buffer]).
  using Formula = TensorList (*)(const ElementwiseBackward& node, const Tensor& grad);

  ElementwiseBackward(const char* name, Formula formula) : name_(name), formula_(formula) {}

  TensorList apply(TensorList&& grads) override {
    if (!grads[0].defined()) return TensorList(num_outputs());
    const Tensor grad = std::move(grads[0]);
    return formula_(*this, grad);
  }
  std::string name() const override { return name_; }
  void release_variables() override {
    for (SavedVariable& s : saved) s.reset();
  }

  Tensor Saved(int i) const { return saved[i].unpack(this); }
  bool Needs(size_t i) const { return should_compute_output(i); }

  std::array<SavedVariable, 3> saved;
  std::array<double, 2> scalars{};
  std::array<Shape, 2> shapes;  // input shapes the gradients are summed back to
  int variant = 0;              // gelu's approximation, the dtype a cast came from

 private:
  const char* const name_;
  const Formula formula_;
};

using Formula = ElementwiseBackward::Formula;

// Records an ElementwiseBackward for out if needed; null otherwise.
std::shared_ptr<ElementwiseBackward> Record(Tensor& out, TensorRefs inputs, const char* name,
                                            Formula formula) {
  return RecordOp<ElementwiseBackward>(out, inputs, name, formula);
}

// True when a backward formula over these tensors records nothing (no create_graph), so it may
// run as one fused loop.
bool CanFuse(TensorRefs tensors) { return !ShouldRecordAny(tensors); }

template <typename, typename T>
using Same = T;

// fn's result converted to T, the output's element type: the kernel of MapSameDType and
// FusedGrad. It holds fn by value, as a functor sent to a GPU must
// (Note [Kernels for every device]).
template <typename T, typename Fn>
struct CastResult {
  Fn fn;
  template <typename... V>
  GS_HOST_DEVICE T operator()(V... v) const {
    return static_cast<T>(fn(v...));
  }
};

// Note [16-bit elementwise kernels]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The maps below also run on float16 and bfloat16 tensors, reading and writing 16 bits: the
// kernel reads each operand as float32, calls the op's float32 functor (InFloat32) and rounds
// its result once, as PyTorch's 16-bit kernels do with their float32 opmath type. The ops whose
// every path (forward, backward, double backward) runs through these maps, views and `to` are
// listed in Note [Ops on 16-bit floats] (engine/ops/op_registry.cc) and take 16-bit tensors
// as they are; the others convert them to float32 around the op.
template <typename Fn>
struct InFloat32 {
  Fn fn;
  template <typename... V>
  GS_HOST_DEVICE auto operator()(V... v) const {
    return fn(static_cast<float>(v)...);
  }
};

// A new tensor of `shape` in the dtype of the first input (all inputs share it), with
// out = fn(inputs...) elementwise under broadcasting. kFloatingOnly instantiates fn for float
// and double only (the caller has made sure the dtype is floating). fn is a functor struct
// (Note [Kernels for every device]). 16-bit tensors run fn in float32 (Note [16-bit elementwise
// kernels]).
template <bool kFloatingOnly, typename Fn, typename... Ts>
void MapOnto(const Tensor& out, const Fn& fn, const Ts&... ins) {
  if (IsHalfFloating(out.dtype())) {
    DispatchHalf(out.dtype(), [&](auto tag) {
      using H = decltype(tag);
      MapKernel<H, Same<Ts, H>...>(out, CastResult<H, InFloat32<Fn>>{{fn}}, ins...);
    });
    return;
  }
  auto run = [&](auto tag) {
    using T = decltype(tag);
    MapKernel<T, Same<Ts, T>...>(out, CastResult<T, Fn>{fn}, ins...);
  };
  if constexpr (kFloatingOnly) {
    DispatchFloating(out.dtype(), run);
  } else {
    DispatchNumeric(out.dtype(), run);
  }
}

template <bool kFloatingOnly, typename Fn, typename... Ts>
Tensor MapSameDType(absl::Span<const int64_t> shape, const Fn& fn, const Ts&... ins) {
  const Tensor& first = std::get<0>(std::forward_as_tuple(ins...));
  Tensor out = Tensor::Empty(shape, first.dtype(), first.device());
  MapOnto<kFloatingOnly>(out, fn, ins...);
  return out;
}

// MapSameDType, or, for an in-place op `op` (into: its self, Note [In-place ops]), the same
// map written over *into, whose version it bumps. Returns the tensor written.
template <bool kFloatingOnly, typename Fn, typename... Ts>
Tensor MapSameDTypeInto(const Tensor* into, const char* op, absl::Span<const int64_t> shape,
                        const Fn& fn, const Ts&... ins) {
  if (into == nullptr) return MapSameDType<kFloatingOnly>(shape, fn, ins...);
  CheckInPlaceResult(op, *into, shape, std::get<0>(std::forward_as_tuple(ins...)).dtype());
  MapOnto<kFloatingOnly>(*into, fn, ins...);
  into->BumpVersion();
  return *into;
}

// The single element of a tensor that repeats one value, as a 0-d view.
Tensor OneValue(const Tensor& t) { return t.AsStrided({}, {}, t.storage_offset()); }

// The fused backward loops: same-shape floating operands. The result is written over grad when
// nothing else holds it (Note [Reusing the gradient's buffer]); each element is read before it
// is written, at the same index.
template <typename Fn, typename... Ts>
Tensor FusedGrad(const Fn& fn, const Tensor& grad, const Ts&... saved) {
  if (grad.repeats_one_value() && (saved.repeats_one_value() && ...)) {
    // Note [A gradient of one value]: fn of one value is one value, expanded as grad was.
    const Tensor one = MapSameDType<true>({}, fn, OneValue(grad), OneValue(saved)...);
    return one.AsStrided(grad.shape(), Strides(grad.shape().size(), 0), 0);
  }
  if (!OwnedExclusively(grad)) return MapSameDType<true>(grad.shape(), fn, grad, saved...);
  if (IsHalfFloating(grad.dtype())) {
    DispatchHalf(grad.dtype(), [&](auto tag) {
      using H = decltype(tag);
      MapKernel<H, H, Same<Ts, H>...>(grad, CastResult<H, InFloat32<Fn>>{{fn}}, grad, saved...);
    });
    return grad;
  }
  DispatchFloating(grad.dtype(), [&](auto tag) {
    using T = decltype(tag);
    MapKernel<T, T, Same<Ts, T>...>(grad, CastResult<T, Fn>{fn}, grad, saved...);
  });
  return grad;
}

// A bool tensor of `shape`, pred(inputs...) elementwise (masks for backward formulas; they
// carry no gradient).
template <typename Pred, typename... Ts>
Tensor Mask(absl::Span<const int64_t> shape, const Pred& pred, const Ts&... ins) {
  const Tensor& first = std::get<0>(std::forward_as_tuple(ins...));
  Tensor out = Tensor::Empty(shape, DType::kBool, first.device());
  if (IsHalfFloating(first.dtype())) {
    DispatchHalf(first.dtype(), [&](auto tag) {
      using H = decltype(tag);
      MapKernel<bool, Same<Ts, H>...>(out, InFloat32<Pred>{pred}, ins...);
    });
    return out;
  }
  DispatchFloating(first.dtype(), [&](auto tag) {
    using T = decltype(tag);
    MapKernel<bool, Same<Ts, T>...>(out, pred, ins...);
  });
  return out;
}

Tensor ZeroLike0d(const Tensor& t) { return Tensor::Scalar(0, t.dtype(), t.device()); }

// g * s, or g itself when s is 1.
Tensor Scale(const Tensor& g, double s) { return s == 1 ? g : mul(g, s); }

// --- Checks and dtype handling ---

// Any device: every kernel here runs on GPUs too (Note [Kernels for every device]); the ops
// with two or more operands check that they share one (RequireSameDevice).
void CheckInput(const char* op, const char* arg, const Tensor& t) { RequireDefined(op, arg, t); }

// input converted to a floating dtype for ops that are floating by nature; ints and bools
// become float32 (they carry no gradient, so the conversion records nothing).
Tensor AsFloating(const Tensor& input) {
  return IsFloating(input.dtype()) ? input : input.To(DType::kFloat32);
}

// The operands of a binary op, promoted to their result dtype by differentiable casts. An
// operand already of that dtype (most) is not copied: input and other refer to the caller's
// tensors, which must outlive this (no temporaries), and so it is neither copied nor moved.
struct Promoted {
  Promoted(const char* op, const char* arg_a, const Tensor& a, const char* arg_b, const Tensor& b)
      : dtype(CheckedResultType(op, arg_a, a, arg_b, b)),
        shape(BroadcastShapesOrThrow(op, a.shape(), b.shape())),
        input_cast(a.dtype() == dtype ? Tensor() : to(a, dtype)),
        other_cast(b.dtype() == dtype ? Tensor() : to(b, dtype)),
        input(input_cast.defined() ? input_cast : a),
        other(other_cast.defined() ? other_cast : b) {}
  Promoted(const Promoted&) = delete;
  Promoted& operator=(const Promoted&) = delete;

  // Checks both operands and their devices; their result dtype.
  static DType CheckedResultType(const char* op, const char* arg_a, const Tensor& a,
                                 const char* arg_b, const Tensor& b) {
    CheckInput(op, arg_a, a);
    CheckInput(op, arg_b, b);
    RequireSameDevice(op, arg_a, a, arg_b, b);
    // Operands of one dtype (most) keep it, whatever their ranks.
    return a.dtype() == b.dtype() ? a.dtype() : ResultType({&a, &b});
  }

  const DType dtype;
  const Shape shape;
  const Tensor input_cast;  // defined only when a was cast
  const Tensor other_cast;  // defined only when b was cast
  const Tensor& input;
  const Tensor& other;
};

// The operand of a unary op with a Python float scalar, converted to the result dtype
// (float32 for int64 and bool; no gradient flows through that conversion).
Tensor WithFloatScalar(const char* op, const Tensor& input) {
  CheckInput(op, "input", input);
  return AsFloating(input);
}

// An integer alpha converts exactly, modulo 2**64 (Note [Integer tensors wrap around]); sub
// negates its alpha first, so the range is int64's widened by one at the top.
void CheckIntegralAlpha(const char* op, DType dtype, double alpha) {
  if (IsFloating(dtype)) return;
  GS_CHECK_ARG(alpha == std::trunc(alpha), op,
               ": alpha must be an integer for integer inputs, got ", alpha);
  GS_CHECK_ARG(std::abs(alpha) <= 0x1p63, op, ": alpha must be within int64's range, got ", alpha);
}

// --- Formulas shared by several ops ---

// Gradient g to every input that needs one, summed to its shape, times scalars[0] for the
// second: add, sub (scalars[0] = -alpha).
TensorList AddFormula(const ElementwiseBackward& n, const Tensor& g) {
  TensorList r(n.num_outputs());
  if (n.Needs(0)) r[0] = sum_to(g, n.shapes[0]);
  if (r.size() > 1 && n.Needs(1)) r[1] = sum_to(Scale(g, n.scalars[0]), n.shapes[1]);
  return r;
}

// v * s.
struct ScaleBy {
  double s;
  template <typename T>
  GS_HOST_DEVICE T operator()(T v) const {
    return v * static_cast<T>(s);
  }
};

// g * scalars[0]: the scalar forms of add, sub, rsub, mul.
TensorList ScaleFormula(const ElementwiseBackward& n, const Tensor& g) {
  const double s = n.scalars[0];
  if (s == 1 || !CanFuse({g}) || !IsFloating(g.dtype())) return {Scale(g, s)};
  return {FusedGrad(ScaleBy{s}, g)};
}

}  // namespace

// --- add, sub, rsub ---

namespace {

struct Plus {
  template <typename T>
  GS_HOST_DEVICE T operator()(T a, T b) const {
    return WrapAdd(a, b);
  }
};

// a + alpha * b.
struct PlusScaled {
  double alpha;
  template <typename T>
  GS_HOST_DEVICE T operator()(T a, T b) const {
    return WrapMulAdd(a, WrapFromDouble<T>(alpha), b);
  }
};

// v + shift.
struct Shift {
  double shift;
  template <typename T>
  GS_HOST_DEVICE T operator()(T v) const {
    return v + static_cast<T>(shift);
  }
};

// scale * v + shift.
struct Affine {
  double scale;
  double shift;
  template <typename T>
  GS_HOST_DEVICE T operator()(T v) const {
    return static_cast<T>(scale) * v + static_cast<T>(shift);
  }
};

// into: an in-place op's self (Note [In-place ops]); null for a new output.
Tensor AddImpl(const char* op, const char* node_name, const Tensor& input, const Tensor& other,
               double alpha, const Tensor* into = nullptr) {
  Promoted p(op, "input", input, "other", other);
  if (p.dtype == DType::kBool) {
    GS_CHECK_ARG(into == nullptr, op, ": bool operands are not supported in place");
    // bool + bool is logical or, as in PyTorch: add as int64 and read back as bool.
    return AddImpl(op, node_name, input.To(DType::kInt64), other.To(DType::kInt64), alpha)
        .To(DType::kBool);
  }
  CheckIntegralAlpha(op, p.dtype, alpha);
  Tensor out =
      alpha == 1 ? MapSameDTypeInto<false>(into, op, p.shape, Plus{}, p.input, p.other)
                 : MapSameDTypeInto<false>(into, op, p.shape, PlusScaled{alpha}, p.input, p.other);
  if (auto node = Record(out, {p.input, p.other}, node_name, &AddFormula)) {
    node->scalars[0] = alpha;
    node->shapes = {p.input.shape(), p.other.shape()};
  }
  return out;
}

// input * s1 + s0 for a float scalar, recording ScaleFormula with the given factor.
Tensor AffineScalar(const char* op, const char* node_name, const Tensor& input, double scale,
                    double shift, const Tensor* into = nullptr) {
  Tensor x = WithFloatScalar(op, input);
  Tensor out = scale == 1 ? MapSameDTypeInto<true>(into, op, x.shape(), Shift{shift}, x)
                          : MapSameDTypeInto<true>(into, op, x.shape(), Affine{scale, shift}, x);
  if (auto node = Record(out, {x}, node_name, &ScaleFormula)) node->scalars[0] = scale;
  return out;
}

}  // namespace

Tensor add(const Tensor& input, const Tensor& other, double alpha) {
  return AddImpl("add", "AddBackward0", input, other, alpha);
}

Tensor add(const Tensor& input, double other, double alpha) {
  return AffineScalar("add", "AddBackward0", input, 1, alpha * other);
}

Tensor sub(const Tensor& input, const Tensor& other, double alpha) {
  RequireNotBool("sub", "input", input);
  RequireNotBool("sub", "other", other);
  return AddImpl("sub", "SubBackward0", input, other, -alpha);
}

Tensor sub(const Tensor& input, double other, double alpha) {
  RequireNotBool("sub", "input", input);
  return AffineScalar("sub", "SubBackward0", input, 1, -alpha * other);
}

Tensor rsub(const Tensor& input, double other, double alpha) {
  RequireNotBool("rsub", "input", input);
  return AffineScalar("rsub", "RsubBackward1", input, -alpha, other);
}

// --- mul ---

namespace {

struct Times {
  template <typename T>
  GS_HOST_DEVICE T operator()(T a, T b) const {
    return WrapMul(a, b);
  }
};

// saved: 0 input, 1 other (each saved only if the other's gradient is needed).
TensorList MulFormula(const ElementwiseBackward& n, const Tensor& g) {
  TensorList r(2);
  if (n.Needs(0)) r[0] = sum_to(mul(g, n.Saved(1)), n.shapes[0]);
  if (n.Needs(1)) r[1] = sum_to(mul(g, n.Saved(0)), n.shapes[1]);
  return r;
}

// mul and mul_ (into: self, Note [In-place ops]).
Tensor MulImpl(const char* op, const Tensor& input, const Tensor& other, const Tensor* into) {
  Promoted p(op, "input", input, "other", other);
  if (p.dtype == DType::kBool) {
    GS_CHECK_ARG(into == nullptr, op, ": bool operands are not supported in place");
    // bool * bool is logical and.
    return mul(input.To(DType::kInt64), other.To(DType::kInt64)).To(DType::kBool);
  }
  Tensor out = MapSameDTypeInto<false>(into, op, p.shape, Times{}, p.input, p.other);
  if (auto node = Record(out, {p.input, p.other}, "MulBackward0", &MulFormula)) {
    if (node->Needs(1)) node->saved[0] = SavedVariable(p.input, false);
    if (node->Needs(0)) node->saved[1] = SavedVariable(p.other, false);
    node->shapes = {p.input.shape(), p.other.shape()};
  }
  return out;
}

}  // namespace

Tensor mul(const Tensor& input, const Tensor& other) {
  return MulImpl("mul", input, other, nullptr);
}

Tensor mul(const Tensor& input, double other) {
  return AffineScalar("mul", "MulBackward0", input, other, 0);
}

namespace {

// SumInto<double> of fn(v) for each float32 element v (Note [A scaled sum in one pass]): an
// element is mapped, and so rounded to float32, before it is added, as mul stores it; the
// partial sums of the lanes and the chunks, doubles already, are added as they are.
template <typename Fn>
struct SumOfMapped {
  Fn fn;
  GS_HOST_DEVICE double operator()(double acc, float v) const {
    return acc + static_cast<double>(fn(v));
  }
  GS_HOST_DEVICE double operator()(double acc, double partial) const { return acc + partial; }
};

}  // namespace

bool TakesScaledSum(const Tensor& x) {
  return x.defined() && x.dtype() == DType::kFloat32 && x.device().is_cpu() && x.is_contiguous();
}

Tensor ScaledSum(const Tensor& x, double scale) {
  GS_CHECK_INTERNAL(TakesScaledSum(x), "ScaledSum: not a contiguous float32 CPU tensor");
  const absl::InlinedVector<bool, 6> every_dim(x.shape().size(), true);
  const ReductionLayout layout = MakeReductionLayout(x.shape(), every_dim, /*keepdim=*/false);
  Tensor out = Tensor::Empty({}, DType::kFloat32);
  // mul's functor, as AffineScalar picks it.
  auto sum_of = [&](auto fn) {
    ReduceKernel<float, double, float>(x, layout.reduced, out, 0.0, SumOfMapped<decltype(fn)>{fn},
                                       CastTo<float>{});
  };
  if (scale == 1) {
    sum_of(Shift{0});
  } else {
    sum_of(Affine{scale, 0});
  }
  // The product, as the Nodes see it: its shape, dtype and device, one element.
  Tensor product =
      Tensor::Zeros({}, DType::kFloat32).AsStrided(x.shape(), Strides(x.shape().size(), 0), 0);
  if (auto node = Record(product, {x}, "MulBackward0", &ScaleFormula)) node->scalars[0] = scale;
  RecordSumOver(out, product, layout, "SumBackward0");
  return out;
}

// --- div ---

namespace {

// The gradient of a / b with respect to b: -g * a / b^2.
// Note [Dividing twice, not by a square]
// div's gradient with respect to its denominator is -g * ((a / b) / b), PyTorch's order, never
// -g * a / (b * b): b * b overflows to inf (or underflows to 0) for |b| past 1.8e19 (below
// 1e-19) in float32, where the quotient taken twice stays finite. log's double backward
// (d/dx of g / x) is this formula at values log is asked for, 1e10 to 1e30.
struct DivOtherGrad {
  template <typename T>
  GS_HOST_DEVICE T operator()(T gv, T a, T b) const {
    return -gv * ((a / b) / b);
  }
};

// saved: 0 input, 1 other.
TensorList DivFormula(const ElementwiseBackward& n, const Tensor& g) {
  TensorList r(2);
  const Tensor other = n.Saved(1);
  if (n.Needs(0)) r[0] = sum_to(div(g, other), n.shapes[0]);
  if (n.Needs(1)) {
    const Tensor input = n.Saved(0);
    const Shape shape = BroadcastShapesOrThrow("div", g.shape(), other.shape());
    Tensor d = CanFuse({g, input, other})
                   ? MapSameDType<true>(shape, DivOtherGrad{}, g, input, other)
                   : neg(mul(g, div(div(input, other), other)));
    r[1] = sum_to(d, n.shapes[1]);
  }
  return r;
}

// v / divisor.
struct DivideBy {
  double divisor;
  template <typename T>
  GS_HOST_DEVICE T operator()(T v) const {
    return v / static_cast<T>(divisor);
  }
};

// scalars[0]: the divisor.
TensorList DivScalarFormula(const ElementwiseBackward& n, const Tensor& g) {
  return {div(g, n.scalars[0])};
}

// div and div_ (into: self, Note [In-place ops]).
Tensor DivImpl(const char* op, const Tensor& input, const Tensor& other, const Tensor* into) {
  CheckInput(op, "input", input);
  CheckInput(op, "other", other);
  // True division: integers and bools divide as float32 (they carry no gradient).
  const bool integral = !IsFloating(ResultType({&input, &other}));
  const Tensor float_input = integral ? AsFloating(input) : Tensor();
  const Tensor float_other = integral ? AsFloating(other) : Tensor();
  Promoted p(op, "input", integral ? float_input : input, "other", integral ? float_other : other);
  Tensor out = MapSameDTypeInto<true>(into, op, p.shape, Divide{}, p.input, p.other);
  if (auto node = Record(out, {p.input, p.other}, "DivBackward0", &DivFormula)) {
    if (node->Needs(1)) node->saved[0] = SavedVariable(p.input, false);
    node->saved[1] = SavedVariable(p.other, false);
    node->shapes = {p.input.shape(), p.other.shape()};
  }
  return out;
}

Tensor DivScalarImpl(const char* op, const Tensor& input, double other, const Tensor* into) {
  Tensor x = WithFloatScalar(op, input);
  Tensor out = MapSameDTypeInto<true>(into, op, x.shape(), DivideBy{other}, x);
  if (auto node = Record(out, {x}, "DivBackward0", &DivScalarFormula)) node->scalars[0] = other;
  return out;
}

}  // namespace

Tensor div(const Tensor& input, const Tensor& other) {
  return DivImpl("div", input, other, nullptr);
}

Tensor div(const Tensor& input, double other) {
  return DivScalarImpl("div", input, other, nullptr);
}

// --- pow ---

namespace {

// Integer power by squaring; exponent >= 0. Wraps around on overflow as PyTorch's does.
GS_HOST_DEVICE int64_t IntPow(int64_t base, int64_t exponent) {
  uint64_t result = 1;
  uint64_t b = static_cast<uint64_t>(base);
  for (uint64_t e = static_cast<uint64_t>(exponent); e != 0; e >>= 1) {
    if (e & 1) result *= b;
    b *= b;
  }
  return static_cast<int64_t>(result);
}

// a ** b: IntPow for integers.
struct Power {
  template <typename T>
  GS_HOST_DEVICE T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {
      return IntPow(a, b);
    } else {
      return std::pow(a, b);
    }
  }
};

// The smaller of the accumulator and v: ReduceKernel's combine for a minimum.
struct MinOf {
  template <typename Acc, typename V>
  GS_HOST_DEVICE Acc operator()(Acc acc, V v) const {
    return v < acc ? static_cast<Acc>(v) : acc;
  }
};

// Whether an int64 tensor holds a negative element: the minimum of 0 and its elements, reduced
// on the tensor's device, is negative. Reading that one element back waits for a GPU.
bool AnyNegative(const Tensor& t) {
  Tensor least = Tensor::Empty({}, DType::kInt64, t.device());
  const absl::InlinedVector<bool, 6> all(t.dim(), true);
  ReduceKernel<int64_t, int64_t, int64_t>(t, all, least, int64_t{0}, MinOf{}, CastTo<int64_t>{});
  return least.item() < 0;
}

// No gradient to pow's input where the exponent is 0.
struct ZeroExponent {
  template <typename T>
  GS_HOST_DEVICE bool operator()(T e) const {
    return e == 0;
  }
};

// The gradient of x ** e with respect to x: g * e * x ** (e - 1).
struct PowInputGrad {
  template <typename T>
  GS_HOST_DEVICE T operator()(T gv, T xv, T ev) const {
    return ZeroExponent{}(ev) ? T(0) : gv * ev * std::pow(xv, ev - 1);
  }
};

// No gradient to pow's exponent where the input is 0 and the exponent >= 0.
struct ZeroBase {
  template <typename T>
  GS_HOST_DEVICE bool operator()(T x, T e) const {
    return x == 0 && e >= 0;
  }
};

// The gradient of x ** e with respect to e: g * y * log(x), y = x ** e.
struct PowExponentGrad {
  template <typename T>
  GS_HOST_DEVICE T operator()(T gv, T xv, T ev, T yv) const {
    return ZeroBase{}(xv, ev) ? T(0) : gv * yv * std::log(xv);
  }
};

// saved: 0 input, 1 exponent, 2 result. As PyTorch: no gradient to the input where the
// exponent is 0, none to the exponent where the input is 0 and the exponent >= 0.
TensorList PowFormula(const ElementwiseBackward& n, const Tensor& g) {
  TensorList r(2);
  const Tensor x = n.Saved(0);
  const Tensor e = n.Saved(1);
  if (n.Needs(0)) {
    Tensor d = CanFuse({g, x, e}) ? MapSameDType<true>(g.shape(), PowInputGrad{}, g, x, e)
                                  : where(Mask(g.shape(), ZeroExponent{}, e), ZeroLike0d(g),
                                          mul(mul(g, e), pow(x, sub(e, 1.0))));
    r[0] = sum_to(d, n.shapes[0]);
  }
  if (n.Needs(1)) {
    const Tensor y = n.Saved(2);
    Tensor d;
    if (CanFuse({g, x, e, y})) {
      d = MapSameDType<true>(g.shape(), PowExponentGrad{}, g, x, e, y);
    } else {
      Tensor mask = Mask(g.shape(), ZeroBase{}, x, e);
      d = mul(g, where(mask, ZeroLike0d(g), mul(y, log(x))));
    }
    r[1] = sum_to(d, n.shapes[1]);
  }
  return r;
}

// The gradient of x ** e for a scalar e: g * e * x ** (e - 1).
struct PowScalarGrad {
  double e;
  template <typename T>
  GS_HOST_DEVICE T operator()(T gv, T xv) const {
    return gv * static_cast<T>(e) * std::pow(xv, static_cast<T>(e - 1));
  }
};

// saved: 0 input; scalars[0]: the exponent.
TensorList PowScalarFormula(const ElementwiseBackward& n, const Tensor& g) {
  const double e = n.scalars[0];
  if (e == 0) return {Tensor::Zeros(g.shape(), g.dtype(), g.device())};
  const Tensor x = n.Saved(0);
  if (CanFuse({g, x})) {
    return {FusedGrad(PowScalarGrad{e}, g, x)};
  }
  return {mul(g, mul(pow(x, e - 1), e))};
}

struct Square {
  template <typename T>
  GS_HOST_DEVICE T operator()(T v) const {
    return v * v;
  }
};

// v ** exponent.
struct PowScalar {
  double exponent;
  template <typename T>
  GS_HOST_DEVICE T operator()(T v) const {
    return std::pow(v, static_cast<T>(exponent));
  }
};

}  // namespace

Tensor pow(const Tensor& input, const Tensor& exponent) {
  RequireNotBool("pow", "input", input);
  RequireNotBool("pow", "exponent", exponent);
  Promoted p("pow", "input", input, "exponent", exponent);
  if (p.dtype == DType::kInt64) {
    GS_CHECK_ARG(!AnyNegative(p.other), "pow: integers to negative integer powers are not allowed");
  }
  Tensor out = MapSameDType<false>(p.shape, Power{}, p.input, p.other);
  if (auto node = Record(out, {p.input, p.other}, "PowBackward1", &PowFormula)) {
    node->saved[0] = SavedVariable(p.input, false);
    node->saved[1] = SavedVariable(p.other, false);
    if (node->Needs(1)) node->saved[2] = SavedVariable(out, true);
    node->shapes = {p.input.shape(), p.other.shape()};
  }
  return out;
}

Tensor pow(const Tensor& input, double exponent) {
  RequireNotBool("pow", "input", input);
  Tensor x = WithFloatScalar("pow", input);
  Tensor out = exponent == 2 ? MapSameDType<true>(x.shape(), Square{}, x)
                             : MapSameDType<true>(x.shape(), PowScalar{exponent}, x);
  if (auto node = Record(out, {x}, "PowBackward0", &PowScalarFormula)) {
    node->saved[0] = SavedVariable(x, false);
    node->scalars[0] = exponent;
  }
  return out;
}

// --- Unary ops ---

namespace {

enum class Save { kNothing, kInput, kResult };

// y = fn(x) elementwise, recording `formula` with the input or the result in saved[0].
// kFloating: the op is floating by nature (ints and bools compute as float32); otherwise it
// keeps int64 and refuses bool. Returns the recorded node through *node if asked (ops with
// parameters set its scalars).
// into: an in-place op's self (Note [In-place ops]), written instead of a new output.
template <bool kFloating, typename Fn>
Tensor Unary(const char* op, const char* node_name, Formula formula, Save save, const Tensor& input,
             const Fn& fn, std::shared_ptr<ElementwiseBackward>* node_out = nullptr,
             const Tensor* into = nullptr) {
  CheckInput(op, "input", input);
  if constexpr (!kFloating) RequireNotBool(op, "input", input);
  const Tensor x = kFloating ? AsFloating(input) : input;
  Tensor out = MapSameDTypeInto<kFloating>(into, op, x.shape(), fn, x);
  if (auto node = Record(out, {x}, node_name, formula)) {
    if (save == Save::kInput) node->saved[0] = SavedVariable(x, false);
    if (save == Save::kResult) node->saved[0] = SavedVariable(out, true);
    if (node_out != nullptr) *node_out = std::move(node);
  }
  return out;
}

TensorList NegFormula(const ElementwiseBackward&, const Tensor& g) { return {neg(g)}; }

// g * sign(x).
struct AbsGrad {
  template <typename T>
  GS_HOST_DEVICE T operator()(T gv, T xv) const {
    return xv > 0 ? gv : (xv < 0 ? -gv : T(0));
  }
};

// saved[0]: input.
TensorList AbsFormula(const ElementwiseBackward& n, const Tensor& g) {
  const Tensor x = n.Saved(0);
  if (CanFuse({g, x})) return {FusedGrad(AbsGrad{}, g, x)};
  // sign(x) keeps the gradient connected to x (with derivative zero), as PyTorch's does.
  return {mul(g, sign(x))};
}

// sign's derivative is zero wherever it exists; the Node still connects its result to the
// input, so a gradient built from it (abs's, relu's) can be differentiated again, to zeros.
TensorList SignFormula(const ElementwiseBackward&, const Tensor& g) { return {g.ZerosLike()}; }

// saved[0]: result.
TensorList ExpFormula(const ElementwiseBackward& n, const Tensor& g) {
  return {mul(g, n.Saved(0))};
}

// saved[0]: input.
TensorList LogFormula(const ElementwiseBackward& n, const Tensor& g) {
  return {div(g, n.Saved(0))};
}

// g / (2 y), y = sqrt(x).
struct SqrtGrad {
  template <typename T>
  GS_HOST_DEVICE T operator()(T gv, T yv) const {
    return gv / (yv + yv);
  }
};

// saved[0]: result.
TensorList SqrtFormula(const ElementwiseBackward& n, const Tensor& g) {
  const Tensor y = n.Saved(0);
  if (CanFuse({g, y})) return {FusedGrad(SqrtGrad{}, g, y)};
  return {div(g, mul(y, 2.0))};
}

// d/dx x^(-1/2) = -x^(-3/2) / 2 = -y^3 / 2.
struct RsqrtGrad {
  template <typename T>
  GS_HOST_DEVICE T operator()(T gv, T yv) const {
    return T(-0.5) * gv * yv * yv * yv;
  }
};

// saved[0]: result.
TensorList RsqrtFormula(const ElementwiseBackward& n, const Tensor& g) {
  const Tensor y = n.Saved(0);
  if (CanFuse({g, y})) return {FusedGrad(RsqrtGrad{}, g, y)};
  return {mul(g, mul(pow(y, 3.0), -0.5))};
}

struct SinGrad {
  template <typename T>
  GS_HOST_DEVICE T operator()(T gv, T xv) const {
    return gv * std::cos(xv);
  }
};

// saved[0]: input.
TensorList SinFormula(const ElementwiseBackward& n, const Tensor& g) {
  const Tensor x = n.Saved(0);
  if (CanFuse({g, x})) return {FusedGrad(SinGrad{}, g, x)};
  return {mul(g, cos(x))};
}

struct CosGrad {
  template <typename T>
  GS_HOST_DEVICE T operator()(T gv, T xv) const {
    return -gv * std::sin(xv);
  }
};

// saved[0]: input.
TensorList CosFormula(const ElementwiseBackward& n, const Tensor& g) {
  const Tensor x = n.Saved(0);
  if (CanFuse({g, x})) return {FusedGrad(CosGrad{}, g, x)};
  return {mul(g, neg(sin(x)))};
}

// g * (1 - y^2), y = tanh(x).
struct TanhGrad {
  template <typename T>
  GS_HOST_DEVICE T operator()(T gv, T yv) const {
    return gv * (T(1) - yv * yv);
  }
};

// saved[0]: result.
TensorList TanhFormula(const ElementwiseBackward& n, const Tensor& g) {
  const Tensor y = n.Saved(0);
  if (CanFuse({g, y})) return {FusedGrad(TanhGrad{}, g, y)};
  return {mul(g, rsub(mul(y, y), 1))};
}

// g * y * (1 - y), y = sigmoid(x).
struct SigmoidGrad {
  template <typename T>
  GS_HOST_DEVICE T operator()(T gv, T yv) const {
    return gv * yv * (T(1) - yv);
  }
};

// G * g * (1 - 2y): sigmoid_backward's derivative with respect to y.
struct SigmoidBackwardResultGrad {
  template <typename T>
  GS_HOST_DEVICE T operator()(T gg, T gv, T yv) const {
    return gg * gv * (T(1) - T(2) * yv);
  }
};

Tensor SigmoidBackwardOp(const Tensor& g, const Tensor& y);

// Note [sigmoid's backward as one op]
// Under create_graph, sigmoid's gradient g * y * (1 - y) is recorded as one op of g and y
// (PyTorch's sigmoid_backward, SigmoidBackwardBackward0) whose derivative with respect to y is
// G * g * (1 - 2y), as PyTorch's. The product rule over mul(y, 1 - y) would give
// G * g * (1 - y) - G * g * y instead: two rounded products that cancel where y is near 1/2,
// losing digits in proportion to 1 / |x| (1e-10 of float64 at |x| = 1e-6).
// saved: 0 g, 1 y.
TensorList SigmoidBackwardFormula(const ElementwiseBackward& n, const Tensor& gg) {
  TensorList r(2);
  const Tensor g = n.Saved(0);
  const Tensor y = n.Saved(1);
  if (n.Needs(0)) r[0] = SigmoidBackwardOp(gg, y);
  if (n.Needs(1)) {
    r[1] = CanFuse({gg, g, y})
               ? MapSameDType<true>(gg.shape(), SigmoidBackwardResultGrad{}, gg, g, y)
               : mul(mul(gg, g), rsub(mul(y, 2.0), 1));
  }
  return r;
}

// sigmoid_backward(g, y) = g * y * (1 - y), recorded as one op (see the Note).
Tensor SigmoidBackwardOp(const Tensor& g, const Tensor& y) {
  Tensor out = MapSameDType<true>(g.shape(), SigmoidGrad{}, g, y);
  if (auto node = Record(out, {g, y}, "SigmoidBackwardBackward0", &SigmoidBackwardFormula)) {
    node->saved[0] = SavedVariable(g, false);
    node->saved[1] = SavedVariable(y, false);
    node->shapes = {g.shape(), y.shape()};
  }
  return out;
}

// saved[0]: result.
TensorList SigmoidFormula(const ElementwiseBackward& n, const Tensor& g) {
  const Tensor y = n.Saved(0);
  if (CanFuse({g, y})) return {FusedGrad(SigmoidGrad{}, g, y)};
  return {SigmoidBackwardOp(g, y)};
}

// d/dx erf(x) = 2 / sqrt(pi) * exp(-x^2).
struct ErfGrad {
  template <typename T>
  GS_HOST_DEVICE T operator()(T gv, T xv) const {
    return gv * T(2 / kSqrtPi) * std::exp(-xv * xv);
  }
};

// saved[0]: input.
TensorList ErfFormula(const ElementwiseBackward& n, const Tensor& g) {
  const Tensor x = n.Saved(0);
  if (CanFuse({g, x})) return {FusedGrad(ErfGrad{}, g, x)};
  return {mul(g, mul(exp(mul(mul(x, x), -1.0)), 2 / kSqrtPi))};
}

// g where y = relu(x) > 0, else 0.
struct ReluGrad {
  template <typename T>
  GS_HOST_DEVICE T operator()(T gv, T yv) const {
    return yv > 0 ? gv : T(0);
  }
};

// saved[0]: result.
TensorList ReluFormula(const ElementwiseBackward& n, const Tensor& g) {
  const Tensor y = n.Saved(0);
  if (CanFuse({g, y})) return {FusedGrad(ReluGrad{}, g, y)};
  // y >= 0, so sign(y) is the 0/1 mask; through sign it stays connected to y.
  return {mul(g, sign(y))};
}

enum GeluApproximation { kGeluNone = 0, kGeluTanh = 1 };

// The derivative of gelu at x.
template <typename T>
GS_HOST_DEVICE T GeluDerivative(T x, int approximation) {
  if (approximation == kGeluTanh) {
    const T x2 = x * x;
    const T t = std::tanh(T(kGeluTanhK) * (x + T(kGeluTanhC) * x2 * x));
    return T(0.5) * (T(1) + t) +
           T(0.5 * kGeluTanhK) * x * (T(1) - t * t) * (T(1) + T(3 * kGeluTanhC) * x2);
  }
  const T cdf = T(0.5) * (T(1) + std::erf(x * T(1 / kSqrt2)));
  const T pdf = std::exp(T(-0.5) * x * x) * T(1 / kSqrt2Pi);
  return cdf + x * pdf;
}

struct GeluGrad {
  int approximation;
  template <typename T>
  GS_HOST_DEVICE T operator()(T gv, T xv) const {
    return gv * GeluDerivative(xv, approximation);
  }
};

// saved[0]: input; variant: the approximation. The composite form is GeluDerivative written
// with differentiable ops.
TensorList GeluFormula(const ElementwiseBackward& n, const Tensor& g) {
  const Tensor x = n.Saved(0);
  const int approximation = n.variant;
  if (CanFuse({g, x})) return {FusedGrad(GeluGrad{approximation}, g, x)};
  if (approximation == kGeluTanh) {
    const Tensor x2 = mul(x, x);
    const Tensor t = tanh(mul(add(x, mul(mul(x2, x), kGeluTanhC)), kGeluTanhK));
    const Tensor left = mul(add(t, 1.0), 0.5);
    const Tensor right =
        mul(mul(mul(x, rsub(mul(t, t), 1)), add(mul(x2, 3 * kGeluTanhC), 1.0)), 0.5 * kGeluTanhK);
    return {mul(g, add(left, right))};
  }
  const Tensor cdf = mul(add(erf(mul(x, 1 / kSqrt2)), 1.0), 0.5);
  const Tensor pdf = mul(exp(mul(mul(x, x), -0.5)), 1 / kSqrt2Pi);
  return {mul(g, add(cdf, mul(x, pdf)))};
}

// Where softplus is linear (its result is its input): beta * x > threshold.
struct SoftplusLinear {
  double beta;
  double threshold;
  template <typename T>
  GS_HOST_DEVICE bool operator()(T v) const {
    return v * static_cast<T>(beta) > static_cast<T>(threshold);
  }
};

// g, or g * sigmoid(beta * x) where softplus is not linear.
struct SoftplusGrad {
  SoftplusLinear linear;
  template <typename T>
  GS_HOST_DEVICE T operator()(T gv, T xv) const {
    return linear(xv) ? gv : gv / (T(1) + std::exp(-xv * static_cast<T>(linear.beta)));
  }
};

// saved[0]: input; scalars: beta, threshold.
TensorList SoftplusFormula(const ElementwiseBackward& n, const Tensor& g) {
  const Tensor x = n.Saved(0);
  const SoftplusLinear is_linear{n.scalars[0], n.scalars[1]};
  if (CanFuse({g, x})) return {FusedGrad(SoftplusGrad{is_linear}, g, x)};
  const double beta = is_linear.beta;
  const Tensor linear = Mask(x.shape(), is_linear, x);
  return {where(linear, g, mul(g, sigmoid(mul(x, beta))))};
}

// Where clamp passes its input through (and its gradient back): lo <= x <= hi.
struct ClampInside {
  double lo;
  double hi;
  template <typename T>
  GS_HOST_DEVICE bool operator()(T v) const {
    return v >= static_cast<T>(lo) && v <= static_cast<T>(hi);
  }
};

struct ClampGrad {
  ClampInside inside;
  template <typename T>
  GS_HOST_DEVICE T operator()(T gv, T xv) const {
    return inside(xv) ? gv : T(0);
  }
};

// saved[0]: input; scalars: min, max (-inf / inf when not given).
TensorList ClampFormula(const ElementwiseBackward& n, const Tensor& g) {
  const Tensor x = n.Saved(0);
  const ClampInside inside{n.scalars[0], n.scalars[1]};
  if (CanFuse({g, x})) return {FusedGrad(ClampGrad{inside}, g, x)};
  return {where(Mask(x.shape(), inside, x), g, ZeroLike0d(g))};
}

// The forward functors of the unary ops, one per op.
GS_UNARY_FUNCTOR(Negate, WrapNeg(v));  // Note [Integer tensors wrap around]
GS_UNARY_FUNCTOR(SignOf, static_cast<T>((v > T(0)) - (v < T(0))));
GS_UNARY_FUNCTOR(AbsOf, v < 0 ? WrapNeg(v) : v);
GS_UNARY_FUNCTOR(ExpOf, std::exp(v));
GS_UNARY_FUNCTOR(LogOf, std::log(v));
GS_UNARY_FUNCTOR(SqrtOf, std::sqrt(v));
GS_UNARY_FUNCTOR(RsqrtOf, T(1) / std::sqrt(v));
GS_UNARY_FUNCTOR(SinOf, std::sin(v));
GS_UNARY_FUNCTOR(CosOf, std::cos(v));
GS_UNARY_FUNCTOR(TanhOf, std::tanh(v));
GS_UNARY_FUNCTOR(SigmoidOf, T(1) / (T(1) + std::exp(-v)));
GS_UNARY_FUNCTOR(ErfOf, std::erf(v));

// `v < 0 ? 0 : v` keeps NaN, as PyTorch's relu does.
GS_UNARY_FUNCTOR(ReluOf, v < 0 ? T(0) : v);

// gelu with approximate='tanh'.
struct GeluTanh {
  template <typename T>
  GS_HOST_DEVICE T operator()(T v) const {
    return T(0.5) * v * (T(1) + std::tanh(T(kGeluTanhK) * (v + T(kGeluTanhC) * v * v * v)));
  }
};

// gelu with approximate='none': v * Phi(v), Phi the standard normal CDF.
struct GeluErf {
  template <typename T>
  GS_HOST_DEVICE T operator()(T v) const {
    return T(0.5) * v * (T(1) + std::erf(v * T(1 / kSqrt2)));
  }
};

struct Softplus {
  SoftplusLinear linear;
  template <typename T>
  GS_HOST_DEVICE T operator()(T v) const {
    const T beta = static_cast<T>(linear.beta);
    return linear(v) ? v : std::log1p(std::exp(v * beta)) / beta;
  }
};

// clamp of int64 by integral bounds, which stays int64.
struct ClampInt {
  int64_t lo;
  int64_t hi;
  GS_HOST_DEVICE int64_t operator()(int64_t v) const {
    const int64_t low = v < lo ? lo : v;
    return low > hi ? hi : low;
  }
};

struct Clamp {
  double lo;
  double hi;
  template <typename T>
  GS_HOST_DEVICE T operator()(T v) const {
    // Applying max last makes min > max give max everywhere, as in PyTorch; NaN stays.
    const T low = v < static_cast<T>(lo) ? static_cast<T>(lo) : v;
    return low > static_cast<T>(hi) ? static_cast<T>(hi) : low;
  }
};

}  // namespace

Tensor neg(const Tensor& input) {
  return Unary<false>("neg", "NegBackward0", &NegFormula, Save::kNothing, input, Negate{});
}

Tensor sign(const Tensor& input) {
  return Unary<false>("sign", "SignBackward0", &SignFormula, Save::kNothing, input, SignOf{});
}

Tensor abs(const Tensor& input) {
  return Unary<false>("abs", "AbsBackward0", &AbsFormula, Save::kInput, input, AbsOf{});
}

Tensor exp(const Tensor& input) {
  return Unary<true>("exp", "ExpBackward0", &ExpFormula, Save::kResult, input, ExpOf{});
}

Tensor log(const Tensor& input) {
  return Unary<true>("log", "LogBackward0", &LogFormula, Save::kInput, input, LogOf{});
}

Tensor sqrt(const Tensor& input) {
  return Unary<true>("sqrt", "SqrtBackward0", &SqrtFormula, Save::kResult, input, SqrtOf{});
}

Tensor rsqrt(const Tensor& input) {
  return Unary<true>("rsqrt", "RsqrtBackward0", &RsqrtFormula, Save::kResult, input, RsqrtOf{});
}

Tensor sin(const Tensor& input) {
  return Unary<true>("sin", "SinBackward0", &SinFormula, Save::kInput, input, SinOf{});
}

Tensor cos(const Tensor& input) {
  return Unary<true>("cos", "CosBackward0", &CosFormula, Save::kInput, input, CosOf{});
}

Tensor tanh(const Tensor& input) {
  return Unary<true>("tanh", "TanhBackward0", &TanhFormula, Save::kResult, input, TanhOf{});
}

Tensor sigmoid(const Tensor& input) {
  return Unary<true>("sigmoid", "SigmoidBackward0", &SigmoidFormula, Save::kResult, input,
                     SigmoidOf{});
}

Tensor erf(const Tensor& input) {
  return Unary<true>("erf", "ErfBackward0", &ErfFormula, Save::kInput, input, ErfOf{});
}

Tensor relu(const Tensor& input) {
  return Unary<false>("relu", "ReluBackward0", &ReluFormula, Save::kResult, input, ReluOf{});
}

Tensor gelu(const Tensor& input, absl::string_view approximate) {
  GS_CHECK_ARG(approximate == "none" || approximate == "tanh",
               "gelu: approximate must be 'none' or 'tanh', got ", Quote(approximate));
  const int approximation = approximate == "tanh" ? kGeluTanh : kGeluNone;
  std::shared_ptr<ElementwiseBackward> node;
  Tensor out = approximation == kGeluTanh ? Unary<true>("gelu", "GeluBackward0", &GeluFormula,
                                                        Save::kInput, input, GeluTanh{}, &node)
                                          : Unary<true>("gelu", "GeluBackward0", &GeluFormula,
                                                        Save::kInput, input, GeluErf{}, &node);
  if (node) node->variant = approximation;
  return out;
}

Tensor softplus(const Tensor& input, double beta, double threshold) {
  std::shared_ptr<ElementwiseBackward> node;
  Tensor out = Unary<true>("softplus", "SoftplusBackward0", &SoftplusFormula, Save::kInput, input,
                           Softplus{{beta, threshold}}, &node);
  if (node) node->scalars = {beta, threshold};
  return out;
}

namespace {

// clamp and clamp_ (into: self, Note [In-place ops]).
Tensor ClampImpl(const char* op, const Tensor& input, std::optional<double> min,
                 std::optional<double> max, bool integral_bounds, const Tensor* into) {
  GS_CHECK_ARG(min.has_value() || max.has_value(), op,
               ": at least one of min and max must be given");
  CheckInput(op, "input", input);
  RequireNotBool(op, "input", input);
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const double lo = min.value_or(-kInf);
  const double hi = max.value_or(kInf);
  if (input.dtype() == DType::kInt64 && integral_bounds) {
    // Bounds past int64's range bound nothing (Note [Integer tensors wrap around]).
    const auto bound = [](double v) {
      constexpr double kLimit = 0x1p63;
      if (v < -kLimit) return std::numeric_limits<int64_t>::min();
      return v < kLimit ? static_cast<int64_t>(v) : std::numeric_limits<int64_t>::max();
    };
    const int64_t ilo = bound(min.value_or(-kInf));
    const int64_t ihi = bound(max.value_or(kInf));
    return MapSameDTypeInto<false>(into, op, input.shape(), ClampInt{ilo, ihi}, input);
  }
  std::shared_ptr<ElementwiseBackward> node;
  Tensor out = Unary<true>(op, "ClampBackward1", &ClampFormula, Save::kInput, input, Clamp{lo, hi},
                           &node, into);
  if (node) node->scalars = {lo, hi};
  return out;
}

}  // namespace

Tensor clamp(const Tensor& input, std::optional<double> min, std::optional<double> max,
             bool integral_bounds) {
  return ClampImpl("clamp", input, min, max, integral_bounds, nullptr);
}

// --- where ---

namespace {

// c ? a : b.
struct Select {
  template <typename T>
  GS_HOST_DEVICE T operator()(bool c, T a, T b) const {
    return c ? a : b;
  }
};

// saved[0]: condition; shapes: input, other.
TensorList WhereFormula(const ElementwiseBackward& n, const Tensor& g) {
  TensorList r(3);
  const Tensor condition = n.Saved(0);
  const Tensor zero = ZeroLike0d(g);
  if (n.Needs(1)) r[1] = sum_to(where(condition, g, zero), n.shapes[0]);
  if (n.Needs(2)) r[2] = sum_to(where(condition, zero, g), n.shapes[1]);
  return r;
}

}  // namespace

Tensor where(const Tensor& condition, const Tensor& input, const Tensor& other) {
  CheckInput("where", "condition", condition);
  GS_CHECK_ARG(condition.dtype() == DType::kBool, "where: condition must be bool, got ",
               DTypeName(condition.dtype()));
  RequireSameDevice("where", "condition", condition, "input", input);
  Promoted p("where", "input", input, "other", other);
  const Shape shape = BroadcastShapesOrThrow("where", condition.shape(), p.shape);
  Tensor out = Tensor::Empty(shape, p.dtype, p.input.device());
  DispatchDType(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    MapKernel<T, bool, T, T>(out, Select{}, condition, p.input, p.other);
  });
  if (auto node = Record(out, {condition, p.input, p.other}, "WhereBackward0", &WhereFormula)) {
    node->saved[0] = SavedVariable(condition, false);
    node->shapes = {p.input.shape(), p.other.shape()};
  }
  return out;
}

// --- to ---

namespace {

// variant: the input's dtype.
TensorList ToFormula(const ElementwiseBackward& n, const Tensor& g) {
  return {to(g, static_cast<DType>(n.variant))};
}

}  // namespace

Tensor to(const Tensor& input, DType dtype) {
  RequireDefined("to", "input", input);
  if (input.dtype() == dtype) return input;
  Tensor out = input.To(dtype);
  if (IsFloating(dtype)) {
    if (auto node = Record(out, {input}, "ToCopyBackward0", &ToFormula)) {
      node->variant = static_cast<int>(input.dtype());
    }
  }
  return out;
}

// --- In-place forms (Note [In-place ops]) ---

namespace {

// The in-place form of a unary op: self is written; a formula that reads the input (kInput)
// gets a copy of self from before the write.
template <bool kFloating, typename Fn>
Tensor UnaryInPlace(const char* op, const char* node_name, Formula formula, Save save,
                    const Tensor& self, const Fn& fn) {
  CheckInPlace(op, self, {});
  const Tensor input = OriginalSelf(self, save == Save::kInput && ShouldRecordAny({self}));
  return Unary<kFloating>(op, node_name, formula, save, input, fn, nullptr, &self);
}

// An operand of an in-place op as it reads: a copy when it shares self's elements, which the
// write changes under it (x.mul_(x)).
Tensor Operand(const Tensor& other, const Tensor& self) {
  return OriginalSelf(other, SharesElements(other, self));
}

// Note [In-place results in a wider dtype]
// PyTorch computes self.add_(other) in the dtype the out-of-place op gives
// (torch.result_type) and writes it into self when that dtype can be cast to self's
// (torch.can_cast: never from a floating dtype to an integral or bool one, never to bool from
// another). When the result's dtype is self's, the op maps straight into self (its Impl casts
// other first, as the out-of-place op does). When it is wider and castable (a float32 self, a
// float64 other), this makes the result out of place from self's old value and copies it in
// with copy_, whose backward hands self's gradient to that result: the gradients are
// PyTorch's, the Nodes the op's under a CopyBackwards, and this case alone allocates the result.
// out_of_place(old_self) makes the op's result. Returns nullopt when the result's dtype is
// self's, or cannot be cast to it (the Impl then refuses it: CheckInPlaceResult).
template <typename OutOfPlace>
std::optional<Tensor> WriteWiderResult(const Tensor& self, const Tensor& other,
                                       const OutOfPlace& out_of_place) {
  // One dtype (most calls): the result's is self's, with no promotion to work out.
  if (!self.defined() || !other.defined() || self.dtype() == other.dtype()) return std::nullopt;
  const DType result = ResultType({&self, &other});
  const bool castable = (!IsFloating(result) || IsFloating(self.dtype())) &&
                        (result == DType::kBool || self.dtype() != DType::kBool);
  if (result == self.dtype() || !castable) return std::nullopt;
  const Tensor old_self = OriginalSelf(self, ShouldRecordAny({self, other}));
  return copy_(self, out_of_place(old_self));
}

// Sets every element to the same value: no gradient flows back to the old value.
TensorList ZerosFormula(const ElementwiseBackward& n, const Tensor& g) {
  TensorList r(n.num_outputs());
  if (n.Needs(0)) r[0] = Tensor::Zeros(g.shape(), g.dtype(), g.device());
  return r;
}

// copy_: none to self's old value; to src, g summed to its shape in its dtype (variant).
TensorList CopyFormula(const ElementwiseBackward& n, const Tensor& g) {
  TensorList r = ZerosFormula(n, g);
  if (n.Needs(1)) r[1] = to(sum_to(g, n.shapes[1]), static_cast<DType>(n.variant));
  return r;
}

// saved[0]: the mask. None where it was filled.
TensorList MaskedFillFormula(const ElementwiseBackward& n, const Tensor& g) {
  return {where(n.Saved(0), ZeroLike0d(g), g)};
}

// value where the mask is set, else v.
struct FillWhere {
  double value;
  template <typename T>
  GS_HOST_DEVICE T operator()(bool c, T v) const {
    return c ? static_cast<T>(value) : v;
  }
};

// Writes `value` everywhere into self (fill_, zero_).
Tensor FillImpl(const char* op, const char* node_name, const Tensor& self, double value) {
  CheckInPlace(op, self, {});
  Fill(self, value);
  self.BumpVersion();
  Tensor out = self;
  Record(out, {self}, node_name, &ZerosFormula);
  return out;
}

}  // namespace

Tensor add_(const Tensor& self, const Tensor& other, double alpha) {
  CheckInPlace("add_", self, {other});
  if (auto wider =
          WriteWiderResult(self, other, [&](const Tensor& s) { return add(s, other, alpha); })) {
    return *wider;  // Note [In-place results in a wider dtype]
  }
  return AddImpl("add_", "AddBackward0", self, Operand(other, self), alpha, &self);
}

Tensor add_(const Tensor& self, double other, double alpha) {
  CheckInPlace("add_", self, {});
  return AffineScalar("add_", "AddBackward0", self, 1, alpha * other, &self);
}

Tensor sub_(const Tensor& self, const Tensor& other, double alpha) {
  CheckInPlace("sub_", self, {other});
  if (auto wider =
          WriteWiderResult(self, other, [&](const Tensor& s) { return sub(s, other, alpha); })) {
    return *wider;  // Note [In-place results in a wider dtype]
  }
  RequireNotBool("sub_", "other", other);
  return AddImpl("sub_", "SubBackward0", self, Operand(other, self), -alpha, &self);
}

Tensor sub_(const Tensor& self, double other, double alpha) {
  CheckInPlace("sub_", self, {});
  return AffineScalar("sub_", "SubBackward0", self, 1, -alpha * other, &self);
}

Tensor mul_(const Tensor& self, const Tensor& other) {
  CheckInPlace("mul_", self, {other});
  if (auto wider = WriteWiderResult(self, other, [&](const Tensor& s) { return mul(s, other); })) {
    return *wider;  // Note [In-place results in a wider dtype]
  }
  const Tensor o = Operand(other, self);
  // MulBackward0 saves the input for the other's gradient.
  const bool saves_self = ShouldRecordAny({self, o}) && o.requires_grad();
  return MulImpl("mul_", OriginalSelf(self, saves_self), o, &self);
}

Tensor mul_(const Tensor& self, double other) {
  CheckInPlace("mul_", self, {});
  return AffineScalar("mul_", "MulBackward0", self, other, 0, &self);
}

Tensor div_(const Tensor& self, const Tensor& other) {
  CheckInPlace("div_", self, {other});
  if (auto wider = WriteWiderResult(self, other, [&](const Tensor& s) { return div(s, other); })) {
    return *wider;  // Note [In-place results in a wider dtype]
  }
  const Tensor o = Operand(other, self);
  // DivBackward0 saves the input for the other's gradient.
  const bool saves_self = ShouldRecordAny({self, o}) && o.requires_grad();
  return DivImpl("div_", OriginalSelf(self, saves_self), o, &self);
}

Tensor div_(const Tensor& self, double other) {
  CheckInPlace("div_", self, {});
  return DivScalarImpl("div_", self, other, &self);
}

Tensor tanh_(const Tensor& self) {
  return UnaryInPlace<true>("tanh_", "TanhBackward0", &TanhFormula, Save::kResult, self, TanhOf{});
}

Tensor sigmoid_(const Tensor& self) {
  return UnaryInPlace<true>("sigmoid_", "SigmoidBackward0", &SigmoidFormula, Save::kResult, self,
                            SigmoidOf{});
}

Tensor relu_(const Tensor& self) {
  return UnaryInPlace<false>("relu_", "ReluBackward0", &ReluFormula, Save::kResult, self, ReluOf{});
}

Tensor clamp_(const Tensor& self, std::optional<double> min, std::optional<double> max,
              bool integral_bounds) {
  CheckInPlace("clamp_", self, {});
  // ClampBackward1 saves the input.
  return ClampImpl("clamp_", OriginalSelf(self, ShouldRecordAny({self})), min, max, integral_bounds,
                   &self);
}

Tensor fill_(const Tensor& self, double value) {
  // PyTorch's name: fill_.Scalar is the third of fill's overloads.
  return FillImpl("fill_", "FillBackward2", self, value);
}

Tensor zero_(const Tensor& self) { return FillImpl("zero_", "ZeroBackward0", self, 0); }

Tensor copy_(const Tensor& self, const Tensor& src) {
  CheckInPlace("copy_", self, {src});
  CheckInput("copy_", "src", src);
  RequireSameDevice("copy_", "self", self, "src", src);
  CheckInPlaceResult("copy_", self, BroadcastShapesOrThrow("copy_", self.shape(), src.shape()),
                     self.dtype());
  const Tensor s = Operand(src, self);
  CopyInto(self, broadcast_to(s.detach(), self.shape()));
  self.BumpVersion();
  Tensor out = self;
  if (auto node = Record(out, {self, s}, "CopyBackwards", &CopyFormula)) {
    node->shapes[1] = s.shape();
    node->variant = static_cast<int>(s.dtype());
  }
  return out;
}

Tensor masked_fill_(const Tensor& self, const Tensor& mask, double value) {
  CheckInPlace("masked_fill_", self, {mask});
  CheckInput("masked_fill_", "mask", mask);
  GS_CHECK_ARG(mask.dtype() == DType::kBool, "masked_fill_: mask must be bool, got ",
               DTypeName(mask.dtype()));
  RequireSameDevice("masked_fill_", "self", self, "mask", mask);
  CheckInPlaceResult("masked_fill_", self,
                     BroadcastShapesOrThrow("masked_fill_", self.shape(), mask.shape()),
                     self.dtype());
  const Tensor m = Operand(mask, self);
  DispatchDType(self.dtype(), [&](auto tag) {
    using T = decltype(tag);
    MapKernel<T, bool, T>(self, FillWhere{value}, m, self);
  });
  self.BumpVersion();
  Tensor out = self;
  if (auto node = Record(out, {self}, "MaskedFillBackward0", &MaskedFillFormula)) {
    node->saved[0] = SavedVariable(m, false);
  }
  return out;
}

// --- Registration ---

namespace {

bool HasInput(const TensorList& inputs, size_t i) {
  return inputs.size() > i && inputs[i].defined();
}

// True if attribute `name` was given as an int.
bool IsIntAttr(const Attrs& attrs, const std::string& name) {
  auto it = attrs.values().find(name);
  return it != attrs.values().end() && TypeOf(it->second) == AttrType::kInt;
}

// Runs a binary op whose second operand `arg` is either inputs[1] or, when that is left out, a
// scalar attribute of the same name. An int scalar with an integer or bool input takes part as a
// 0-d int64 tensor, so the result stays integral, as PyTorch's int scalars do.
template <typename TensorFn, typename ScalarFn>
TensorList RunWithOperand(const char* op, const std::string& arg, const TensorList& inputs,
                          const Attrs& attrs, TensorFn&& with_tensor, ScalarFn&& with_scalar) {
  if (HasInput(inputs, 1)) {
    GS_CHECK_ARG(!attrs.has(arg), op, ": give ", arg,
                 " either as an input tensor or as an attribute, not both");
    return {with_tensor(inputs[1])};
  }
  GS_CHECK_ARG(attrs.has(arg), op, ": ", arg,
               " is missing: give it as an input tensor or as a scalar attribute");
  if (IsIntAttr(attrs, arg) && inputs[0].defined() && !IsFloating(inputs[0].dtype())) {
    // Exact: a double holds integers only up to 2**53.
    return {
        with_tensor(Tensor::FromVector<int64_t>({attrs.GetInt(arg)}, {}).To(inputs[0].device()))};
  }
  return {with_scalar(attrs.GetFloat(arg))};
}

const std::vector<DType> kFloatingDTypes = {DType::kFloat32, DType::kFloat64};
const std::vector<DType> kNumericDTypes = {DType::kFloat32, DType::kFloat64, DType::kInt64};
const std::vector<DType> kAllDTypes = {DType::kFloat32, DType::kFloat64, DType::kInt64,
                                       DType::kBool};

OpSchema MakeSchema(std::string name, std::string doc, std::vector<std::string> inputs,
                    std::vector<AttrSpec> attrs, std::vector<DType> dtypes,
                    decltype(OpSchema::run) run, int optional_inputs = 0) {
  OpSchema schema;
  schema.name = std::move(name);
  schema.doc = std::move(doc);
  schema.input_names = std::move(inputs);
  schema.optional_inputs = optional_inputs;
  schema.attrs = std::move(attrs);
  schema.dtypes = std::move(dtypes);
  schema.run = std::move(run);
  return schema;
}

AttrSpec ScalarOperandAttr(const std::string& name) {
  return {name, AttrType::kFloat, false,
          "scalar " + name + ", used when the input " + name +
              " is left out (an int keeps integer tensors integral)"};
}

void RegisterArithmetic(OpRegistry& registry) {
  const AttrSpec alpha{"alpha", AttrType::kFloat, false, "multiplier of other (default 1)"};
  registry.Add(MakeSchema(
      "add", "input + alpha * other, broadcasting", {"input", "other"},
      {ScalarOperandAttr("other"), alpha}, kAllDTypes,
      [](const TensorList& in, const Attrs& attrs) {
        const double a = attrs.GetFloat("alpha", 1);
        return RunWithOperand(
            "add", "other", in, attrs, [&](const Tensor& o) { return add(in[0], o, a); },
            [&](double o) { return add(in[0], o, a); });
      },
      1));
  registry.Add(MakeSchema(
      "sub", "input - alpha * other, broadcasting", {"input", "other"},
      {ScalarOperandAttr("other"), alpha}, kNumericDTypes,
      [](const TensorList& in, const Attrs& attrs) {
        const double a = attrs.GetFloat("alpha", 1);
        return RunWithOperand(
            "sub", "other", in, attrs, [&](const Tensor& o) { return sub(in[0], o, a); },
            [&](double o) { return sub(in[0], o, a); });
      },
      1));
  registry.Add(MakeSchema(
      "mul", "input * other, broadcasting", {"input", "other"}, {ScalarOperandAttr("other")},
      kAllDTypes,
      [](const TensorList& in, const Attrs& attrs) {
        return RunWithOperand(
            "mul", "other", in, attrs, [&](const Tensor& o) { return mul(in[0], o); },
            [&](double o) { return mul(in[0], o); });
      },
      1));
  registry.Add(MakeSchema(
      "div", "input / other (true division), broadcasting", {"input", "other"},
      {ScalarOperandAttr("other")}, kAllDTypes,
      [](const TensorList& in, const Attrs& attrs) {
        return RunWithOperand(
            "div", "other", in, attrs, [&](const Tensor& o) { return div(in[0], o); },
            [&](double o) { return div(in[0], o); });
      },
      1));
  registry.Add(MakeSchema(
      "pow", "input ** exponent, broadcasting", {"input", "exponent"},
      {ScalarOperandAttr("exponent")}, kNumericDTypes,
      [](const TensorList& in, const Attrs& attrs) {
        return RunWithOperand(
            "pow", "exponent", in, attrs, [&](const Tensor& e) { return pow(in[0], e); },
            [&](double e) { return pow(in[0], e); });
      },
      1));
}

// The in-place forms: the schemas of their out-of-place ops with "self" first.
void RegisterInPlace(OpRegistry& registry) {
  const AttrSpec alpha{"alpha", AttrType::kFloat, false, "multiplier of other (default 1)"};
  auto add = [&](OpSchema schema) {
    schema.in_place = true;
    registry.Add(std::move(schema));
  };
  add(MakeSchema(
      "add_", "self += alpha * other, in place", {"self", "other"},
      {ScalarOperandAttr("other"), alpha}, kNumericDTypes,
      [](const TensorList& in, const Attrs& attrs) {
        const double a = attrs.GetFloat("alpha", 1);
        return RunWithOperand(
            "add_", "other", in, attrs, [&](const Tensor& o) { return add_(in[0], o, a); },
            [&](double o) { return add_(in[0], o, a); });
      },
      1));
  add(MakeSchema(
      "sub_", "self -= alpha * other, in place", {"self", "other"},
      {ScalarOperandAttr("other"), alpha}, kNumericDTypes,
      [](const TensorList& in, const Attrs& attrs) {
        const double a = attrs.GetFloat("alpha", 1);
        return RunWithOperand(
            "sub_", "other", in, attrs, [&](const Tensor& o) { return sub_(in[0], o, a); },
            [&](double o) { return sub_(in[0], o, a); });
      },
      1));
  add(MakeSchema(
      "mul_", "self *= other, in place", {"self", "other"}, {ScalarOperandAttr("other")},
      kNumericDTypes,
      [](const TensorList& in, const Attrs& attrs) {
        return RunWithOperand(
            "mul_", "other", in, attrs, [&](const Tensor& o) { return mul_(in[0], o); },
            [&](double o) { return mul_(in[0], o); });
      },
      1));
  add(MakeSchema(
      "div_", "self /= other (true division), in place; self floating", {"self", "other"},
      {ScalarOperandAttr("other")}, kFloatingDTypes,
      [](const TensorList& in, const Attrs& attrs) {
        return RunWithOperand(
            "div_", "other", in, attrs, [&](const Tensor& o) { return div_(in[0], o); },
            [&](double o) { return div_(in[0], o); });
      },
      1));
  struct Entry {
    const char* name;
    const char* doc;
    Tensor (*fn)(const Tensor&);
    const std::vector<DType>* dtypes;
  };
  const Entry entries[] = {
      {"tanh_", "hyperbolic tangent, in place", &tanh_, &kFloatingDTypes},
      {"sigmoid_", "1 / (1 + exp(-self)), in place", &sigmoid_, &kFloatingDTypes},
      {"relu_", "max(self, 0), in place", &relu_, &kNumericDTypes},
      {"zero_", "every element 0, in place", &zero_, &kAllDTypes},
  };
  for (const Entry& e : entries) {
    Tensor (*fn)(const Tensor&) = e.fn;
    add(MakeSchema(e.name, e.doc, {"self"}, {}, *e.dtypes,
                   [fn](const TensorList& in, const Attrs&) { return TensorList{fn(in[0])}; }));
  }
  add(MakeSchema("clamp_", "min(max(self, min), max), in place; at least one bound", {"self"},
                 {{"min", AttrType::kFloat, false, "lower bound (default none)"},
                  {"max", AttrType::kFloat, false, "upper bound (default none)"}},
                 kNumericDTypes, [](const TensorList& in, const Attrs& attrs) {
                   const bool integral = (!attrs.has("min") || IsIntAttr(attrs, "min")) &&
                                         (!attrs.has("max") || IsIntAttr(attrs, "max"));
                   return TensorList{clamp_(in[0], attrs.GetOptionalFloat("min"),
                                            attrs.GetOptionalFloat("max"), integral)};
                 }));
  add(MakeSchema("fill_", "every element value, in place", {"self"},
                 {{"value", AttrType::kFloat, true, "the value"}}, kAllDTypes,
                 [](const TensorList& in, const Attrs& attrs) {
                   return TensorList{fill_(in[0], attrs.GetFloat("value"))};
                 }));
  add(MakeSchema("copy_", "self = src (broadcast and converted to self), in place", {"self", "src"},
                 {}, kAllDTypes, [](const TensorList& in, const Attrs&) {
                   return TensorList{copy_(in[0], in[1])};
                 }));
  add(MakeSchema("masked_fill_", "value where mask (bool, broadcast) is set, in place",
                 {"self", "mask"}, {{"value", AttrType::kFloat, true, "the value"}}, kAllDTypes,
                 [](const TensorList& in, const Attrs& attrs) {
                   return TensorList{masked_fill_(in[0], in[1], attrs.GetFloat("value"))};
                 }));
}

void RegisterUnary(OpRegistry& registry) {
  struct Entry {
    const char* name;
    const char* doc;
    Tensor (*fn)(const Tensor&);
    bool numeric;  // keeps int64 (otherwise floating by nature: ints compute as float32)
  };
  const Entry entries[] = {
      {"neg", "-input", &neg, true},
      {"abs", "|input|", &abs, true},
      {"sign", "-1, 0 or 1 by the sign of input; its gradient is zero", &sign, true},
      {"exp", "e ** input", &exp, false},
      {"log", "natural logarithm", &log, false},
      {"sqrt", "square root", &sqrt, false},
      {"rsqrt", "1 / sqrt(input)", &rsqrt, false},
      {"sin", "sine", &sin, false},
      {"cos", "cosine", &cos, false},
      {"tanh", "hyperbolic tangent", &tanh, false},
      {"sigmoid", "1 / (1 + exp(-input))", &sigmoid, false},
      {"relu", "max(input, 0)", &relu, true},
  };
  for (const Entry& e : entries) {
    Tensor (*fn)(const Tensor&) = e.fn;
    registry.Add(
        MakeSchema(e.name, e.doc, {"input"}, {}, e.numeric ? kNumericDTypes : kAllDTypes,
                   [fn](const TensorList& in, const Attrs&) { return TensorList{fn(in[0])}; }));
  }
  registry.Add(MakeSchema("gelu", "input * Phi(input), the Gaussian error linear unit", {"input"},
                          {{"approximate", AttrType::kString, false, "'none' (default) or 'tanh'"}},
                          kAllDTypes, [](const TensorList& in, const Attrs& attrs) {
                            return TensorList{gelu(in[0], attrs.GetString("approximate", "none"))};
                          }));
  registry.Add(MakeSchema("softplus",
                          "log(1 + exp(beta * input)) / beta; input where beta * input > threshold",
                          {"input"},
                          {{"beta", AttrType::kFloat, false, "default 1"},
                           {"threshold", AttrType::kFloat, false, "default 20"}},
                          kAllDTypes, [](const TensorList& in, const Attrs& attrs) {
                            return TensorList{softplus(in[0], attrs.GetFloat("beta", 1),
                                                       attrs.GetFloat("threshold", 20))};
                          }));
  registry.Add(MakeSchema("clamp", "min(max(input, min), max); at least one bound", {"input"},
                          {{"min", AttrType::kFloat, false, "lower bound (default none)"},
                           {"max", AttrType::kFloat, false, "upper bound (default none)"}},
                          kNumericDTypes, [](const TensorList& in, const Attrs& attrs) {
                            const bool integral = (!attrs.has("min") || IsIntAttr(attrs, "min")) &&
                                                  (!attrs.has("max") || IsIntAttr(attrs, "max"));
                            return TensorList{clamp(in[0], attrs.GetOptionalFloat("min"),
                                                    attrs.GetOptionalFloat("max"), integral)};
                          }));
  registry.Add(MakeSchema(
      "where", "condition ? input : other, broadcasting; condition is bool",
      {"condition", "input", "other"}, {}, kAllDTypes,
      [](const TensorList& in, const Attrs&) { return TensorList{where(in[0], in[1], in[2])}; }));
}

}  // namespace

// --- Chains of elementwise ops (Note [Elementwise chains]) ---

namespace {

// out[i] = fn(a[i]) or fn(a[i], b[i]) over n elements; out may be a (read before written).
template <typename T, typename Fn>
void MapN(T* out, int64_t n, const Fn& fn, const T* a) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(fn(a[i]));
}
template <typename T, typename Fn>
void MapN(T* out, int64_t n, const Fn& fn, const T* a, const T* b) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(fn(a[i], b[i]));
}

// The functor each forward op runs, as its op picks it (sub: AddImpl's PlusScaled of -1).
template <typename T>
void ChainStepForward(ChainOp op, T* out, int64_t n, const T* a, const T* b) {
  switch (op) {
    case ChainOp::kAdd:
      return MapN(out, n, Plus{}, a, b);
    case ChainOp::kSub:
      return MapN(out, n, PlusScaled{-1.0}, a, b);
    case ChainOp::kMul:
      return MapN(out, n, Times{}, a, b);
    case ChainOp::kNeg:
      return MapN(out, n, Negate{}, a);
    case ChainOp::kExp:
      return MapN(out, n, ExpOf{}, a);
    case ChainOp::kTanh:
      return MapN(out, n, TanhOf{}, a);
    case ChainOp::kSigmoid:
      return MapN(out, n, SigmoidOf{}, a);
    case ChainOp::kSin:
      return MapN(out, n, SinOf{}, a);
    case ChainOp::kCos:
      return MapN(out, n, CosOf{}, a);
    case ChainOp::kRelu:
      return MapN(out, n, ReluOf{}, a);
  }
}

// Note [Elementwise chains]. saved: the head, and each mul's other operand (what MulBackward0
// saves; add and sub save none); values: every op's output, one row each. A link's operands are
// (chain value, other) in the order of chain_operand.
class ElementwiseChainBackward final : public autograd::Node {
 public:
  TensorList apply(TensorList&& grads) override {
    GS_CHECK_INTERNAL(!autograd::GradMode::is_enabled(),
                      "an elementwise chain cannot be differentiated again (Note [Elementwise "
                      "chains])");
    TensorList r(num_outputs());
    if (!grads[0].defined()) return r;
    const Tensor head = saved_head.unpack(this);
    const Tensor values = saved_values.unpack(this);
    // The gradient of the chain's value, updated op by op from the last.
    const Tensor g = grads[0].Clone();
    DispatchFloating(g.dtype(), [&](auto tag) {
      using T = decltype(tag);
      Backward<T>(head, values, g, r);
    });
    return r;
  }
  std::string name() const override { return "ElementwiseChainBackward"; }
  void release_variables() override {
    saved_head.reset();
    saved_values.reset();
    for (Link& link : links) link.other.reset();
  }

  struct Link {
    ChainOp op;
    int chain_operand;
    SavedVariable other;  // mul's other operand
    int edge = -1;        // binary ops: the next edge of the other operand's gradient
  };
  std::vector<Link> links;
  SavedVariable saved_head;
  SavedVariable saved_values;
  int head_edge = 0;  // the next edge of the head's gradient

 private:
  template <typename T>
  void Backward(const Tensor& head, const Tensor& values, const Tensor& g, TensorList& r) const {
    const int64_t n = g.numel();
    T* gv = g.data<T>();
    const T* rows = values.data<T>();
    for (size_t j = links.size(); j-- > 0;) {
      const Link& link = links[j];
      const T* in = j == 0 ? head.data<T>() : rows + static_cast<int64_t>(j - 1) * n;
      const T* out = rows + static_cast<int64_t>(j) * n;
      if (link.edge >= 0) {
        // The other operand's gradient, as the op's formula makes it.
        if (should_compute_output(static_cast<size_t>(link.edge))) {
          Tensor d = Tensor::Empty(g.shape(), g.dtype());
          T* dv = d.data<T>();
          const bool other_first = link.chain_operand == 1;
          switch (link.op) {
            case ChainOp::kAdd:
              std::copy(gv, gv + n, dv);
              break;
            case ChainOp::kSub:  // input gets g, other gets Scale(g, -1)
              if (other_first) {
                std::copy(gv, gv + n, dv);
              } else {
                MapN(dv, n, Affine{-1.0, 0.0}, gv);
              }
              break;
            case ChainOp::kMul:  // each operand gets g times the other
              MapN(dv, n, Times{}, gv, in);
              break;
            default:
              GS_CHECK_INTERNAL(false, "a unary chain op has no other operand");
          }
          r[static_cast<size_t>(link.edge)] = std::move(d);
        }
        if (link.op == ChainOp::kMul) {
          const Tensor other = link.other.unpack(this);
          MapN(gv, n, Times{}, gv, other.data<T>());
        } else if (link.op == ChainOp::kSub && link.chain_operand == 1) {
          MapN(gv, n, Affine{-1.0, 0.0}, gv);
        }
        continue;
      }
      switch (link.op) {
        case ChainOp::kNeg:
          MapN(gv, n, Negate{}, gv);
          break;
        case ChainOp::kExp:
          MapN(gv, n, Times{}, gv, out);
          break;
        case ChainOp::kTanh:
          MapN(gv, n, TanhGrad{}, gv, out);
          break;
        case ChainOp::kSigmoid:
          MapN(gv, n, SigmoidGrad{}, gv, out);
          break;
        case ChainOp::kSin:
          MapN(gv, n, SinGrad{}, gv, in);
          break;
        case ChainOp::kCos:
          MapN(gv, n, CosGrad{}, gv, in);
          break;
        case ChainOp::kRelu:
          MapN(gv, n, ReluGrad{}, gv, out);
          break;
        default:
          break;  // add, sub and mul: above
      }
    }
    if (should_compute_output(static_cast<size_t>(head_edge))) {
      r[static_cast<size_t>(head_edge)] = g;
    }
  }
};

}  // namespace

bool FitsChain(const Tensor& t, const Tensor& head) {
  return t.defined() && head.defined() &&
         (head.dtype() == DType::kFloat32 || head.dtype() == DType::kFloat64) &&
         t.dtype() == head.dtype() && t.device().is_cpu() && t.is_contiguous() && t.numel() > 0 &&
         t.numel() <= kMaxChainElements && SameShape(t.shape(), head.shape());
}

std::optional<ChainOp> ChainOpNamed(absl::string_view name) {
  static constexpr std::pair<absl::string_view, ChainOp> kNames[] = {
      {"add", ChainOp::kAdd},         {"sub", ChainOp::kSub}, {"mul", ChainOp::kMul},
      {"neg", ChainOp::kNeg},         {"exp", ChainOp::kExp}, {"tanh", ChainOp::kTanh},
      {"sigmoid", ChainOp::kSigmoid}, {"sin", ChainOp::kSin}, {"cos", ChainOp::kCos},
      {"relu", ChainOp::kRelu},
  };
  for (const auto& [n, op] : kNames) {
    if (n == name) return op;
  }
  return std::nullopt;
}

int ChainOpArity(ChainOp op) {
  return op == ChainOp::kAdd || op == ChainOp::kSub || op == ChainOp::kMul ? 2 : 1;
}

Tensor RunChain(const Tensor& head, absl::Span<const ChainLink> links, int64_t* recorded) {
  *recorded = 0;
  const int64_t k = static_cast<int64_t>(links.size());
  if (k == 0 || k > kMaxChainOps || !FitsChain(head, head)) return Tensor();
  // The ops that would record a Node: those from the first with an operand requiring grad.
  bool requires_grad = head.requires_grad();
  int64_t nodes = 0;
  for (const ChainLink& link : links) {
    const bool binary = ChainOpArity(link.op) == 2;
    if (binary != link.other.defined() || (binary && !FitsChain(link.other, head))) {
      return Tensor();
    }
    requires_grad = requires_grad || (binary && link.other.requires_grad());
    nodes += requires_grad ? 1 : 0;
  }
  const bool record = autograd::GradMode::is_enabled() && nodes > 0;
  // Every op's output in one buffer: no more elements than one tensor may have.
  const int64_t n = head.numel();
  if (const auto& budget = CurrentMemoryBudget();
      budget != nullptr && k * n > budget->max_tensor_elements()) {
    return Tensor();
  }
  Tensor values = Tensor::Empty({k, n}, head.dtype());
  Tensor out = Tensor::Empty(head.shape(), head.dtype());
  DispatchFloating(head.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* rows = values.data<T>();
    for (int64_t j = 0; j < k; ++j) {
      const ChainLink& link = links[static_cast<size_t>(j)];
      const T* chain = j == 0 ? head.data<T>() : rows + (j - 1) * n;
      const T* other = link.other.defined() ? link.other.data<T>() : nullptr;
      const bool other_first = link.chain_operand == 1;
      ChainStepForward(link.op, rows + j * n, n, other_first ? other : chain,
                       other_first ? chain : other);
    }
    std::copy(rows + (k - 1) * n, rows + k * n, out.data<T>());
  });
  if (!record) return out;

  // Edges by the last op first, each op's in its operands' order (Note [Elementwise chains]).
  TensorList edge_to;
  auto node = autograd::MakeNode<ElementwiseChainBackward>();
  node->links.resize(links.size());
  for (size_t j = links.size(); j-- > 0;) {
    const ChainLink& link = links[j];
    ElementwiseChainBackward::Link& saved = node->links[j];
    saved.op = link.op;
    saved.chain_operand = link.chain_operand;
    const bool head_first = j == 0 && link.chain_operand == 0;
    if (head_first) {
      node->head_edge = static_cast<int>(edge_to.size());
      edge_to.push_back(head);
    }
    if (link.other.defined()) {
      if (link.op == ChainOp::kMul) saved.other = SavedVariable(link.other, false);
      saved.edge = static_cast<int>(edge_to.size());
      edge_to.push_back(link.other);
    }
    if (j == 0 && !head_first) {
      node->head_edge = static_cast<int>(edge_to.size());
      edge_to.push_back(head);
    }
  }
  node->saved_head = SavedVariable(head, false);
  node->saved_values = SavedVariable(values, false);
  node->set_next_edges(autograd::CollectNextEdges(absl::MakeConstSpan(edge_to)));
  autograd::SetHistory(out, node);
  *recorded = nodes;
  return out;
}

void RegisterElementwiseOps(OpRegistry& registry) {
  RegisterArithmetic(registry);
  RegisterUnary(registry);
  RegisterInPlace(registry);
}

}  // namespace gradserve::ops
