// The schemas of the ops real models need beside the core set (issue 28): activations.h,
// comparison.h, statistics.h, linear.h, indexing.h, pooling.h, normalization.h, dropout.h and
// attention.h, and how a graph runs them.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/ops/activations.h"
#include "engine/ops/attention.h"
#include "engine/ops/comparison.h"
#include "engine/ops/dropout.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/indexing.h"
#include "engine/ops/linear.h"
#include "engine/ops/normalization.h"
#include "engine/ops/op_registry.h"
#include "engine/ops/pooling.h"
#include "engine/ops/statistics.h"
#include "engine/util/status_error.h"

namespace gradserve::ops {
namespace {

using RunFn = std::function<TensorList(const TensorList&, const Attrs&)>;

const std::vector<DType> kFloating = {DType::kFloat32, DType::kFloat64};
const std::vector<DType> kNumeric = {DType::kFloat32, DType::kFloat64, DType::kInt64};
const std::vector<DType> kAll = {DType::kFloat32, DType::kFloat64, DType::kInt64, DType::kBool};

OpSchema Schema(std::string name, std::string doc, std::vector<std::string> input_names,
                std::vector<AttrSpec> attrs, std::vector<DType> dtypes, RunFn run,
                int optional_inputs = 0, int num_outputs = 1) {
  OpSchema s;
  s.name = std::move(name);
  s.doc = std::move(doc);
  s.input_names = std::move(input_names);
  s.optional_inputs = optional_inputs;
  s.num_outputs = num_outputs;
  s.attrs = std::move(attrs);
  s.dtypes = std::move(dtypes);
  s.run = std::move(run);
  return s;
}

// Input i if the caller passed it, else an undefined tensor (an optional trailing input).
Tensor OptionalInput(const TensorList& in, size_t i) { return i < in.size() ? in[i] : Tensor(); }

const AttrSpec kKeepdim = {"keepdim", AttrType::kBool, false,
                           "keep each reduced dim as size 1; default false"};
const AttrSpec kDims = {"dim", AttrType::kInts, false,
                        "the dims to reduce; default (or []) every dim"};

// var's and std's correction: `correction`, or PyTorch's older `unbiased` (true: 1, false: 0).
int64_t GetCorrection(const char* op, const Attrs& a) {
  GS_CHECK_ARG(!(a.has("correction") && a.has("unbiased")), op,
               ": give either correction or unbiased, not both");
  if (a.has("unbiased")) return a.GetBool("unbiased", true) ? 1 : 0;
  return a.GetInt("correction", 1);
}

void RegisterActivations(OpRegistry& registry) {
  registry.Add(
      Schema("erf", "the error function", {"input"}, {}, kAll,
             [](const TensorList& in, const Attrs&) -> TensorList { return {erf(in[0])}; }));
  registry.Add(
      Schema("silu", "input * sigmoid(input)", {"input"}, {}, kFloating,
             [](const TensorList& in, const Attrs&) -> TensorList { return {silu(in[0])}; }));
  registry.Add(Schema("leaky_relu", "input where input > 0, else input * negative_slope", {"input"},
                      {{"negative_slope", AttrType::kFloat, false, "default 0.01"}}, kFloating,
                      [](const TensorList& in, const Attrs& a) -> TensorList {
                        return {leaky_relu(in[0], a.GetFloat("negative_slope", 0.01))};
                      }));
  registry.Add(Schema("elu", "input where input > 0, else alpha * (exp(input) - 1)", {"input"},
                      {{"alpha", AttrType::kFloat, false, "default 1"}}, kFloating,
                      [](const TensorList& in, const Attrs& a) -> TensorList {
                        return {elu(in[0], a.GetFloat("alpha", 1.0))};
                      }));
}

void RegisterComparisons(OpRegistry& registry) {
  registry.Add(Schema(
      "maximum", "the larger of input and other elementwise, broadcasting", {"input", "other"}, {},
      kAll,
      [](const TensorList& in, const Attrs&) -> TensorList { return {maximum(in[0], in[1])}; }));
  registry.Add(Schema(
      "minimum", "the smaller of input and other elementwise, broadcasting", {"input", "other"}, {},
      kAll,
      [](const TensorList& in, const Attrs&) -> TensorList { return {minimum(in[0], in[1])}; }));
  registry.Add(Schema(
      "masked_fill",
      "input with value where the bool mask (broadcasting to input) is true; out of place",
      {"input", "mask", "value"},
      {{"value", AttrType::kFloat, false, "scalar value, used when the input value is left out"}},
      kAll,
      [](const TensorList& in, const Attrs& a) -> TensorList {
        if (in.size() > 2 && in[2].defined()) {
          GS_CHECK_ARG(!a.has("value"),
                       "masked_fill: give value either as an input tensor or as an attribute, "
                       "not both");
          return {masked_fill(in[0], in[1], in[2])};
        }
        GS_CHECK_ARG(a.has("value"),
                     "masked_fill: value is missing: give it as a 0-d input tensor or as a "
                     "scalar attribute");
        return {masked_fill(in[0], in[1], a.GetFloat("value"))};
      },
      /*optional_inputs=*/1));
  const AttrSpec diagonal = {"diagonal", AttrType::kInt, false,
                             "the diagonal bounding the triangle (0 the main one, > 0 above "
                             "it); default 0"};
  registry.Add(Schema("tril", "the lower triangle of the last two dims; zeros elsewhere", {"input"},
                      {diagonal}, kAll, [](const TensorList& in, const Attrs& a) -> TensorList {
                        return {tril(in[0], a.GetInt("diagonal", 0))};
                      }));
  registry.Add(Schema("triu", "the upper triangle of the last two dims; zeros elsewhere", {"input"},
                      {diagonal}, kAll, [](const TensorList& in, const Attrs& a) -> TensorList {
                        return {triu(in[0], a.GetInt("diagonal", 0))};
                      }));
}

void RegisterStatistics(OpRegistry& registry) {
  registry.Add(
      Schema("logsumexp", "log(sum(exp(input))) over dim, computed stably", {"input"},
             {{"dim", AttrType::kInts, true, "the dims to reduce ([]: every dim)"}, kKeepdim},
             kFloating, [](const TensorList& in, const Attrs& a) -> TensorList {
               return {logsumexp(in[0], a.GetInts("dim"), a.GetBool("keepdim", false))};
             }));
  const AttrSpec correction = {"correction", AttrType::kInt, false,
                               "subtracted from the count of elements; default 1"};
  const AttrSpec unbiased = {"unbiased", AttrType::kBool, false,
                             "PyTorch's older form of correction: true 1, false 0"};
  registry.Add(Schema("var", "variance over dim: sum((x - mean)^2) / (N - correction)", {"input"},
                      {kDims, correction, unbiased, kKeepdim}, kFloating,
                      [](const TensorList& in, const Attrs& a) -> TensorList {
                        return {var(in[0], a.GetInts("dim", {}), GetCorrection("var", a),
                                    a.GetBool("keepdim", false))};
                      }));
  registry.Add(Schema("std", "standard deviation over dim: sqrt(var)", {"input"},
                      {kDims, correction, unbiased, kKeepdim}, kFloating,
                      [](const TensorList& in, const Attrs& a) -> TensorList {
                        return {std_dev(in[0], a.GetInts("dim", {}), GetCorrection("std", a),
                                        a.GetBool("keepdim", false))};
                      }));
  registry.Add(Schema("amin", "the minimum over dim", {"input"}, {kDims, kKeepdim}, kNumeric,
                      [](const TensorList& in, const Attrs& a) -> TensorList {
                        return {amin(in[0], a.GetInts("dim", {}), a.GetBool("keepdim", false))};
                      }));
  const AttrSpec dim = {"dim", AttrType::kInt, true, "the dim to reduce"};
  for (const bool largest : {true, false}) {
    registry.Add(Schema(
        largest ? "max" : "min",
        absl::StrCat("(values, indices) of the ", largest ? "largest" : "smallest",
                     " elements along dim; the first one (or the first NaN) gets the gradient"),
        {"input"}, {dim, kKeepdim}, kNumeric,
        [largest](const TensorList& in, const Attrs& a) -> TensorList {
          auto [values, indices] =
              (largest ? max : min)(in[0], a.GetInt("dim"), a.GetBool("keepdim", false));
          return {values, indices};
        },
        0, /*num_outputs=*/2));
  }
}

void RegisterLinear(OpRegistry& registry) {
  registry.Add(Schema(
      "linear", "input [..., in] @ weight [out, in]^T + bias [out]", {"input", "weight", "bias"},
      {}, kNumeric,
      [](const TensorList& in, const Attrs&) -> TensorList {
        return {linear(in[0], in[1], OptionalInput(in, 2))};
      },
      /*optional_inputs=*/1));
  registry.Add(
      Schema("bmm", "batched matrix product [b, n, m] @ [b, m, p]", {"input", "mat2"}, {}, kNumeric,
             [](const TensorList& in, const Attrs&) -> TensorList { return {bmm(in[0], in[1])}; }));
  registry.Add(
      Schema("baddbmm", "beta * input + alpha * (batch1 @ batch2)", {"input", "batch1", "batch2"},
             {{"beta", AttrType::kFloat, false, "default 1"},
              {"alpha", AttrType::kFloat, false, "default 1"}},
             kNumeric, [](const TensorList& in, const Attrs& a) -> TensorList {
               return {baddbmm(in[0], in[1], in[2], a.GetFloat("beta", 1), a.GetFloat("alpha", 1))};
             }));
}

void RegisterIndexing(OpRegistry& registry) {
  registry.Add(Schema("flip", "the elements in reverse order along each of dims", {"input"},
                      {{"dims", AttrType::kInts, true, "the dims to reverse"}}, kAll,
                      [](const TensorList& in, const Attrs& a) -> TensorList {
                        return {flip(in[0], a.GetInts("dims"))};
                      }));
  registry.Add(Schema("roll", "the elements shifted along dims, wrapping around", {"input"},
                      {{"shifts", AttrType::kInts, true, "the shift along each of dims"},
                       {"dims", AttrType::kInts, false,
                        "the dims to shift; default none: the flattened tensor, by one shift"}},
                      kAll, [](const TensorList& in, const Attrs& a) -> TensorList {
                        return {roll(in[0], a.GetInts("shifts"), a.GetInts("dims", {}))};
                      }));
  registry.Add(
      Schema("slice", "input[start:end:step] along dim, as a Python slice (a view)", {"input"},
             {{"dim", AttrType::kInt, false, "default 0"},
              {"start", AttrType::kInt, false, "default none (the beginning); may be negative"},
              {"end", AttrType::kInt, false, "default none (the end); may be negative"},
              {"step", AttrType::kInt, false, "at least 1; default 1"}},
             kAll, [](const TensorList& in, const Attrs& a) -> TensorList {
               std::optional<int64_t> start, end;
               if (a.has("start")) start = a.GetInt("start");
               if (a.has("end")) end = a.GetInt("end");
               return {slice(in[0], a.GetInt("dim", 0), start, end, a.GetInt("step", 1))};
             }));
  const AttrSpec dim = {"dim", AttrType::kInt, true, "the dim the index addresses"};
  registry.Add(Schema("scatter_add",
                      "input with src[i][j] added at [i][index[i][j]] (dim 1); index int64",
                      {"input", "index", "src"}, {dim}, kFloating,
                      [](const TensorList& in, const Attrs& a) -> TensorList {
                        return {scatter_add(in[0], a.GetInt("dim"), in[1], in[2])};
                      }));
  registry.Add(
      Schema("index_add", "input with alpha * source's slice j added at slice index[j] along dim",
             {"input", "index", "source"}, {dim, {"alpha", AttrType::kFloat, false, "default 1"}},
             kFloating, [](const TensorList& in, const Attrs& a) -> TensorList {
               return {index_add(in[0], a.GetInt("dim"), in[1], in[2], a.GetFloat("alpha", 1))};
             }));
  // Note [Indexed writes] in indexing.h.
  auto index_copy_schema = [&](const char* name, bool in_place) {
    OpSchema schema =
        Schema(name,
               in_place ? "self's slices index[j] along dim = source's slice j, in place"
                        : "input with source's slice j written over slice index[j] along dim",
               {in_place ? "self" : "input", "index", "source"}, {dim}, kFloating,
               [in_place](const TensorList& in, const Attrs& a) -> TensorList {
                 return {in_place ? index_copy_(in[0], a.GetInt("dim"), in[1], in[2])
                                  : index_copy(in[0], a.GetInt("dim"), in[1], in[2])};
               });
    schema.in_place = in_place;
    registry.Add(std::move(schema));
  };
  index_copy_schema("index_copy", false);
  index_copy_schema("index_copy_", true);
  auto index_put_schema = [&](const char* name, bool in_place) {
    OpSchema schema = Schema(
        name,
        in_place ? "self[indices0, indices1, ...] = values (accumulate: +=), in place"
                 : "input with input[indices0, indices1, ...] = values (accumulate: +=)",
        {in_place ? "self" : "input", "values", "indices0", "indices1", "indices2", "indices3"},
        {{"accumulate", AttrType::kBool, false, "add values instead of writing; default false"}},
        kFloating,
        [in_place](const TensorList& in, const Attrs& a) -> TensorList {
          TensorList indices;
          for (size_t i = 2; i < in.size() && in[i].defined(); ++i) indices.push_back(in[i]);
          const bool accumulate = a.GetBool("accumulate", false);
          return {in_place ? index_put_(in[0], indices, in[1], accumulate)
                           : index_put(in[0], indices, in[1], accumulate)};
        },
        /*optional_inputs=*/3);
    schema.in_place = in_place;
    registry.Add(std::move(schema));
  };
  index_put_schema("index_put", false);
  index_put_schema("index_put_", true);
  registry.Add(Schema("cumsum", "running sums along dim; int64 and bool sum to int64", {"input"},
                      {{"dim", AttrType::kInt, true, "the dim to sum along"}}, kAll,
                      [](const TensorList& in, const Attrs& a) -> TensorList {
                        return {cumsum(in[0], a.GetInt("dim"))};
                      }));
}

// A pooling pair attribute of op: one int for both dims or two (height, width).
std::array<int64_t, 2> GetPair(const char* op, const Attrs& a, const std::string& name,
                               std::array<int64_t, 2> default_value) {
  if (!a.has(name)) return default_value;
  const std::vector<int64_t> v = a.GetInts(name);
  GS_CHECK_ARG(v.size() == 1 || v.size() == 2, op, ": attribute '", name,
               "' must have one or two ints, got ", v.size());
  return {v[0], v.size() == 2 ? v[1] : v[0]};
}

// The window attributes max_pool2d and avg_pool2d share.
Pool2dOptions GetPool2dOptions(const char* op, const Attrs& a) {
  Pool2dOptions o;
  o.kernel_size = GetPair(op, a, "kernel_size", {1, 1});
  o.stride = GetPair(op, a, "stride", o.kernel_size);
  o.padding = GetPair(op, a, "padding", {0, 0});
  o.ceil_mode = a.GetBool("ceil_mode", false);
  return o;
}

std::vector<AttrSpec> Pool2dAttrs() {
  return {{"kernel_size", AttrType::kInts, true, "one or two ints (height, width)"},
          {"stride", AttrType::kInts, false, "one or two ints; default kernel_size"},
          {"padding", AttrType::kInts, false,
           "implicit padding (-inf for max, zeros for avg), one or two ints at most half the "
           "kernel; default 0"},
          {"ceil_mode", AttrType::kBool, false,
           "round the output size up (max_pool2d only); default false"}};
}

void RegisterLayers(OpRegistry& registry) {
  std::vector<AttrSpec> max_attrs = Pool2dAttrs();
  max_attrs.push_back({"dilation", AttrType::kInts, false, "one or two ints; default 1"});
  registry.Add(Schema("max_pool2d", "the maximum of each window of [N, C, H, W] (or [C, H, W])",
                      {"input"}, max_attrs, kFloating,
                      [](const TensorList& in, const Attrs& a) -> TensorList {
                        Pool2dOptions o = GetPool2dOptions("max_pool2d", a);
                        o.dilation = GetPair("max_pool2d", a, "dilation", {1, 1});
                        return {max_pool2d(in[0], o)};
                      }));
  std::vector<AttrSpec> avg_attrs = Pool2dAttrs();
  avg_attrs.push_back({"count_include_pad", AttrType::kBool, false,
                       "count the padding in each window's divisor; default true"});
  avg_attrs.push_back({"divisor_override", AttrType::kInt, false,
                       "the divisor of every window's sum; default none"});
  registry.Add(Schema("avg_pool2d", "the mean of each window of [N, C, H, W] (or [C, H, W])",
                      {"input"}, avg_attrs, kFloating,
                      [](const TensorList& in, const Attrs& a) -> TensorList {
                        Pool2dOptions o = GetPool2dOptions("avg_pool2d", a);
                        o.count_include_pad = a.GetBool("count_include_pad", true);
                        if (a.has("divisor_override"))
                          o.divisor_override = a.GetInt("divisor_override");
                        return {avg_pool2d(in[0], o)};
                      }));
  registry.Add(Schema("adaptive_avg_pool2d",
                      "means over output_size bins of [N, C, H, W] (or [C, H, W])", {"input"},
                      {{"output_size", AttrType::kInts, true, "one or two ints (height, width)"}},
                      kFloating, [](const TensorList& in, const Attrs& a) -> TensorList {
                        return {adaptive_avg_pool2d(
                            in[0], GetPair("adaptive_avg_pool2d", a, "output_size", {1, 1}))};
                      }));
  registry.Add(Schema(
      "batch_norm",
      "batch normalization per channel of [N, C, ...]; outputs (output, running_mean, "
      "running_var), the running statistics after the call",
      {"input", "running_mean", "running_var", "weight", "bias"},
      {{"training", AttrType::kBool, false,
        "normalize by the batch's statistics and update the running ones; default false"},
       {"momentum", AttrType::kFloat, false, "weight of the batch in the update; default 0.1"},
       {"eps", AttrType::kFloat, false, "added to the variance; default 1e-5"}},
      kFloating,
      [](const TensorList& in, const Attrs& a) -> TensorList {
        BatchNormResult r =
            batch_norm(in[0], OptionalInput(in, 1), OptionalInput(in, 2), OptionalInput(in, 3),
                       OptionalInput(in, 4), a.GetBool("training", false),
                       a.GetFloat("momentum", 0.1), a.GetFloat("eps", 1e-5));
        return {r.output, r.running_mean, r.running_var};
      },
      /*optional_inputs=*/4, /*num_outputs=*/3));
  registry.Add(Schema(
      "group_norm", "group normalization of [N, C, ...] in num_groups groups of channels",
      {"input", "weight", "bias"},
      {{"num_groups", AttrType::kInt, true, "the number of groups, dividing C"},
       {"eps", AttrType::kFloat, false, "added to the variance; default 1e-5"}},
      kFloating,
      [](const TensorList& in, const Attrs& a) -> TensorList {
        return {group_norm(in[0], a.GetInt("num_groups"), OptionalInput(in, 1),
                           OptionalInput(in, 2), a.GetFloat("eps", 1e-5))};
      },
      /*optional_inputs=*/2));
  registry.Add(Schema(
      "dropout", "input * mask / (1 - p), the bool mask drawn from seed; outputs (output, mask)",
      {"input"},
      {{"p", AttrType::kFloat, false, "the probability of dropping an element; default 0.5"},
       {"training", AttrType::kBool, false, "drop only when true; default true"},
       {"seed", AttrType::kInt, false,
        "seed of the mask (same seed, shape and p: same mask); default 0"}},
      kFloating,
      [](const TensorList& in, const Attrs& a) -> TensorList {
        auto [output, mask] = dropout(in[0], a.GetFloat("p", 0.5), a.GetBool("training", true),
                                      static_cast<uint64_t>(a.GetInt("seed", 0)));
        return {output, mask};
      },
      0, /*num_outputs=*/2));
  registry.Add(Schema(
      "scaled_dot_product_attention",
      "softmax(query @ key^T * scale + mask) @ value; bool masks keep where true",
      {"query", "key", "value", "attn_mask"},
      {{"dropout_p", AttrType::kFloat, false, "only 0 (the default) is supported"},
       {"is_causal", AttrType::kBool, false, "mask the keys after each query; default false"},
       {"scale", AttrType::kFloat, false, "default 1 / sqrt(E)"}},
      kAll,
      [](const TensorList& in, const Attrs& a) -> TensorList {
        std::optional<double> scale;
        if (a.has("scale")) scale = a.GetFloat("scale");
        return {scaled_dot_product_attention(in[0], in[1], in[2], OptionalInput(in, 3),
                                             a.GetFloat("dropout_p", 0),
                                             a.GetBool("is_causal", false), scale)};
      },
      /*optional_inputs=*/1));
}

}  // namespace

void RegisterModelOps(OpRegistry& registry) {
  RegisterActivations(registry);
  RegisterComparisons(registry);
  RegisterStatistics(registry);
  RegisterLinear(registry);
  RegisterIndexing(registry);
  RegisterLayers(registry);
}

}  // namespace gradserve::ops
