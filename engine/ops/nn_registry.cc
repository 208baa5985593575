// The schemas of the NN ops (engine/ops/nn.h) and how a graph runs them.

#include <array>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "engine/ops/nn.h"
#include "engine/ops/op_registry.h"
#include "engine/util/quote.h"

namespace gradserve::ops {
namespace {

using RunFn = std::function<TensorList(const TensorList&, const Attrs&)>;

OpSchema Schema(std::string name, std::string doc, std::vector<std::string> input_names,
                std::vector<AttrSpec> attrs, RunFn run, int optional_inputs = 0) {
  OpSchema s;
  s.name = std::move(name);
  s.doc = std::move(doc);
  s.input_names = std::move(input_names);
  s.optional_inputs = optional_inputs;
  s.attrs = std::move(attrs);
  s.dtypes = {DType::kFloat32, DType::kFloat64, DType::kInt64};
  s.run = std::move(run);
  return s;
}

// Input i if the caller passed it, else an undefined tensor (an optional trailing input).
Tensor OptionalInput(const TensorList& in, size_t i) { return i < in.size() ? in[i] : Tensor(); }

const AttrSpec kReduction = {"reduction", AttrType::kString, false,
                             "'none', 'mean' or 'sum'; default 'mean'"};

// The reduction attribute, checked here so that the error quotes the client's string (Note
// [Quoting client strings]).
Reduction GetReduction(const char* op, const Attrs& a) {
  const std::string name = a.GetString("reduction", "mean");
  GS_CHECK_ARG(name == "none" || name == "mean" || name == "sum", op, ": reduction = ", Quote(name),
               " is not one of 'none', 'mean', 'sum'");
  return ParseReduction(op, name);
}

// A conv2d pair attribute: one int for both dims or two ints (height, width).
std::array<int64_t, 2> GetPair(const Attrs& a, const std::string& name, int64_t default_value) {
  const std::vector<int64_t> v = a.GetInts(name, {default_value});
  GS_CHECK_ARG(v.size() == 1 || v.size() == 2, "conv2d: attribute '", name,
               "' must have one or two ints, got ", v.size());
  return {v[0], v.size() == 2 ? v[1] : v[0]};
}

// The keywords conv2d's padding takes instead of ints (its AttrSpec's keywords). Built by
// push_back: compiled by nvcc (CUDA builds compile this file as CUDA), `new
// std::vector<std::string>{"valid", "same"}` threw std::length_error from basic_string at
// start-up, as if it made one string of the two pointers.
const std::vector<std::string>& PaddingModes() {
  static const std::vector<std::string>* const modes = [] {
    auto* v = new std::vector<std::string>;
    v->push_back("valid");
    v->push_back("same");
    return v;
  }();
  return *modes;
}

// Reads conv2d's padding into options: one or two ints, or one of PaddingModes().
void SetPadding(const Attrs& a, Conv2dOptions& options) {
  if (a.has("padding")) {
    if (const auto* mode = std::get_if<std::string>(&a.values().at("padding"))) {
      GS_CHECK_ARG(absl::c_linear_search(PaddingModes(), *mode), "conv2d: padding = '", *mode,
                   "' must be one or two ints, 'valid' or 'same'");
      options.same_padding = *mode == "same";
      return;
    }
  }
  options.padding = GetPair(a, "padding", 0);
}

}  // namespace

void RegisterNNOps(OpRegistry& registry) {
  registry.Add(Schema("softmax", "Softmax along a dimension", {"input"},
                      {{"dim", AttrType::kInt, true, "the dimension to normalize over"}},
                      [](const TensorList& in, const Attrs& a) -> TensorList {
                        return {softmax(in[0], a.GetInt("dim"))};
                      }));
  registry.Add(Schema("log_softmax", "Log of softmax along a dimension, computed stably", {"input"},
                      {{"dim", AttrType::kInt, true, "the dimension to normalize over"}},
                      [](const TensorList& in, const Attrs& a) -> TensorList {
                        return {log_softmax(in[0], a.GetInt("dim"))};
                      }));
  const AttrSpec ignore_index = {"ignore_index", AttrType::kInt, false,
                                 "a target value that contributes nothing; default -100"};
  registry.Add(Schema(
      "cross_entropy",
      "Cross entropy of logits [N, C, ...] against int64 class indices or floating class "
      "probabilities of the input's shape; optional class weights [C]",
      {"input", "target", "weight"},
      {kReduction,
       ignore_index,
       {"label_smoothing", AttrType::kFloat, false,
        "weight in [0, 1] of the uniform distribution mixed into the target; default 0"}},
      [](const TensorList& in, const Attrs& a) -> TensorList {
        return {cross_entropy(in[0], in[1], GetReduction("cross_entropy", a),
                              a.GetInt("ignore_index", -100), a.GetFloat("label_smoothing", 0),
                              OptionalInput(in, 2))};
      },
      /*optional_inputs=*/1));
  registry.Add(Schema(
      "nll_loss",
      "Negative log likelihood of log-probabilities [N, C, ...] against int64 "
      "class indices; optional class weights [C]",
      {"input", "target", "weight"}, {kReduction, ignore_index},
      [](const TensorList& in, const Attrs& a) -> TensorList {
        return {nll_loss(in[0], in[1], GetReduction("nll_loss", a), a.GetInt("ignore_index", -100),
                         OptionalInput(in, 2))};
      },
      /*optional_inputs=*/1));
  registry.Add(Schema("mse_loss", "Mean squared error; shapes broadcast", {"input", "target"},
                      {kReduction}, [](const TensorList& in, const Attrs& a) -> TensorList {
                        return {mse_loss(in[0], in[1], GetReduction("mse_loss", a))};
                      }));
  registry.Add(Schema(
      "layer_norm", "Layer normalization over the trailing dimensions", {"input", "weight", "bias"},
      {{"normalized_shape", AttrType::kInts, true, "the trailing shape to normalize over"},
       {"eps", AttrType::kFloat, false, "added to the variance; default 1e-5"}},
      [](const TensorList& in, const Attrs& a) -> TensorList {
        return {layer_norm(in[0], a.GetInts("normalized_shape"), OptionalInput(in, 1),
                           OptionalInput(in, 2), a.GetFloat("eps", 1e-5))};
      },
      /*optional_inputs=*/2));
  registry.Add(Schema("embedding", "Rows of weight [V, D] picked by int64 indices of any shape",
                      {"weight", "indices"},
                      {{"padding_idx", AttrType::kInt, false,
                        "a row (may be negative) whose lookups get no gradient; default none"}},
                      [](const TensorList& in, const Attrs& a) -> TensorList {
                        std::optional<int64_t> padding_idx;
                        if (a.has("padding_idx")) padding_idx = a.GetInt("padding_idx");
                        return {embedding(in[0], in[1], padding_idx)};
                      }));
  registry.Add(Schema(
      "conv2d", "2-d convolution of [N, C, H, W] (or [C, H, W]) by weight [O, C / groups, kH, kW]",
      {"input", "weight", "bias"},
      {{"stride", AttrType::kInts, false, "one or two ints (height, width); default 1"},
       {"padding", AttrType::kInts, false,
        "zero padding, one or two ints, or 'valid' (none) or 'same' (stride 1: the output keeps "
        "the input's height and width); default 0",
        PaddingModes()},
       {"dilation", AttrType::kInts, false, "one or two ints; default 1"},
       {"groups", AttrType::kInt, false, "channel groups dividing C and O; default 1"}},
      [](const TensorList& in, const Attrs& a) -> TensorList {
        Conv2dOptions options;
        options.stride = GetPair(a, "stride", 1);
        SetPadding(a, options);
        options.dilation = GetPair(a, "dilation", 1);
        options.groups = a.GetInt("groups", 1);
        return {conv2d(in[0], in[1], OptionalInput(in, 2), options)};
      },
      /*optional_inputs=*/1));
}

}  // namespace gradserve::ops
