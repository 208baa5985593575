#include "engine/graph/hooks.h"

#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/ops/op_registry.h"
#include "engine/util/quote.h"
#include "engine/util/status_error.h"

namespace gradserve::graph {
namespace {

using autograd::TensorHook;

// Runs a registry op; hooks use only ops that every build registers.
Tensor RunOp(const char* name, const TensorList& inputs, const ops::Attrs& attrs = {}) {
  const ops::OpSchema* schema = ops::OpRegistry::Get().Find(name);
  GS_CHECK_INTERNAL(schema != nullptr, "gradient hooks need the op ", name);
  return schema->run(inputs, attrs).at(0);
}

class ScaleHook final : public TensorHook {
 public:
  explicit ScaleHook(double factor) : factor_(factor) {}
  Tensor operator()(const Tensor& grad) override {
    if (!grad.defined()) return grad;
    return RunOp("mul", {grad, Tensor::Scalar(factor_, grad.dtype(), grad.device())});
  }

 private:
  const double factor_;
};

class ClampHook final : public TensorHook {
 public:
  ClampHook(std::optional<double> min, std::optional<double> max) {
    if (min) attrs_.set("min", *min);
    if (max) attrs_.set("max", *max);
  }
  Tensor operator()(const Tensor& grad) override {
    if (!grad.defined()) return grad;
    return RunOp("clamp", {grad}, attrs_);
  }

 private:
  ops::Attrs attrs_;
};

// The gradient of a zero-hooked value does not depend on anything: plain zeros, no history.
class ZeroHook final : public TensorHook {
 public:
  Tensor operator()(const Tensor& grad) override {
    if (!grad.defined()) return grad;
    return grad.ZerosLike();
  }
};

// where(isfinite(grad), grad, replacement): differentiable in grad (1 where finite, 0 where
// replaced). The mask and the replacements are computed on the host.
class NanToNumHook final : public TensorHook {
 public:
  NanToNumHook(double nan, std::optional<double> posinf, std::optional<double> neginf)
      : nan_(nan), posinf_(posinf), neginf_(neginf) {}

  Tensor operator()(const Tensor& grad) override {
    if (!grad.defined()) return grad;
    // A 16-bit gradient is mended in float32 (Note [Half precision computes in float32]); the
    // where below rounds it back.
    const DType dtype = IsHalfFloating(grad.dtype()) ? DType::kFloat32 : grad.dtype();
    const Tensor host = grad.To(kCPU).To(dtype).contiguous();
    Tensor finite = Tensor::Empty(host.shape(), DType::kBool);
    Tensor replacement = host.ZerosLike();
    DispatchFloating(host.dtype(), [&](auto tag) {
      using T = decltype(tag);
      // PyTorch's defaults: the largest finite values of the gradient's own dtype.
      const double largest = grad.dtype() == DType::kFloat16    ? 65504.0
                             : grad.dtype() == DType::kBFloat16 ? 3.3895313892515355e38
                                                                : std::numeric_limits<T>::max();
      const T posinf = static_cast<T>(posinf_.value_or(largest));
      const T neginf = static_cast<T>(neginf_.value_or(-largest));
      const T* in = host.data<T>();
      bool* keep = finite.data<bool>();
      T* repl = replacement.data<T>();
      for (int64_t i = 0; i < host.numel(); ++i) {
        keep[i] = std::isfinite(in[i]);
        if (std::isnan(in[i])) {
          repl[i] = static_cast<T>(nan_);
        } else if (std::isinf(in[i])) {
          repl[i] = in[i] > 0 ? posinf : neginf;
        }
      }
    });
    return RunOp("where",
                 {finite.To(grad.device()), grad, replacement.To(grad.device()).To(grad.dtype())});
  }

 private:
  const double nan_;
  const std::optional<double> posinf_;
  const std::optional<double> neginf_;
};

// Throws unless every parameter given is one that `kind` takes.
void CheckParams(const ops::Attrs& attrs, const std::string& kind,
                 const std::set<std::string>& allowed) {
  for (const auto& [name, value] : attrs.values()) {
    if (name == "kind" || allowed.count(name) > 0) continue;
    const std::string takes = allowed.empty() ? std::string("no parameters")
                                              : absl::StrCat("only ", absl::StrJoin(allowed, ", "));
    ThrowStatus(absl::InvalidArgumentError(absl::StrCat("attribute ", Quote(name),
                                                        " does not apply to hook kind ",
                                                        Quote(kind), " (it takes ", takes, ")")));
  }
}

}  // namespace

std::shared_ptr<TensorHook> MakeGradientHook(const ops::Attrs& attrs) {
  const std::string kind = attrs.GetString("kind");
  if (kind == "scale") {
    CheckParams(attrs, kind, {"factor"});
    return std::make_shared<ScaleHook>(attrs.GetFloat("factor"));
  }
  if (kind == "clamp") {
    CheckParams(attrs, kind, {"min", "max"});
    const std::optional<double> min = attrs.GetOptionalFloat("min");
    const std::optional<double> max = attrs.GetOptionalFloat("max");
    GS_CHECK_ARG(min || max, "hook kind 'clamp' needs attribute 'min' or 'max'");
    GS_CHECK_ARG(!min || !max || *min <= *max, "hook kind 'clamp': min ", *min,
                 " is greater than max ", *max);
    return std::make_shared<ClampHook>(min, max);
  }
  if (kind == "zero") {
    CheckParams(attrs, kind, {});
    return std::make_shared<ZeroHook>();
  }
  if (kind == "nan_to_num") {
    CheckParams(attrs, kind, {"nan", "posinf", "neginf"});
    return std::make_shared<NanToNumHook>(attrs.GetFloat("nan", 0.0),
                                          attrs.GetOptionalFloat("posinf"),
                                          attrs.GetOptionalFloat("neginf"));
  }
  ThrowStatus(
      absl::InvalidArgumentError(absl::StrCat("attribute 'kind': unknown hook kind ", Quote(kind),
                                              " (known: scale, clamp, zero, nan_to_num)")));
}

}  // namespace gradserve::graph
