#include "engine/ops/op_registry.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/kernels/op_kernels.h"
#include "engine/ops/device_copy.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/inplace.h"
#include "engine/tensor/dtype.h"

namespace gradserve::ops {
namespace {

// Note [PyTorch equivalents]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// Every op names the PyTorch function it reproduces (OpSchema::torch), which server info sends
// and docs/ops.md lists. Most ops are torch.<name>; the ones that live elsewhere in PyTorch
// (torch.nn.functional, Tensor methods) are listed here, so an op family's file need not say
// it; an in-place op (its name ends in '_') is the Tensor method of that name. An op that sets
// OpSchema::torch itself keeps its own. Read once, when the registry is sealed; nothing on a
// request's path reads it.
const absl::flat_hash_map<absl::string_view, absl::string_view>& TorchElsewhere() {
  static const auto* const names = new absl::flat_hash_map<absl::string_view, absl::string_view>{
      {"adaptive_avg_pool2d", "torch.nn.functional.adaptive_avg_pool2d"},
      {"avg_pool2d", "torch.nn.functional.avg_pool2d"},
      {"batch_norm", "torch.nn.functional.batch_norm"},
      {"conv2d", "torch.nn.functional.conv2d"},
      {"cross_entropy", "torch.nn.functional.cross_entropy"},
      {"dropout", "torch.nn.functional.dropout"},
      {"elu", "torch.nn.functional.elu"},
      {"embedding", "torch.nn.functional.embedding"},
      {"expand", "Tensor.expand"},
      {"gelu", "torch.nn.functional.gelu"},
      {"group_norm", "torch.nn.functional.group_norm"},
      {"layer_norm", "torch.nn.functional.layer_norm"},
      {"leaky_relu", "torch.nn.functional.leaky_relu"},
      {"linear", "torch.nn.functional.linear"},
      {"max_pool2d", "torch.nn.functional.max_pool2d"},
      {"mse_loss", "torch.nn.functional.mse_loss"},
      {"nll_loss", "torch.nn.functional.nll_loss"},
      {"scaled_dot_product_attention", "torch.nn.functional.scaled_dot_product_attention"},
      {"silu", "torch.nn.functional.silu"},
      {"slice", "Tensor.__getitem__ (x[..., start:end:step])"},
      {"softplus", "torch.nn.functional.softplus"},
      {"to", "Tensor.to"},
      {"view", "Tensor.view"},
  };
  return *names;
}

// Note [Ops on 16-bit floats]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Most ops' kernels are written for float32 and float64; float16 and bfloat16 tensors are
// computed in float32 (Note [Half precision computes in float32] in engine/tensor/half.h). Seal
// wraps the run of each op not listed below in RunIn16BitFloats: when one of its floating inputs is
// 16-bit, each such input is converted with `to` float32 (recorded, so its gradient goes back to 16
// bits), the op runs as on float32 tensors, and each float32 output is rounded back with `to` to
// the dtype PyTorch gives: the promoted dtype of the floating inputs (float16 for float16 inputs,
// float32 when float32 or the other 16-bit type takes part), or for an in-place op self's, into
// whose elements copy_ then writes the result. An op's forward thus rounds once, as PyTorch's
// kernels do; its backward computes in float32 and rounds once where the gradient leaves the op,
// where PyTorch's 16-bit backward kernels round each of their steps: equal within the 16-bit types'
// tolerance, and never less accurate. A request with no 16-bit tensor pays one pass over the
// inputs' dtypes and one more indirect call per op.
//
// The ops in kKept16Bit take 16-bit tensors as they are. All but matmul move, view or convert
// elements without arithmetic: a view must stay a view of its input's elements, and `to` is
// the conversion itself. Their backward formulas are views, copies and `to` again, except a
// strided slice's index_add, which converts as above itself (engine/ops/indexing.cc), and
// expand's sum_to, which is in 16 bits below. matmul multiplies
// 16-bit matrices on a GPU with cuBLAS's float32-accumulating tensor-core products, as PyTorch
// does, and converts as above everywhere else (engine/ops/linalg.cc).
//
// The ops in kComputes16Bit compute 16-bit tensors themselves, with 16-bit reads and writes
// around float32 arithmetic (Note [16-bit elementwise kernels] in engine/ops/elementwise.cc):
// every path of theirs, forward, backward and double backward, runs through those maps, the
// 16-bit sum (SumOver), views and `to`. HalfOpsTest.EveryOpComputing16BitMatchesFloat32
// checks each one of them that way; an op joins the list only with a row there.
constexpr absl::string_view kKept16Bit[] = {
    "cat",    "copy_", "expand",  "matmul", "narrow", "permute",   "reshape",
    "select", "slice", "squeeze", "stack",  "to",     "transpose", "unsqueeze",
};
constexpr absl::string_view kComputes16Bit[] = {
    "abs",      "add", "add_", "cos", "div",  "div_",  "exp",   "gelu",
    "log",      "mul", "mul_", "neg", "relu", "relu_", "rsqrt", "sigmoid",
    "sigmoid_", "sin", "sqrt", "sub", "sub_", "sum",   "tanh",  "tanh_",
};

template <size_t N>
bool Lists(const absl::string_view (&list)[N], absl::string_view name) {
  return std::find(std::begin(list), std::end(list), name) != std::end(list);
}

using RunFn = std::function<TensorList(const TensorList&, const Attrs&)>;

RunFn RunIn16BitFloats(const std::string& name, RunFn run, bool in_place) {
  return [name, run = std::move(run), in_place](const TensorList& inputs,
                                                const Attrs& attrs) -> TensorList {
    bool any_16bit = false;
    for (const Tensor& t : inputs) any_16bit |= t.defined() && IsHalfFloating(t.dtype());
    if (!any_16bit) return run(inputs, attrs);
    // The op writes a float32 copy of self, so self's own checks come first, in its name.
    if (in_place && !inputs.empty()) CheckInPlace(name.c_str(), inputs[0], {});
    // torch.result_type of the floating inputs: a 0-d float64 keeps a float16 tensor's dtype.
    const std::optional<DType> result =
        in_place ? std::optional<DType>(inputs[0].dtype()) : FloatingResultType(inputs);
    TensorList wide = inputs;
    for (Tensor& t : wide) {
      if (t.defined() && IsHalfFloating(t.dtype())) t = to(t, DType::kFloat32);
    }
    TensorList outputs = run(wide, attrs);
    if (!result || !IsHalfFloating(*result)) return outputs;
    for (Tensor& out : outputs) {
      if (out.defined() && out.dtype() == DType::kFloat32) out = to(out, *result);
    }
    if (in_place && !outputs.empty()) outputs[0] = copy_(inputs[0], outputs[0]);
    return outputs;
  };
}

}  // namespace

const OpRegistry& OpRegistry::Get() {
  static const OpRegistry* const registry = [] {
    auto* r = new OpRegistry;
    RegisterElementwiseOps(*r);
    RegisterReductionOps(*r);
    RegisterLinalgOps(*r);
    RegisterShapeOps(*r);
    RegisterNNOps(*r);
    RegisterModelOps(*r);
    RegisterDeviceCopyOps(*r);
    r->Seal();
    return r;
  }();
  return *registry;
}

void OpRegistry::Seal() {
  std::sort(ops_.begin(), ops_.end(),
            [](const OpSchema& a, const OpSchema& b) { return a.name < b.name; });
  for (OpSchema& op : ops_) {
    if (op.torch.empty()) {
      auto it = TorchElsewhere().find(op.name);
      if (it != TorchElsewhere().end()) {
        op.torch = std::string(it->second);
      } else if (absl::EndsWith(op.name, "_")) {
        op.torch = absl::StrCat("Tensor.", op.name);
      } else {
        op.torch = absl::StrCat("torch.", op.name);
      }
    }
    // Note [Ops on 16-bit floats]
    if (op.run && !Lists(kKept16Bit, op.name) && !Lists(kComputes16Bit, op.name)) {
      op.run = RunIn16BitFloats(op.name, std::move(op.run), op.in_place);
    }
    if (std::find(op.dtypes.begin(), op.dtypes.end(), DType::kFloat32) != op.dtypes.end()) {
      op.dtypes.push_back(DType::kFloat16);
      op.dtypes.push_back(DType::kBFloat16);
    }
    by_name_.emplace(op.name, &op);
  }
}

const OpSchema* OpRegistry::Find(absl::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

void OpRegistry::Add(OpSchema schema) { ops_.push_back(std::move(schema)); }

absl::Span<const absl::string_view> OpsComputing16Bit() { return kComputes16Bit; }

}  // namespace gradserve::ops
