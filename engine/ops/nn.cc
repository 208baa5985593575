#include "engine/ops/nn.h"

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/autograd/grad_mode.h"
#include "engine/autograd/node.h"
#include "engine/autograd/saved_variable.h"
#include "engine/ops/broadcast.h"
#include "engine/ops/conv_im2col.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/linalg.h"
#include "engine/ops/nn_kernels.h"
#include "engine/ops/record.h"
#include "engine/ops/reductions.h"
#include "engine/ops/shape.h"
#include "engine/ops/shape_common.h"
#include "engine/tensor/working_buffer.h"
#include "engine/util/cancellation.h"

namespace gradserve::ops {
namespace {

using autograd::GradMode;
using autograd::MakeNode;
using autograd::Node;
using autograd::SavedVariable;

// The accumulator type of a reduction over T: double, so float32 sums stay accurate.
using Acc = double;

bool NoIncomingGrad(const TensorList& grads) { return grads.empty() || !grads[0].defined(); }

// A tensor seen as [outer, size, inner] around one dim (DimSplit, nn_kernels.h).
DimSplit SplitAt(absl::Span<const int64_t> shape, int64_t dim) {
  if (shape.empty()) return {1, 1, 1};
  return {ProductOf(shape, 0, dim), shape[dim], ProductOf(shape, dim + 1, shape.size())};
}

// Calls fn(base) for each row of a [outer, size, inner] layout; row element k is at
// base + k * inner.
template <typename Fn>
void ForEachRowAt(const DimSplit& s, Fn&& fn) {
  for (int64_t o = 0; o < s.outer; ++o) {
    for (int64_t i = 0; i < s.inner; ++i) fn(o * s.size * s.inner + i);
  }
}

// Runs fn(k) for k in [0, count) in order, counting the work in meter, which checks the current
// cancellation token between blocks of a long loop (Note [Stopping a running op]). For the
// kernels' loops over a row; a row of a few elements pays a subtraction.
template <typename Fn>
void ForEachCounted(int64_t count, WorkMeter& meter, Fn&& fn) {
  ForEachBlock(count, meter, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) fn(k);
  });
}

// ---------------------------------------------------------------------------------------------
// softmax and log_softmax.

template <typename T>
void SoftmaxKernel(const T* x, T* y, const DimSplit& s, bool log) {
  const int64_t step = s.inner;
  WorkMeter meter;
  ForEachRowAt(s, [&](int64_t base) {
    const T* in = x + base;
    T* out = y + base;
    T max = -std::numeric_limits<T>::infinity();
    ForEachCounted(s.size, meter, [&](int64_t k) { max = std::max(max, in[k * step]); });
    // A row of -inf (or an empty row) has no finite maximum; shift by 0 so the result is NaN
    // or empty, as PyTorch's.
    if (!std::isfinite(max)) max = std::isnan(max) ? max : T(0);
    Acc total = 0;
    ForEachCounted(s.size, meter,
                   [&](int64_t k) { total += std::exp(static_cast<Acc>(in[k * step] - max)); });
    if (log) {
      // Note [log_softmax without cancellation]
      // (x - max) - log(sum), never x - (max + log(sum)): the latter rounds log(sum), a number
      // near 0 for a confident row, into max, losing up to ulp(max) in every result (ulp(50)
      // is 4e-6 in float32), and a constant shift of the row changes the rounding. x - max is
      // exact near the maximum (Sterbenz), so the largest log-probability, the one a
      // confident loss and its gradient 1 - exp(y) need, keeps all its digits, as PyTorch's
      // kernels compute it.
      const T log_total = static_cast<T>(std::log(total));
      ForEachCounted(s.size, meter,
                     [&](int64_t k) { out[k * step] = (in[k * step] - max) - log_total; });
    } else {
      const Acc scale = 1 / total;
      ForEachCounted(s.size, meter, [&](int64_t k) {
        out[k * step] = static_cast<T>(std::exp(static_cast<Acc>(in[k * step] - max)) * scale);
      });
    }
  });
}

// The fused backward: softmax: gx = y * (g - sum(g * y)); log_softmax: gx = g - exp(y) * sum(g).
template <typename T>
void SoftmaxBackwardKernel(const T* y, const T* g, T* gx, const DimSplit& s, bool log) {
  const int64_t step = s.inner;
  WorkMeter meter;
  ForEachRowAt(s, [&](int64_t base) {
    Acc total = 0;
    ForEachCounted(s.size, meter, [&](int64_t k) {
      const int64_t at = base + k * step;
      total += log ? static_cast<Acc>(g[at]) : static_cast<Acc>(g[at]) * y[at];
    });
    const T t = static_cast<T>(total);
    ForEachCounted(s.size, meter, [&](int64_t k) {
      const int64_t at = base + k * step;
      gx[at] = log ? g[at] - std::exp(y[at]) * t : y[at] * (g[at] - t);
    });
  });
}

void SoftmaxCpu(const Tensor& x, const Tensor& out, DimSplit s, bool log) {
  DispatchFloating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    SoftmaxKernel(x.data<T>(), out.data<T>(), s, log);
  });
}

void SoftmaxBackwardCpu(const Tensor& y, const Tensor& g, const Tensor& gx, DimSplit s, bool log) {
  DispatchFloating(y.dtype(), [&](auto tag) {
    using T = decltype(tag);
    SoftmaxBackwardKernel(y.data<T>(), g.data<T>(), gx.data<T>(), s, log);
  });
}

}  // namespace

KernelStub<SoftmaxFn> softmax_stub("softmax", SoftmaxCpu);
KernelStub<SoftmaxBackwardFn> softmax_backward_stub("softmax_backward", SoftmaxBackwardCpu);

namespace {

class SoftmaxBackward final : public Node {
 public:
  SoftmaxBackward(int64_t dim, bool log) : dim_(dim), log_(log) {}
  void SaveResult(const Tensor& result) { result_ = SavedVariable(result, true); }

  TensorList apply(TensorList&& grads) override {
    const Tensor y = result_.unpack(this);
    if (NoIncomingGrad(grads)) return {Tensor()};
    const Tensor& g = grads[0];
    const int64_t dims[] = {dim_};
    if (GradMode::is_enabled()) {  // Note [NN backward paths]
      if (log_) return {sub(g, mul(exp(y), sum(g, dims, /*keepdim=*/true)))};
      return {mul(y, sub(g, sum(mul(g, y), dims, /*keepdim=*/true)))};
    }
    const Tensor yc = y.contiguous();
    const Tensor gc = g.contiguous();
    Tensor gx = Tensor::Empty(y.shape(), y.dtype(), y.device());
    if (gx.numel() > 0)
      softmax_backward_stub(gx.device(), yc, gc, gx, SplitAt(y.shape(), dim_), log_);
    return {gx};
  }
  std::string name() const override { return log_ ? "LogSoftmaxBackward0" : "SoftmaxBackward0"; }
  void release_variables() override { result_.reset(); }

 private:
  const int64_t dim_;
  const bool log_;
  SavedVariable result_;
};

Tensor SoftmaxImpl(const char* op, const Tensor& input, int64_t dim, bool log) {
  RequireFloating(op, "input", input);
  dim = WrapDimArg(op, "dim", dim, input.shape());
  const Tensor x = input.contiguous();
  Tensor out = Tensor::Empty(input.shape(), input.dtype(), input.device());
  if (out.numel() > 0) softmax_stub(out.device(), x, out, SplitAt(input.shape(), dim), log);
  if (auto node =
          RecordIfNeeded(out, {input}, [&] { return MakeNode<SoftmaxBackward>(dim, log); })) {
    node->SaveResult(out);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// nll_loss and cross_entropy.

// Index tensors checked on the host (CheckIndices reads every index before any memory is read
// through them): a GPU tensor is copied to the CPU first (Tensor::To waits for the copy); host
// devices' tensors are used in place.
Tensor HostIndices(const Tensor& indices) {
  return indices.device().type == DeviceType::kCUDA ? indices.To(kCPU) : indices;
}

// The class dim of a loss input: 1, or 0 for an unbatched [C] input.
int64_t ClassDim(const Tensor& input) { return input.dim() >= 2 ? 1 : 0; }

// Checks a loss's input (log-probabilities or logits) for `op`: floating, with a class dim.
void CheckClassInput(const char* op, const Tensor& input) {
  RequireFloating(op, "input", input);
  GS_CHECK_ARG(input.dim() >= 1, op, ": input must have a class dimension, got shape []");
}

// Checks input (log-probabilities or logits) and class-index target for `op`.
void CheckClassTarget(const char* op, const Tensor& input, const Tensor& target,
                      int64_t ignore_index) {
  CheckClassInput(op, input);
  CheckDTypeArg(op, "target", target, DType::kInt64);
  const int64_t class_dim = ClassDim(input);
  const Shape want = ShapeWithout(input.shape(), class_dim);
  GS_CHECK_ARG(target.shape() == want, op, ": target has shape ", ShapeToString(target.shape()),
               " but input with shape ", ShapeToString(input.shape()), " needs target shape ",
               ShapeToString(want));
  CheckIndices(op, "target", HostIndices(target), input.size(class_dim), ignore_index,
               absl::StrCat("the ", input.size(class_dim), " classes of input with shape ",
                            ShapeToString(input.shape())));
}

// Checks the optional class weights of `op` (undefined: every class weighs 1): a [C] tensor of
// the input's dtype and device. With class-index targets it must not require grad: PyTorch's
// losses are not differentiable with respect to it there, and refuse such a weight too (with
// class probabilities, the loss is a product of differentiable ops, weight included).
void CheckClassWeight(const char* op, const Tensor& input, const Tensor& class_weight,
                      bool may_require_grad, bool may_promote = false) {
  if (!class_weight.defined()) return;
  const int64_t classes = input.size(ClassDim(input));
  GS_CHECK_ARG(class_weight.shape() == Shape{classes}, op, ": weight has shape ",
               ShapeToString(class_weight.shape()), " but input with shape ",
               ShapeToString(input.shape()), " has ", classes,
               " classes: weight must have one value per class, shape [", classes, "]");
  if (may_promote) {
    RequireFloating(op, "weight", class_weight);
    RequireSameDevice(op, "input", input, "weight", class_weight);
  } else {
    CheckSameDTypeAndDevice(op, "input", input, "weight", class_weight);
  }
  GS_CHECK_ARG(may_require_grad || !class_weight.requires_grad(), op,
               ": weight requires grad, but the loss is not differentiable with respect to its "
               "class weights (as in PyTorch); detach it or make it a leaf without "
               "requires_grad");
}

// Per target position: the weight its -log p gets in the loss, and the target with ignored
// positions set to class 0 so it can index. The weight is 0 where ignored, else the target
// class's weight (1 without class weights), divided by `total` for "mean".
//
// The forward kernels tell an ignored position (0) from one whose class weighs 0 (-x * 0,
// NaN at a log-probability of -inf, as PyTorch's) by the target itself, not by the weight.
struct NllWeights {
  Tensor weight;       // target's shape, the input's dtype
  Tensor safe_target;  // int64, target's shape
  int64_t count = 0;   // positions not ignored
  double total = 0;    // their class weights' sum (count without class weights): "mean"'s divisor
  Tensor kept;         // if asked for: 1 where not ignored, else 0; target's shape, input's dtype
};
NllWeights MakeNllWeights(const Tensor& target, const Tensor& class_weight, DType dtype,
                          Reduction reduction, int64_t ignore_index, bool with_kept = false) {
  // The divisor of "mean" is needed on the host (a ReduceLoss argument), so a GPU target and
  // class weights are copied to the CPU (Tensor::To waits for them), the weights made there
  // and copied back to the GPU. Host devices read target in place.
  const Device device = target.device();
  const bool on_gpu = device.type == DeviceType::kCUDA;
  const Tensor t = (on_gpu ? target.To(kCPU) : target).contiguous();
  const Device here = on_gpu ? kCPU : device;
  const int64_t n = t.numel();
  const int64_t* tv = t.data<int64_t>();
  WorkMeter meter;
  NllWeights w;
  w.weight = Tensor::Empty(target.shape(), dtype, here);
  w.safe_target = Tensor::Empty(target.shape(), DType::kInt64, here);
  int64_t* sv = w.safe_target.data<int64_t>();
  if (with_kept) w.kept = Tensor::Empty(target.shape(), dtype, here);
  DispatchFloating(dtype, [&](auto tag) {
    using T = decltype(tag);
    Tensor cw;
    if (class_weight.defined()) cw = class_weight.To(kCPU).contiguous();
    const T* cwv = cw.defined() ? cw.data<T>() : nullptr;
    T* wv = w.weight.data<T>();
    T* kv = with_kept ? w.kept.data<T>() : nullptr;
    ForEachCounted(n, meter, [&](int64_t i) {
      const bool ignored = tv[i] == ignore_index;
      sv[i] = ignored ? 0 : tv[i];
      wv[i] = ignored ? T(0) : cwv != nullptr ? cwv[tv[i]] : T(1);
      if (kv != nullptr) kv[i] = ignored ? T(0) : T(1);
      w.count += !ignored;
      w.total += static_cast<double>(wv[i]);
    });
    // "mean" divides by total; 0 / 0 is NaN, as PyTorch's (a total of 0 with positions kept
    // makes their weights NaN; with none kept, the kernels give NaN).
    if (reduction == Reduction::kMean) {
      ForEachCounted(n, meter, [&](int64_t i) {
        if (tv[i] != ignore_index) wv[i] = static_cast<T>(static_cast<double>(wv[i]) / w.total);
      });
    }
  });
  if (on_gpu) {
    w.weight = w.weight.To(device);
    w.safe_target = w.safe_target.To(device);
    if (with_kept) w.kept = w.kept.To(device);
  }
  return w;
}

// Sums per-position values of the target's shape as `reduction` asks (total: the divisor of
// "mean", NllWeights::total). Differentiable.
Tensor ReduceLoss(const Tensor& per_position, Reduction reduction, double total) {
  switch (reduction) {
    case Reduction::kNone:
      return per_position;
    case Reduction::kSum:
      return sum(per_position);
    case Reduction::kMean:
      return mul(sum(per_position), 1.0 / total);
  }
  return per_position;
}

// grad_input = zeros of the input's shape with -g * weight at each target class: linear in g,
// so one formula serves both backward paths (its scatter is the fused kernel when grad mode is
// off, and records ScatterAddBackward0 under create_graph).
class NllLossBackward final : public Node {
 public:
  NllLossBackward(Shape input_shape, int64_t class_dim, NllWeights weights)
      : input_shape_(std::move(input_shape)),
        class_dim_(class_dim),
        weight_(weights.weight, false),
        safe_target_(weights.safe_target, false) {}

  TensorList apply(TensorList&& grads) override {
    const Tensor weight = weight_.unpack(this);
    const Tensor target = safe_target_.unpack(this);
    if (NoIncomingGrad(grads)) return {Tensor()};
    const Tensor src = neg(mul(grads[0], weight));
    return {ScatterAddIntoZeros(input_shape_, class_dim_, unsqueeze(target, class_dim_),
                                unsqueeze(src, class_dim_))};
  }
  std::string name() const override { return "NllLossBackward0"; }
  void release_variables() override {
    weight_.reset();
    safe_target_.reset();
  }

 private:
  const Shape input_shape_;
  const int64_t class_dim_;
  SavedVariable weight_;
  SavedVariable safe_target_;
};

void NllLossCpu(const Tensor& x, const Tensor& weight, const Tensor& target, int64_t ignore_index,
                DimSplit s, Reduction reduction, int64_t count, const Tensor& out) {
  DispatchFloating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* xv = x.data<T>();
    const T* wv = weight.data<T>();
    const int64_t* tv = target.data<int64_t>();
    T* ov = out.data<T>();
    Acc total = 0;
    WorkMeter meter;
    for (int64_t n = 0; n < s.outer; ++n) {
      ForEachCounted(s.inner, meter, [&](int64_t i) {
        const int64_t p = n * s.inner + i;
        const T v = tv[p] == ignore_index ? T(0) : -xv[(n * s.size + tv[p]) * s.inner + i] * wv[p];
        if (reduction == Reduction::kNone) {
          ov[p] = v;
        } else {
          total += v;
        }
      });
    }
    // "mean" over no positions is 0/0, NaN, as PyTorch's.
    if (reduction == Reduction::kMean && count == 0) total = std::nan("");
    if (reduction != Reduction::kNone) ov[0] = static_cast<T>(total);
  });
}

}  // namespace

KernelStub<NllLossFn> nll_loss_stub("nll_loss", NllLossCpu);

namespace {

// nll_loss on arguments already checked; also returns the divisor of "mean"
// (NllWeights::total) and, if kept_out is not null, NllWeights::kept.
Tensor NllLossImpl(const Tensor& input, const Tensor& target, const Tensor& class_weight,
                   Reduction reduction, int64_t ignore_index, double* total_out,
                   Tensor* kept_out = nullptr) {
  const int64_t class_dim = ClassDim(input);
  NllWeights w = MakeNllWeights(target, class_weight, input.dtype(), reduction, ignore_index,
                                /*with_kept=*/kept_out != nullptr);
  *total_out = w.total;
  if (kept_out != nullptr) *kept_out = w.kept;
  const Tensor x = input.contiguous();
  const DimSplit s = SplitAt(input.shape(), class_dim);  // [N, C, spatial]
  Tensor out = Tensor::Empty(reduction == Reduction::kNone ? target.shape() : Shape{},
                             input.dtype(), input.device());
  nll_loss_stub(out.device(), x, w.weight, target.contiguous(), ignore_index, s, reduction, w.count,
                out);
  RecordIfNeeded(out, {input},
                 [&] { return MakeNode<NllLossBackward>(input.shape(), class_dim, std::move(w)); });
  return out;
}

// ---------------------------------------------------------------------------------------------
// mse_loss.

void MseLossBackwardCpu(const Tensor& x, const Tensor& t, const Tensor& g, double scale,
                        bool per_element, const Tensor& gx) {
  DispatchFloating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T *xv = x.data<T>(), *tv = t.data<T>(), *gv = g.data<T>();
    T* out = gx.data<T>();
    WorkMeter meter;
    ForEachCounted(x.numel(), meter, [&](int64_t i) {
      out[i] = static_cast<T>(scale) * (xv[i] - tv[i]) * gv[per_element ? i : 0];
    });
  });
}

void MseLossCpu(const Tensor& x, const Tensor& t, Reduction reduction, const Tensor& out) {
  DispatchFloating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T *xv = x.data<T>(), *tv = t.data<T>();
    T* ov = out.data<T>();
    const int64_t n = x.numel();
    Acc total = 0;
    WorkMeter meter;
    ForEachCounted(n, meter, [&](int64_t i) {
      const T d = xv[i] - tv[i];
      if (reduction == Reduction::kNone) {
        ov[i] = d * d;
      } else {
        total += static_cast<Acc>(d) * d;
      }
    });
    if (reduction == Reduction::kMean) total /= static_cast<Acc>(n);
    if (reduction != Reduction::kNone) ov[0] = static_cast<T>(total);
  });
}

}  // namespace

KernelStub<MseLossFn> mse_loss_stub("mse_loss", MseLossCpu);
KernelStub<MseLossBackwardFn> mse_loss_backward_stub("mse_loss_backward", MseLossBackwardCpu);

namespace {

class MseLossBackward final : public Node {
 public:
  MseLossBackward(const Tensor& input, const Tensor& target, Reduction reduction)
      : input_(input, false), target_(target, false), reduction_(reduction) {}

  TensorList apply(TensorList&& grads) override {
    const Tensor x = input_.unpack(this);
    const Tensor t = target_.unpack(this);
    if (NoIncomingGrad(grads)) return {Tensor(), Tensor()};
    const Tensor& g = grads[0];
    const double scale =
        reduction_ == Reduction::kMean ? 2.0 / static_cast<double>(x.numel()) : 2.0;
    Tensor gx;
    if (GradMode::is_enabled()) {  // Note [NN backward paths]
      gx = mul(mul(sub(x, t), g), scale);
    } else {
      const Tensor xc = x.contiguous(), tc = t.contiguous(), gc = g.contiguous();
      gx = Tensor::Empty(x.shape(), x.dtype(), x.device());
      if (gx.numel() > 0) {
        mse_loss_backward_stub(gx.device(), xc, tc, gc, scale, reduction_ == Reduction::kNone, gx);
      }
    }
    return {should_compute_output(0) ? gx : Tensor(),
            should_compute_output(1) ? neg(gx) : Tensor()};
  }
  std::string name() const override { return "MseLossBackward0"; }
  void release_variables() override {
    input_.reset();
    target_.reset();
  }

 private:
  SavedVariable input_;
  SavedVariable target_;
  const Reduction reduction_;
};

// ---------------------------------------------------------------------------------------------
// Note [Gradients PyTorch computes in one function]
// PyTorch computes the backward of layer_norm and of convolution as one function of all the
// backward's inputs (native_layer_norm_backward, convolution_backward). Under create_graph it
// records that function's own backward (NativeLayerNormBackwardBackward0,
// ConvolutionBackwardBackward0) as the grad_fn of every gradient it returns, as soon as one of
// those inputs requires grad. So such a gradient requires grad even where it depends on
// nothing that does (layer_norm's weight gradient for a constant input), and differentiating
// it again gives no gradient along that path (None with allow_unused, zeros with
// materialize_grads) instead of the error that a value does not require grad. The
// differentiable formulas here record only what each gradient depends on; RecordAsOneFunction
// gives each gradient that recorded nothing a grad_fn of PyTorch's name with edges to the
// inputs that gives none of them a gradient, which is what PyTorch's formula gives along such
// a path. Gradients that recorded something keep their own grad_fn: their derivatives are the
// same either way.

// The grad_fn of a gradient that depends on no input requiring grad (see the Note).
class NoGradientBackward final : public Node {
 public:
  explicit NoGradientBackward(const char* name) : name_(name) {}
  TensorList apply(TensorList&& /*grads*/) override { return TensorList(num_outputs()); }
  std::string name() const override { return name_; }

 private:
  const char* const name_;
};

// Note [Gradients PyTorch computes in one function]: under grad mode, gives each defined
// gradient in grads that does not require grad, while an input in inputs does, a grad_fn named
// name. The gradient becomes a new tensor sharing its storage, since the formula may have
// returned a tensor that something else holds.
void RecordAsOneFunction(TensorList& grads, autograd::TensorRefs inputs, const char* name) {
  if (!autograd::ShouldRecord(inputs)) return;
  for (Tensor& grad : grads) {
    if (!grad.defined() || grad.requires_grad()) continue;
    grad = grad.detach();
    RecordIfNeeded(grad, inputs, [&] { return MakeNode<NoGradientBackward>(name); });
  }
}

// ---------------------------------------------------------------------------------------------
// layer_norm.

// Per row of [rows, cols]: mean and 1 / sqrt(biased variance + eps), kept in float64 (Note
// [layer_norm's statistics in float64]), then y = (x - mean) * rstd * weight + bias (weight,
// bias may be null).
template <typename T>
void LayerNormKernel(const T* x, const T* weight, const T* bias, int64_t rows, int64_t cols,
                     double eps, T* y, double* mean_out, double* rstd_out) {
  WorkMeter meter;
  for (int64_t r = 0; r < rows; ++r) {
    const T* in = x + r * cols;
    T* out = y + r * cols;
    Acc total = 0;
    ForEachCounted(cols, meter, [&](int64_t c) { total += in[c]; });
    const Acc mean = total / static_cast<Acc>(cols);
    Acc squares = 0;
    ForEachCounted(cols, meter, [&](int64_t c) { squares += (in[c] - mean) * (in[c] - mean); });
    const Acc rstd = 1 / std::sqrt(squares / static_cast<Acc>(cols) + eps);
    ForEachCounted(cols, meter, [&](int64_t c) {
      T v = static_cast<T>((in[c] - mean) * rstd);
      if (weight != nullptr) v *= weight[c];
      if (bias != nullptr) v += bias[c];
      out[c] = v;
    });
    mean_out[r] = mean;
    rstd_out[r] = rstd;
  }
}

// The fused backward: with xhat = (x - mean) * rstd and gy = g * weight,
//   gx = rstd * (gy - mean(gy) - xhat * mean(gy * xhat)),  gw = sum_rows(g * xhat),
//   gb = sum_rows(g). Any of gx, gw, gb may be null (not needed).
template <typename T>
void LayerNormBackwardKernel(const T* x, const T* g, const T* weight, const double* mean,
                             const double* rstd, int64_t rows, int64_t cols, T* gx, T* gw, T* gb) {
  // Note [Working buffers]: sized by the client's normalized shape.
  WorkingBuffer<Acc> gw_acc(gw != nullptr ? cols : 0, 0), gb_acc(gb != nullptr ? cols : 0, 0);
  WorkMeter meter;
  for (int64_t r = 0; r < rows; ++r) {
    const T* in = x + r * cols;
    const T* gr = g + r * cols;
    const Acc m = mean[r], s = rstd[r];
    Acc sum_gy = 0, sum_gy_xhat = 0;
    ForEachCounted(cols, meter, [&](int64_t c) {
      const Acc xhat = (in[c] - m) * s;
      const Acc gy = weight != nullptr ? static_cast<Acc>(gr[c]) * weight[c] : gr[c];
      sum_gy += gy;
      sum_gy_xhat += gy * xhat;
      if (gw != nullptr) gw_acc[c] += gr[c] * xhat;
      if (gb != nullptr) gb_acc[c] += gr[c];
    });
    if (gx == nullptr) continue;
    const Acc a = sum_gy / cols, b = sum_gy_xhat / cols;
    ForEachCounted(cols, meter, [&](int64_t c) {
      const Acc xhat = (in[c] - m) * s;
      const Acc gy = weight != nullptr ? static_cast<Acc>(gr[c]) * weight[c] : gr[c];
      gx[r * cols + c] = static_cast<T>(s * (gy - a - xhat * b));
    });
  }
  for (int64_t c = 0; c < gw_acc.size(); ++c) gw[c] = gw_acc[c];
  for (int64_t c = 0; c < gb_acc.size(); ++c) gb[c] = gb_acc[c];
}

void LayerNormCpu(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t rows,
                  int64_t cols, double eps, const Tensor& out, const Tensor& mean,
                  const Tensor& rstd) {
  DispatchFloating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    auto ptr = [](const Tensor& t) { return t.defined() ? t.data<T>() : nullptr; };
    LayerNormKernel<T>(x.data<T>(), ptr(weight), ptr(bias), rows, cols, eps, out.data<T>(),
                       mean.data<double>(), rstd.data<double>());
  });
}

void LayerNormBackwardCpu(const Tensor& x, const Tensor& g, const Tensor& weight,
                          const Tensor& mean, const Tensor& rstd, int64_t rows, int64_t cols,
                          const Tensor& gx, const Tensor& gw, const Tensor& gb) {
  DispatchFloating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    auto ptr = [](const Tensor& t) { return t.defined() ? t.data<T>() : nullptr; };
    LayerNormBackwardKernel<T>(x.data<T>(), g.data<T>(), ptr(weight), mean.data<double>(),
                               rstd.data<double>(), rows, cols, ptr(gx), ptr(gw), ptr(gb));
  });
}

}  // namespace

KernelStub<LayerNormFn> layer_norm_stub("layer_norm", LayerNormCpu);
KernelStub<LayerNormBackwardFn> layer_norm_backward_stub("layer_norm_backward",
                                                         LayerNormBackwardCpu);

namespace {

class LayerNormBackward final : public Node {
 public:
  LayerNormBackward(const Tensor& input, const Tensor& weight, const Tensor& bias,
                    const Tensor& mean, const Tensor& rstd, int64_t normalized_dims, double eps)
      : input_(input, false),
        weight_(weight, false),
        bias_(bias, false),
        mean_(mean, false),
        rstd_(rstd, false),
        normalized_dims_(normalized_dims),
        eps_(eps) {}

  TensorList apply(TensorList&& grads) override {
    const Tensor x = input_.unpack(this);
    const Tensor w = weight_.unpack(this);
    const Tensor b = bias_.unpack(this);
    const Tensor mean = mean_.unpack(this);
    const Tensor rstd = rstd_.unpack(this);
    if (NoIncomingGrad(grads)) return {Tensor(), Tensor(), Tensor()};
    const Tensor& g = grads[0];
    const bool need_x = should_compute_output(0);
    const bool need_w = w.defined() && should_compute_output(1);
    const bool need_b = b.defined() && should_compute_output(2);
    if (GradMode::is_enabled()) return Differentiable(x, w, b, g, need_x, need_w, need_b);
    const int64_t cols = ProductOf(x.shape(), x.dim() - normalized_dims_, x.dim());
    const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
    const Tensor xc = x.contiguous(), gc = g.contiguous();
    const Tensor wc = w.defined() ? w.contiguous() : Tensor();
    Tensor gx = need_x ? Tensor::Empty(x.shape(), x.dtype(), x.device()) : Tensor();
    Tensor gw = need_w ? Tensor::Zeros(w.shape(), w.dtype(), w.device()) : Tensor();
    Tensor gb = need_b ? Tensor::Zeros(b.shape(), b.dtype(), b.device()) : Tensor();
    layer_norm_backward_stub(x.device(), xc, gc, wc, mean, rstd, rows, cols, gx, gw, gb);
    return {gx, gw, gb};
  }
  std::string name() const override { return "NativeLayerNormBackward0"; }
  void release_variables() override {
    for (SavedVariable* v : {&input_, &weight_, &bias_, &mean_, &rstd_}) v->reset();
  }

 private:
  // The formula of LayerNormBackwardKernel in differentiable ops, with the statistics
  // recomputed from x so that their dependence on x is differentiated too. A float32
  // layer_norm's runs in float64, its gradients rounded to float32 once at the end, as the
  // fused kernel's are (Note [layer_norm's statistics in float64]).
  TensorList Differentiable(const Tensor& input, const Tensor& weight, const Tensor& b,
                            const Tensor& grad, bool need_x, bool need_w, bool need_b) const {
    auto wide = [](const Tensor& t) {
      return t.defined() && t.dtype() == DType::kFloat32 ? to(t, DType::kFloat64) : t;
    };
    const Tensor x = wide(input), w = wide(weight), g = wide(grad);
    std::vector<int64_t> dims;
    for (int64_t d = x.dim() - normalized_dims_; d < x.dim(); ++d) dims.push_back(d);
    const Tensor centered = sub(x, mean(x, dims, /*keepdim=*/true));
    const Tensor rstd = rsqrt(add(mean(mul(centered, centered), dims, /*keepdim=*/true), eps_));
    const Tensor xhat = mul(centered, rstd);
    TensorList out(3);
    if (need_x) {
      const Tensor gy = w.defined() ? mul(g, w) : g;
      const Tensor inner =
          sub(sub(gy, mean(gy, dims, true)), mul(xhat, mean(mul(gy, xhat), dims, true)));
      out[0] = mul(rstd, inner);
    }
    if (need_w) out[1] = sum_to(mul(g, xhat), w.shape());
    if (need_b) out[2] = sum_to(g, b.shape());
    for (Tensor& t : out) {
      if (t.defined() && t.dtype() != input.dtype()) t = to(t, input.dtype());
    }
    RecordAsOneFunction(out, {grad, input, weight, b}, "NativeLayerNormBackwardBackward0");
    return out;
  }

  SavedVariable input_, weight_, bias_, mean_, rstd_;
  const int64_t normalized_dims_;
  const double eps_;
};

// ---------------------------------------------------------------------------------------------
// embedding.

class EmbeddingBackward final : public Node {
 public:
  EmbeddingBackward(Shape weight_shape, const Tensor& indices, std::optional<int64_t> padding_idx)
      : weight_shape_(std::move(weight_shape)),
        indices_(indices, false),
        padding_idx_(padding_idx) {}

  TensorList apply(TensorList&& grads) override {
    const Tensor indices = indices_.unpack(this);
    if (NoIncomingGrad(grads)) return {Tensor()};
    const int64_t flat[] = {-1};
    // The row count, not -1: an embedding_dim of 0 leaves -1 undetermined.
    const int64_t rows[] = {indices.numel(), weight_shape_[1]};
    return {IndexAddIntoZeros(weight_shape_, 0, reshape(indices, flat), reshape(grads[0], rows),
                              padding_idx_)};
  }
  std::string name() const override { return "EmbeddingBackward0"; }
  void release_variables() override { indices_.reset(); }

 private:
  const Shape weight_shape_;
  SavedVariable indices_;
  const std::optional<int64_t> padding_idx_;
};

// ---------------------------------------------------------------------------------------------
// conv2d (Note [conv2d as im2col]).

template <typename T>
void Conv2dKernel(const T* x, const T* w, const T* bias, const ConvGeometry& g, T* out) {
  const int64_t groups = g.groups(), rows = g.group_rows(), positions = g.positions();
  const int64_t out_per_group = g.out_channels / groups;
  const int64_t image_size = g.channels * g.height * g.width;
  // Note [Working buffers]: one image's columns, charged before they are allocated.
  WorkingBuffer<T> cols(rows * groups * positions);
  WorkMeter meter;  // Note [Stopping a running op]: im2col, each tile of the gemms, the bias
  for (int64_t n = 0; n < g.batch; ++n) {
    Im2ColImage(x + n * image_size, g, cols.data(), meter);
    T* out_n = out + n * g.out_channels * positions;
    for (int64_t k = 0; k < groups; ++k) {
      Gemm<T>(false, false, out_per_group, positions, rows, T(1), w + k * out_per_group * rows,
              rows, cols.data() + k * rows * positions, positions, T(0),
              out_n + k * out_per_group * positions, positions, meter);
    }
    if (bias == nullptr) continue;
    for (int64_t o = 0; o < g.out_channels; ++o) {
      T* row = out_n + o * positions;
      ForEachCounted(positions, meter, [&](int64_t p) { row[p] += bias[o]; });
    }
  }
}

// The fused backward: per image, gw_k += g_k @ cols_k^T, cols-gradient_k = w_k^T @ g_k summed
// back by col2im, gb = the sum of g over images and positions. gx, gw, gb may be null.
template <typename T>
void Conv2dBackwardKernel(const T* x, const T* w, const T* grad, const ConvGeometry& g, T* gx,
                          T* gw, T* gb) {
  const int64_t groups = g.groups(), rows = g.group_rows(), positions = g.positions();
  const int64_t out_per_group = g.out_channels / groups;
  const int64_t image_size = g.channels * g.height * g.width;
  // Note [Working buffers]: one image's columns, charged before they are allocated.
  WorkingBuffer<T> cols(rows * groups * positions);
  WorkMeter meter;  // Note [Stopping a running op]
  for (int64_t n = 0; n < g.batch; ++n) {
    const T* g_n = grad + n * g.out_channels * positions;
    if (gw != nullptr) {
      Im2ColImage(x + n * image_size, g, cols.data(), meter);
      for (int64_t k = 0; k < groups; ++k) {
        Gemm<T>(false, true, out_per_group, rows, positions, T(1),
                g_n + k * out_per_group * positions, positions, cols.data() + k * rows * positions,
                positions, T(1), gw + k * out_per_group * rows, rows, meter);
      }
    }
    if (gx != nullptr) {
      for (int64_t k = 0; k < groups; ++k) {
        Gemm<T>(true, false, rows, positions, out_per_group, T(1), w + k * out_per_group * rows,
                rows, g_n + k * out_per_group * positions, positions, T(0),
                cols.data() + k * rows * positions, positions, meter);
      }
      Col2ImAddImage(cols.data(), g, gx + n * image_size, meter);
    }
    if (gb != nullptr) {
      for (int64_t o = 0; o < g.out_channels; ++o) {
        Acc total = 0;
        ForEachCounted(positions, meter, [&](int64_t p) { total += g_n[o * positions + p]; });
        gb[o] += static_cast<T>(total);
      }
    }
  }
}

void Conv2dCpu(const Tensor& x, const Tensor& w, const Tensor& bias, const ConvGeometry& g,
               const Tensor& out) {
  DispatchFloating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Conv2dKernel<T>(x.data<T>(), w.data<T>(), bias.defined() ? bias.data<T>() : nullptr, g,
                    out.data<T>());
  });
}

void Conv2dBackwardCpu(const Tensor& x, const Tensor& w, const Tensor& grad, const ConvGeometry& g,
                       const Tensor& gx, const Tensor& gw, const Tensor& gb) {
  DispatchFloating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    auto ptr = [](const Tensor& t) { return t.defined() ? t.data<T>() : nullptr; };
    Conv2dBackwardKernel<T>(x.data<T>(), w.data<T>(), grad.data<T>(), g, ptr(gx), ptr(gw), ptr(gb));
  });
}

}  // namespace

KernelStub<Conv2dFn> conv2d_stub("conv2d", Conv2dCpu);
KernelStub<Conv2dBackwardFn> conv2d_backward_stub("conv2d_backward", Conv2dBackwardCpu);

namespace {

class ConvolutionBackward final : public Node {
 public:
  ConvolutionBackward(const Tensor& input, const Tensor& weight, bool has_bias,
                      const ConvGeometry& geometry)
      : input_(input, false), weight_(weight, false), has_bias_(has_bias), g_(geometry) {}

  TensorList apply(TensorList&& grads) override {
    const Tensor x = input_.unpack(this);
    const Tensor w = weight_.unpack(this);
    if (NoIncomingGrad(grads)) return {Tensor(), Tensor(), Tensor()};
    const Tensor& grad = grads[0];
    const bool need_x = should_compute_output(0), need_w = should_compute_output(1);
    const bool need_b = has_bias_ && should_compute_output(2);
    if (g_.channels == 0) return ZeroChannelGradients(x, w, grad, need_x, need_w, need_b);
    if (GradMode::is_enabled()) return Differentiable(x, w, grad, need_x, need_w, need_b);
    const Tensor xc = x.contiguous(), wc = w.contiguous(), gc = grad.contiguous();
    Tensor gx = need_x ? Tensor::Zeros(x.shape(), x.dtype(), x.device()) : Tensor();
    Tensor gw = need_w ? Tensor::Zeros(w.shape(), w.dtype(), w.device()) : Tensor();
    Tensor gb = need_b ? Tensor::Zeros({g_.out_channels}, w.dtype(), w.device()) : Tensor();
    conv2d_backward_stub(x.device(), xc, wc, gc, g_, gx, gw, gb);
    return {gx, gw, gb};
  }
  std::string name() const override { return "ConvolutionBackward0"; }
  void release_variables() override {
    input_.reset();
    weight_.reset();
  }

 private:
  // The fused kernel's formula with differentiable ops, all images and groups at once:
  // cols [N, G, R, P], grad [N, G, O/G, P], weight [G, O/G, R].
  TensorList Differentiable(const Tensor& x, const Tensor& w, const Tensor& grad, bool need_x,
                            bool need_w, bool need_b) const {
    const int64_t n = g_.batch, groups = g_.groups(), rows = g_.group_rows();
    const int64_t positions = g_.positions(), per_group = g_.out_channels / groups;
    const int64_t grad_shape[] = {n, groups, per_group, positions};
    const Tensor g4 = reshape(grad, grad_shape);
    TensorList out(3);
    if (need_w) {
      const int64_t cols_shape[] = {n, groups, rows, positions};
      const Tensor cols = reshape(Im2Col(x, g_), cols_shape);
      const int64_t batch_dim[] = {0};
      out[1] = reshape(sum(matmul(g4, transpose(cols, -1, -2)), batch_dim), w.shape());
    }
    if (need_x) {
      const int64_t w_shape[] = {groups, per_group, rows};
      const Tensor cols_grad = matmul(transpose(reshape(w, w_shape), -1, -2), g4);
      out[0] = Col2Im(reshape(cols_grad, g_.cols_shape()), g_);
    }
    if (need_b) {
      const int64_t dims[] = {0, 2, 3};
      out[2] = sum(grad, dims);
    }
    RecordAsOneFunction(out, {grad, x, w}, "ConvolutionBackwardBackward0");
    return out;
  }

  // Note [conv2d over zero channels]: zeros for each input, as PyTorch's convolution_backward
  // gives (its grad has no element to take anything from); under create_graph they are
  // recorded as one function's, so differentiating them again gives no gradient.
  TensorList ZeroChannelGradients(const Tensor& x, const Tensor& w, const Tensor& grad, bool need_x,
                                  bool need_w, bool need_b) const {
    TensorList out(3);
    if (need_x) out[0] = Tensor::Zeros(x.shape(), x.dtype(), x.device());
    if (need_w) out[1] = Tensor::Zeros(w.shape(), w.dtype(), w.device());
    if (need_b) out[2] = Tensor::Zeros({g_.out_channels}, w.dtype(), w.device());
    if (GradMode::is_enabled()) {
      RecordAsOneFunction(out, {grad, x, w}, "ConvolutionBackwardBackward0");
    }
    return out;
  }

  SavedVariable input_, weight_;
  const bool has_bias_;
  const ConvGeometry g_;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// The ops.

Reduction ParseReduction(const char* op, const std::string& name) {
  if (name == "mean") return Reduction::kMean;
  if (name == "sum") return Reduction::kSum;
  GS_CHECK_ARG(name == "none", op, ": reduction = '", name,
               "' is not one of 'none', 'mean', 'sum'");
  return Reduction::kNone;
}

Tensor softmax(const Tensor& input, int64_t dim) {
  return SoftmaxImpl("softmax", input, dim, /*log=*/false);
}

Tensor log_softmax(const Tensor& input, int64_t dim) {
  return SoftmaxImpl("log_softmax", input, dim, /*log=*/true);
}

Tensor nll_loss(const Tensor& input, const Tensor& target, Reduction reduction,
                int64_t ignore_index, const Tensor& weight) {
  CheckClassTarget("nll_loss", input, target, ignore_index);
  CheckClassWeight("nll_loss", input, weight, /*may_require_grad=*/false);
  double total = 0;
  return NllLossImpl(input, target, weight, reduction, ignore_index, &total);
}

namespace {

// log_probs times the class weights (if defined), each class's weight broadcast over the
// positions: weight is viewed as [C, 1, ...], aligned with the class dim.
Tensor TimesClassWeight(const Tensor& log_probs, const Tensor& weight) {
  if (!weight.defined()) return log_probs;
  const int64_t class_dim = ClassDim(log_probs);
  Shape along_classes(static_cast<size_t>(log_probs.dim() - class_dim), 1);
  along_classes[0] = log_probs.size(class_dim);
  return mul(log_probs, reshape(weight, along_classes));
}

// cross_entropy against class probabilities: target has the input's shape and a floating
// dtype, and the loss per position is -sum over classes of weight * target * log p, as in
// PyTorch; label smoothing mixes the uniform distribution into target, and "mean" divides by
// the number of positions (NaN for none), whatever the weights. Composed of recorded ops, so
// it is differentiable with respect to input, target and weight.
Tensor CrossEntropyWithProbabilities(const Tensor& input, const Tensor& target, Reduction reduction,
                                     int64_t ignore_index, double label_smoothing,
                                     const Tensor& weight) {
  CheckClassInput("cross_entropy", input);
  GS_CHECK_ARG(target.shape() == input.shape(),
               "cross_entropy: a floating target holds class "
               "probabilities and must have the input's shape ",
               ShapeToString(input.shape()), ", got ", ShapeToString(target.shape()),
               "; class indices are an int64 target without the class dimension");
  GS_CHECK_ARG(target.device() == input.device(), "cross_entropy: target is on ",
               DeviceName(target.device()), " but input is on ", DeviceName(input.device()));
  GS_CHECK_ARG(ignore_index < 0, "cross_entropy: ignore_index = ", ignore_index,
               " is not supported for a floating target (class probabilities), as in PyTorch");
  // With class probabilities the loss is a product of recorded ops, and PyTorch's promotes
  // a weight of another floating dtype as the products do.
  CheckClassWeight("cross_entropy", input, weight, /*may_require_grad=*/true,
                   /*may_promote=*/true);
  const int64_t class_dim = ClassDim(input);
  const int64_t classes = input.size(class_dim);
  Tensor probs = target;
  if (label_smoothing > 0) {
    probs = add(mul(target, 1 - label_smoothing), label_smoothing / static_cast<double>(classes));
  }
  const Tensor terms = mul(TimesClassWeight(log_softmax(input, class_dim), weight), probs);
  const int64_t dims[] = {class_dim};
  const Tensor per_position = neg(sum(terms, dims));
  return ReduceLoss(per_position, reduction, static_cast<double>(per_position.numel()));
}

}  // namespace

Tensor cross_entropy(const Tensor& input, const Tensor& target, Reduction reduction,
                     int64_t ignore_index, double label_smoothing, const Tensor& weight) {
  GS_CHECK_ARG(label_smoothing >= 0 && label_smoothing <= 1,
               "cross_entropy: label_smoothing = ", label_smoothing, " must be in [0, 1]");
  if (IsFloating(target.dtype())) {
    return CrossEntropyWithProbabilities(input, target, reduction, ignore_index, label_smoothing,
                                         weight);
  }
  CheckClassTarget("cross_entropy", input, target, ignore_index);
  CheckClassWeight("cross_entropy", input, weight, /*may_require_grad=*/false);
  const int64_t class_dim = ClassDim(input);
  const Tensor log_probs = log_softmax(input, class_dim);
  double total = 0;
  Tensor kept;  // 1 where the target is not ignored, for the smoothing term
  Tensor loss = NllLossImpl(log_probs, target, weight, reduction, ignore_index, &total,
                            label_smoothing > 0 ? &kept : nullptr);
  if (label_smoothing == 0) return loss;
  // The smoothing term per position: minus the mean over classes of log p (each class's term
  // times its weight), 0 where ignored; "mean" divides it by the same total as the loss.
  const Tensor weighted = TimesClassWeight(log_probs, weight);
  const int64_t dims[] = {class_dim};
  const double per_class = -1.0 / static_cast<double>(input.size(class_dim));
  const Tensor smooth = mul(mul(sum(weighted, dims), kept), per_class);
  return add(mul(loss, 1 - label_smoothing),
             mul(ReduceLoss(smooth, reduction, total), label_smoothing));
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  // Note [mse_loss promotes]: PyTorch broadcasts input and target first, so both count as
  // dimensioned tensors and the result dtype is promote_types of the two (float32 with a
  // float64[] target gives float64, where result_type would say float32); it must be floating.
  RequireDefined("mse_loss", "input", input);
  RequireDefined("mse_loss", "target", target);
  RequireSameDevice("mse_loss", "input", input, "target", target);
  const DType dtype = PromoteTypes(input.dtype(), target.dtype());
  GS_CHECK_ARG(IsFloating(dtype), "mse_loss: input (", input.DebugString(), ") and target (",
               target.DebugString(), ") promote to ", DTypeName(dtype),
               ", but the loss needs a floating dtype");
  Tensor x = input.dtype() == dtype ? input : to(input, dtype);
  Tensor t = target.dtype() == dtype ? target : to(target, dtype);
  if (x.shape() != t.shape()) {
    const Shape shape = ValueOrThrow(BroadcastShapes(x.shape(), t.shape()));
    x = expand(x, shape);
    t = expand(t, shape);
  }
  const Tensor xc = x.contiguous(), tc = t.contiguous();
  Tensor out =
      Tensor::Empty(reduction == Reduction::kNone ? x.shape() : Shape{}, x.dtype(), x.device());
  mse_loss_stub(out.device(), xc, tc, reduction, out);
  RecordIfNeeded(out, {x, t}, [&] { return MakeNode<MseLossBackward>(x, t, reduction); });
  return out;
}

Tensor layer_norm(const Tensor& input, absl::Span<const int64_t> normalized_shape,
                  const Tensor& weight, const Tensor& bias, double eps) {
  RequireFloating("layer_norm", "input", input);
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  GS_CHECK_ARG(k >= 1, "layer_norm: normalized_shape must name at least one dimension");
  const bool fits = k <= input.dim() && std::equal(normalized_shape.begin(), normalized_shape.end(),
                                                   input.shape().end() - k);
  GS_CHECK_ARG(fits, "layer_norm: normalized_shape ", ShapeToString(normalized_shape),
               " is not the trailing shape of input with shape ", ShapeToString(input.shape()));
  for (const auto& [arg, t] : {std::pair<const char*, const Tensor&>{"weight", weight},
                               std::pair<const char*, const Tensor&>{"bias", bias}}) {
    if (!t.defined()) continue;
    CheckSameDTypeAndDevice("layer_norm", "input", input, arg, t);
    GS_CHECK_ARG(t.shape() == Shape(normalized_shape.begin(), normalized_shape.end()),
                 "layer_norm: ", arg, " has shape ", ShapeToString(t.shape()),
                 " but normalized_shape is ", ShapeToString(normalized_shape));
  }
  GS_CHECK_ARG(eps >= 0, "layer_norm: eps = ", eps, " must be non-negative");
  const int64_t cols = ProductOf(input.shape(), input.dim() - k, input.dim());
  const int64_t rows = cols == 0 ? 0 : input.numel() / cols;
  const Tensor x = input.contiguous();
  const Tensor w = weight.defined() ? weight.contiguous() : Tensor();
  const Tensor b = bias.defined() ? bias.contiguous() : Tensor();
  Tensor out = Tensor::Empty(input.shape(), input.dtype(), input.device());
  // Note [layer_norm's statistics in float64]
  // The statistics the backward reads are kept in float64 whatever the input's dtype, as
  // they are computed. Rounded to float32 (as PyTorch's CPU kernel keeps them), the mean of
  // a row shifted far from 0 (values near 100 that differ by 1) is off by up to half an ulp
  // of 100, so xhat = (x - mean) * rstd is off by 4e-6 relative; gx = rstd * (gy - mean(gy)
  // - xhat * mean(gy * xhat)) then cancels terms of the weight's magnitude down to the
  // spread's, and a weight near 100 made that 5e-4 relative where PyTorch's own formula got
  // 1e-4 (diff_fuzz.py seed 202446368, graph 298). With float64 statistics that gradient is
  // within an ulp or two of float32. They are [rows] elements: a few bytes more per row. The
  // differentiable formula (create_graph) recomputes them, so for the same reason it runs a
  // float32 layer_norm's backward in float64 and rounds each gradient once.
  Tensor mean = Tensor::Empty({rows}, DType::kFloat64, input.device());
  Tensor rstd = Tensor::Empty({rows}, DType::kFloat64, input.device());
  layer_norm_stub(out.device(), x, w, b, rows, cols, eps, out, mean, rstd);
  RecordIfNeeded(out, {input, weight, bias}, [&] {
    return MakeNode<LayerNormBackward>(input, weight, bias, mean, rstd, k, eps);
  });
  return out;
}

Tensor embedding(const Tensor& weight, const Tensor& indices, std::optional<int64_t> padding_idx) {
  RequireFloating("embedding", "weight", weight);
  GS_CHECK_ARG(weight.dim() == 2, "embedding: weight must be 2-d [num_embeddings, ",
               "embedding_dim], got shape ", ShapeToString(weight.shape()));
  const int64_t rows = weight.size(0);
  if (padding_idx.has_value()) {
    GS_CHECK_ARG(*padding_idx >= -rows && *padding_idx < rows,
                 "embedding: padding_idx = ", *padding_idx,
                 " is out of range for weight with shape ", ShapeToString(weight.shape()));
    if (*padding_idx < 0) *padding_idx += rows;
  }
  CheckIndices("embedding", "indices", HostIndices(indices), rows, std::nullopt,
               absl::StrCat("weight with shape ", ShapeToString(weight.shape())));
  const int64_t flat_shape[] = {-1};
  const Tensor flat = reshape(indices, flat_shape);
  const Tensor picked = IndexSelectKernel(weight, 0, flat, std::nullopt);
  Shape out_shape = indices.shape();
  out_shape.push_back(weight.size(1));
  Tensor out = picked.AsStrided(out_shape, ContiguousStrides(out_shape), picked.storage_offset());
  RecordIfNeeded(out, {weight},
                 [&] { return MakeNode<EmbeddingBackward>(weight.shape(), indices, padding_idx); });
  return out;
}

namespace {

// conv2d with padding="same" on a [N, C, H, W] input (Conv2dOptions::same_padding), as PyTorch
// computes it: the symmetric half of each dim's padding is the convolution's; where the total
// is odd, the input is first extended by one zero row or column at its end.
Tensor SamePaddingConv2d(const Tensor& input, const Tensor& weight, const Tensor& bias,
                         const Conv2dOptions& options) {
  GS_CHECK_ARG(options.stride[0] == 1 && options.stride[1] == 1,
               "conv2d: padding='same' is not supported for strided convolutions (stride [",
               options.stride[0], ", ", options.stride[1], "]), as in PyTorch");
  Conv2dOptions symmetric = options;
  symmetric.same_padding = false;
  Tensor x = input;
  // Bad shapes and dilations are left to conv2d's checks: they pad nothing here.
  for (int i = 0; i < 2 && weight.dim() == 4; ++i) {
    const int64_t kernel = weight.size(2 + i), dilation = options.dilation[i];
    int64_t total = 0;
    if (kernel < 1 || dilation < 1 || __builtin_mul_overflow(dilation, kernel - 1, &total)) {
      continue;
    }
    symmetric.padding[i] = total / 2;
    if (total % 2 == 1) {
      const int64_t dim = 2 + i;
      Shape edge = x.shape();
      edge[dim] = 1;
      x = cat({x, Tensor::Zeros(edge, x.dtype(), x.device())}, dim);
    }
  }
  return conv2d(x, weight, bias, symmetric);
}

}  // namespace

Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias,
              const Conv2dOptions& options) {
  RequireFloating("conv2d", "input", input);
  RequireFloating("conv2d", "weight", weight);
  CheckSameDTypeAndDevice("conv2d", "input", input, "weight", weight);
  GS_CHECK_ARG(input.dim() == 3 || input.dim() == 4, "conv2d: input must be [N, C, H, W] or ",
               "[C, H, W], got shape ", ShapeToString(input.shape()));
  if (input.dim() == 3) return squeeze(conv2d(unsqueeze(input, 0), weight, bias, options), 0);
  if (options.same_padding) return SamePaddingConv2d(input, weight, bias, options);
  const ConvGeometry g = MakeConvGeometry(input.shape(), weight.shape(), options);
  if (bias.defined()) {
    CheckSameDTypeAndDevice("conv2d", "input", input, "bias", bias);
    GS_CHECK_ARG(bias.shape() == Shape{g.out_channels}, "conv2d: bias has shape ",
                 ShapeToString(bias.shape()), " but weight with shape ",
                 ShapeToString(weight.shape()), " needs [", g.out_channels, "]");
  }
  // Note [conv2d over zero channels]
  // An input of zero channels (weight [O, 0, kH, kW]) gives an output of zero channels, not
  // O: PyTorch (1.13 and 2.x alike: calc_output_size's "empty # of channels") sets the
  // output's channel count to the input's, so nothing is convolved and the bias is added
  // nowhere; its backward gives zeros for input, weight and bias. gradserve follows, so that
  // a client's graph has the shapes PyTorch gives it.
  const bool zero_channels = g.channels == 0;
  const Tensor x = input.contiguous(), w = weight.contiguous();
  const Tensor b = bias.defined() ? bias.contiguous() : Tensor();
  Tensor out = Tensor::Empty({g.batch, zero_channels ? 0 : g.out_channels, g.out_h, g.out_w},
                             input.dtype(), input.device());
  if (!zero_channels) conv2d_stub(out.device(), x, w, b, g, out);
  RecordIfNeeded(out, {input, weight, bias},
                 [&] { return MakeNode<ConvolutionBackward>(input, weight, bias.defined(), g); });
  return out;
}

}  // namespace gradserve::ops
