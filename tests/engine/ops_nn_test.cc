#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "engine/autograd/autograd.h"
#include "engine/autograd/node.h"
#include "engine/ops/nn.h"
#include "engine/ops/op_registry.h"
#include "engine/ops/reductions.h"
#include "engine/tensor/tensor.h"
#include "gtest/gtest.h"
#include "tests/engine/gradcheck.h"
#include "tests/engine/op_test_util.h"

namespace gradserve::ops {
namespace {

using ::gradserve::testing::GradCheck;
using ::gradserve::testing::GradCheckOptions;
using ::gradserve::testing::GradGradCheck;
using ::gradserve::testing::RandomInput;
using ::gradserve::testing::TensorFn;
using ::gradserve::testing::op_test::ExpectInvalid;
using ::gradserve::testing::op_test::F64;
using ::gradserve::testing::op_test::I64;
using ::gradserve::testing::op_test::ShapeOf;
using ::gradserve::testing::op_test::Values;
using S = std::vector<int64_t>;
using V = std::vector<double>;

Tensor Leaf(const S& shape, uint32_t seed) { return RandomInput(shape, seed); }
Tensor Constant(const S& shape, uint32_t seed) {
  return RandomInput(shape, seed, -1, 1, /*requires_grad=*/false);
}
std::string NodeName(const Tensor& t) { return t.grad_fn() ? t.grad_fn()->name() : "none"; }

// The shared ExpectNear at this file's tolerance.
void ExpectNear(const Tensor& t, const V& expected, double tol = 1e-7) {
  ::gradserve::testing::op_test::ExpectNear(t, expected, tol);
}

void CheckGrads(const std::string& what, const TensorFn& fn, const TensorList& inputs,
                const GradCheckOptions& options = {}) {
  SCOPED_TRACE(what);
  EXPECT_TRUE(GradCheck(fn, inputs, options));
  EXPECT_TRUE(GradGradCheck(fn, inputs, options));
}

// The gradients of sum(fn(inputs) * seed) w.r.t. inputs, computed once without create_graph
// (the fused kernels) and once with it (the differentiable formulas): they must agree.
void ExpectBackwardPathsAgree(const TensorFn& fn, const TensorList& inputs) {
  TensorList results[2];
  for (int create_graph = 0; create_graph < 2; ++create_graph) {
    TensorList outs = fn(inputs);
    autograd::BackwardOptions options;
    options.create_graph = create_graph == 1;
    Tensor seed = Constant(ShapeOf(outs[0]), 99);
    absl::StatusOr<TensorList> grads = autograd::Grad({outs[0]}, {seed}, inputs, options);
    ASSERT_TRUE(grads.ok()) << grads.status();
    results[create_graph] = *grads;
  }
  for (size_t i = 0; i < inputs.size(); ++i)
    ExpectNear(results[0][i], Values(results[1][i]), 1e-12);
}

// Note [Gradients PyTorch computes in one function]: the create_graph gradients of sum(out)
// w.r.t. wrt all require grad, with grad_fn `name` since none depends on an input that
// requires grad, and equal those without create_graph. Differentiating one again gives what
// PyTorch gives: no gradient (None) with allow_unused, zeros with materialize_grads, and
// without either an error that names the input as unused.
void ExpectGradientsOfOneFunction(const Tensor& out, const TensorList& wrt,
                                  const std::string& name) {
  autograd::BackwardOptions create;
  create.create_graph = true;
  create.retain_graph = true;
  absl::StatusOr<TensorList> grads = autograd::Grad({sum(out)}, {}, wrt, create);
  ASSERT_TRUE(grads.ok()) << grads.status();
  absl::StatusOr<TensorList> plain = autograd::Grad({sum(out)}, {}, wrt, {});
  ASSERT_TRUE(plain.ok()) << plain.status();
  for (size_t i = 0; i < wrt.size(); ++i) {
    SCOPED_TRACE(i);
    const Tensor& grad = (*grads)[i];
    EXPECT_TRUE(grad.requires_grad());
    EXPECT_EQ(NodeName(grad), name);
    ExpectNear(grad, Values((*plain)[i]), 1e-12);

    autograd::BackwardOptions unused;
    unused.allow_unused = true;
    unused.retain_graph = true;
    absl::StatusOr<TensorList> again = autograd::Grad({sum(grad)}, {}, wrt, unused);
    ASSERT_TRUE(again.ok()) << again.status();
    for (const Tensor& g : *again) EXPECT_FALSE(g.defined());

    autograd::BackwardOptions zeros;
    zeros.materialize_grads = true;
    zeros.retain_graph = true;
    again = autograd::Grad({sum(grad)}, {}, wrt, zeros);
    ASSERT_TRUE(again.ok()) << again.status();
    for (size_t k = 0; k < wrt.size(); ++k) {
      ExpectNear((*again)[k], V(static_cast<size_t>(wrt[k].numel()), 0.0));
    }

    autograd::BackwardOptions strict;
    strict.retain_graph = true;
    again = autograd::Grad({sum(grad)}, {}, wrt, strict);
    EXPECT_EQ(again.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(again.status().message().find("was not used to compute the roots"), std::string::npos)
        << again.status();
  }
}

// --- softmax, log_softmax ---

TEST(SoftmaxTest, Values) {
  ExpectNear(softmax(F64({1, 2, 3}, {3}), 0),
             {0.09003057317038046, 0.24472847105479764, 0.6652409557748219});
  ExpectNear(log_softmax(F64({1, 2, 3}, {3}), -1),
             {-2.4076059644443806, -1.4076059644443806, -0.4076059644443806});
  ExpectNear(softmax(F64({1, 2, 1, 4}, {2, 2}), 0),
             {0.5, 1 / (1 + std::exp(2.0)), 0.5, 1 / (1 + std::exp(-2.0))});
  ExpectNear(softmax(F64({1000, 1000}, {2}), 0), {0.5, 0.5});
  ExpectNear(log_softmax(F64({-1000, 0}, {2}), 0), {-1000, 0});
  ExpectNear(softmax(Tensor::Scalar(3, DType::kFloat64), 0), {1});
  EXPECT_EQ(ShapeOf(softmax(F64({}, {0, 3}), 1)), S({0, 3}));
  Tensor f32 = softmax(Tensor::FromVector<float>({1, 2, 3}, {3}), 0);
  EXPECT_EQ(f32.dtype(), DType::kFloat32);
  ExpectNear(f32, {0.09003057317038046, 0.24472847105479764, 0.6652409557748219}, 1e-6);
}

TEST(SoftmaxTest, Gradients) {
  for (bool log : {false, true}) {
    auto op = [log](int64_t dim) -> TensorFn {
      return [log, dim](const TensorList& x) {
        return TensorList{log ? log_softmax(x[0], dim) : softmax(x[0], dim)};
      };
    };
    const std::string name = log ? "log_softmax" : "softmax";
    CheckGrads(name + " [3]", op(0), {Leaf({3}, 1)});
    CheckGrads(name + " [2, 3] dim 0", op(0), {Leaf({2, 3}, 2)});
    CheckGrads(name + " [2, 3, 2] dim 1", op(1), {Leaf({2, 3, 2}, 3)});
    CheckGrads(name + " 0-d", op(0), {Leaf({}, 4)});
    CheckGrads(name + " [2, 1]", op(1), {Leaf({2, 1}, 5)});
    CheckGrads(name + " [0, 3]", op(1), {Leaf({0, 3}, 6)});
    ExpectBackwardPathsAgree(op(1), {Leaf({2, 3, 2}, 7)});
    EXPECT_EQ(NodeName(op(0)({Leaf({2}, 8)})[0]), log ? "LogSoftmaxBackward0" : "SoftmaxBackward0");
  }
}

TEST(SoftmaxTest, Errors) {
  ExpectInvalid([] { softmax(I64({1, 2}, {2}), 0); }, {"softmax", "input", "int64"});
  ExpectInvalid([] { log_softmax(F64({1, 2}, {2}), 1); }, {"log_softmax", "dim = 1", "[2]"});
}

// --- cross_entropy, nll_loss ---

TEST(CrossEntropyTest, Values) {
  Tensor logits = F64({1, 2, 3, 1, 1, 1}, {2, 3});
  Tensor target = I64({2, 0}, {2});
  const double l0 = 0.4076059644443806, l1 = std::log(3.0);
  ExpectNear(cross_entropy(logits, target), {(l0 + l1) / 2});
  ExpectNear(cross_entropy(logits, target, Reduction::kSum), {l0 + l1});
  ExpectNear(cross_entropy(logits, target, Reduction::kNone), {l0, l1});
  ExpectNear(cross_entropy(logits, I64({2, 1}, {2}), Reduction::kMean, /*ignore_index=*/1), {l0});
  ExpectNear(cross_entropy(logits, I64({-100, -100}, {2})), {std::nan("")});
  ExpectNear(cross_entropy(logits, I64({-100, -100}, {2}), Reduction::kNone), {0, 0});
  // label_smoothing 0.1: 0.9 * nll + 0.1 * mean over classes of -log p.
  ExpectNear(cross_entropy(logits, target, Reduction::kMean, -100, 0.1),
             {(0.9 * l0 + 0.1 * 1.4076059644443806 + l1) / 2});
  // Unbatched and spatial inputs.
  ExpectNear(cross_entropy(F64({1, 2, 3}, {3}), I64({2}, {})), {l0});
  Tensor spatial = F64({1, 1, 2, 1, 3, 1}, {1, 3, 2});  // [N=1, C=3, d=2]
  ExpectNear(cross_entropy(spatial, I64({2, 1}, {1, 2}), Reduction::kNone), {l0, l1});
  ExpectNear(nll_loss(F64({-1, -2, -3, -4}, {2, 2}), I64({1, 0}, {2}), Reduction::kSum), {5});
}

TEST(CrossEntropyTest, Gradients) {
  const Tensor target = I64({2, 0, 3}, {3});
  for (Reduction r : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
    CheckGrads("cross_entropy",
               [&](const TensorList& x) { return TensorList{cross_entropy(x[0], target, r)}; },
               {Leaf({3, 4}, 1)});
  }
  CheckGrads("cross_entropy ignore_index",
             [&](const TensorList& x) {
               return TensorList{cross_entropy(x[0], target, Reduction::kMean, /*ignore_index=*/0)};
             },
             {Leaf({3, 4}, 2)});
  CheckGrads("cross_entropy label_smoothing",
             [&](const TensorList& x) {
               return TensorList{cross_entropy(x[0], target, Reduction::kMean, 0, 0.2)};
             },
             {Leaf({3, 4}, 3)});
  CheckGrads("cross_entropy unbatched",
             [](const TensorList& x) { return TensorList{cross_entropy(x[0], I64({1}, {}))}; },
             {Leaf({3}, 4)});
  CheckGrads("cross_entropy spatial",
             [](const TensorList& x) {
               return TensorList{cross_entropy(x[0], I64({0, 2, 1, 1}, {2, 2}), Reduction::kSum)};
             },
             {Leaf({2, 3, 2}, 5)});
  CheckGrads("cross_entropy empty batch",
             [](const TensorList& x) {
               return TensorList{cross_entropy(x[0], I64({}, {0}), Reduction::kSum)};
             },
             {Leaf({0, 3}, 6)});
  CheckGrads("nll_loss", [&](const TensorList& x) { return TensorList{nll_loss(x[0], target)}; },
             {Leaf({3, 4}, 7)});
  EXPECT_EQ(NodeName(cross_entropy(Leaf({3, 4}, 8), target)), "NllLossBackward0");
  EXPECT_EQ(NodeName(log_softmax(Leaf({3, 4}, 8), 1)), "LogSoftmaxBackward0");
}

// Class weights, with values from PyTorch 1.13 (F.cross_entropy(..., weight=w)).
TEST(CrossEntropyTest, ClassWeights) {
  const Tensor logits = F64({1, 2, 3, 1, 1, 1, 0, -1, 2}, {3, 3});
  const Tensor target = I64({2, 0, 1}, {3});
  const Tensor w = F64({0.5, 2, 1.5}, {3});
  ExpectNear(cross_entropy(logits, target, Reduction::kNone, -100, 0, w),
             {0.6114089466665706, 0.5493061443340549, 6.339692039112571});
  ExpectNear(cross_entropy(logits, target, Reduction::kMean, -100, 0, w), {1.8751017825282992});
  ExpectNear(cross_entropy(logits, target, Reduction::kSum, -100, 0, w), {7.500407130113197});
  ExpectNear(cross_entropy(logits, target, Reduction::kMean, 0, 0, w), {1.986028853079755});
  ExpectNear(cross_entropy(logits, target, Reduction::kMean, -100, 0.2, w), {1.7784857108672245});
  ExpectNear(cross_entropy(logits, target, Reduction::kNone, -100, 0.2, w),
             {0.7978220811850913, 0.7324081924454066, 5.583712569838401});
  ExpectNear(nll_loss(log_softmax(logits, 1), target, Reduction::kSum, -100, w),
             {7.500407130113197});
  const Tensor spatial = F64({1, 2, 3, 4, 0, 1}, {1, 3, 2});
  ExpectNear(cross_entropy(spatial, I64({2, 1}, {1, 2}), Reduction::kMean, -100, 0.1, w),
             {1.4277068286144694});
  // "mean" over targets whose weights sum to 0 is 0 / 0, as in PyTorch.
  ExpectNear(
      cross_entropy(logits, I64({0, 0, 0}, {3}), Reduction::kMean, -100, 0, F64({0, 1, 1}, {3})),
      {std::nan("")});

  // A class of weight 0 still multiplies: at a log-probability of -inf it gives NaN, as
  // PyTorch's -(-inf) * 0; an ignored position gives 0 whatever its log-probability (values
  // from PyTorch 1.13's F.nll_loss).
  const double inf = std::numeric_limits<double>::infinity();
  const Tensor log_probs = F64({-inf, -1, -2, -0.5, -inf, -3}, {2, 3});
  const Tensor zero_first = F64({0, 1, 1}, {3});
  const Tensor target02 = I64({0, 2}, {2});
  ExpectNear(nll_loss(log_probs, target02, Reduction::kNone, -100, zero_first), {std::nan(""), 3});
  ExpectNear(nll_loss(log_probs, target02, Reduction::kSum, -100, zero_first), {std::nan("")});
  ExpectNear(nll_loss(log_probs, target02, Reduction::kMean, -100, zero_first), {std::nan("")});
  ExpectNear(nll_loss(log_probs, target02, Reduction::kNone, /*ignore_index=*/0), {0, 3});
  ExpectNear(nll_loss(log_probs, target02, Reduction::kSum, /*ignore_index=*/0), {3});

  for (double smoothing : {0.0, 0.3}) {
    for (Reduction r : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
      auto fn = [&](const TensorList& x) {
        return TensorList{cross_entropy(x[0], I64({2, 0, 1, 1}, {4}), r, 1, smoothing, w)};
      };
      CheckGrads("cross_entropy with class weights", fn, {Leaf({4, 3}, 20)});
      ExpectBackwardPathsAgree(fn, {Leaf({4, 3}, 21)});
    }
  }
  CheckGrads(
      "nll_loss with class weights, spatial",
      [&](const TensorList& x) {
        return TensorList{nll_loss(x[0], I64({0, 2, 1, 1}, {1, 2, 2}), Reduction::kMean, -100, w)};
      },
      {Leaf({1, 3, 2, 2}, 22)});

  ExpectInvalid(
      [&] {
        cross_entropy(logits, target, Reduction::kMean, -100, 0, F64({1, 2}, {2}));
      },
      {"cross_entropy", "weight has shape [2]", "3 classes", "shape [3]"});
  ExpectInvalid(
      [&] {
        nll_loss(logits, target, Reduction::kMean, -100, Tensor::FromVector<float>({1, 2, 3}, {3}));
      },
      {"nll_loss", "weight", "float32", "input"});
  ExpectInvalid([&] { cross_entropy(logits, target, Reduction::kMean, -100, 0, Leaf({3}, 23)); },
                {"cross_entropy", "weight requires grad", "not differentiable"});
}

// Class probabilities as the target, with values from PyTorch 1.13.
TEST(CrossEntropyTest, ClassProbabilities) {
  const Tensor logits = F64({1, 2, 3, 1, 1, 1}, {2, 3});
  const Tensor probs = F64({0.2, 0.3, 0.5, 1, 0, 0}, {2, 3});
  const Tensor w = F64({0.5, 2, 1.5}, {3});
  ExpectNear(cross_entropy(logits, probs), {1.1031091265562452});
  ExpectNear(cross_entropy(logits, probs, Reduction::kNone),
             {1.1076059644443805, 1.0986122886681098});
  ExpectNear(cross_entropy(logits, probs, Reduction::kSum), {2.2062182531124903});
  ExpectNear(cross_entropy(logits, probs, Reduction::kMean, -100, 0.3, w), {1.1303608280949402});
  ExpectNear(cross_entropy(logits, probs, Reduction::kNone, -100, 0, w),
             {1.3910286484443515, 0.5493061443340549});
  ExpectNear(cross_entropy(F64({1, 2, 3}, {3}), F64({0.2, 0.3, 0.5}, {3})), {1.1076059644443805});
  EXPECT_TRUE(std::isnan(Values(cross_entropy(F64({}, {0, 3}), F64({}, {0, 3})))[0]));

  // Differentiable with respect to the input, the target and the weight.
  for (Reduction r : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
    CheckGrads("cross_entropy with probabilities",
               [r](const TensorList& x) {
                 return TensorList{cross_entropy(x[0], x[1], r, -100, 0.2, x[2])};
               },
               {Leaf({2, 3, 2}, 30), Leaf({2, 3, 2}, 31), Leaf({3}, 32)});
  }

  ExpectInvalid(
      [&] {
        cross_entropy(logits, F64({0.5, 0.5}, {1, 2}));
      },
      {"cross_entropy", "floating target", "input's shape [2, 3]", "got [1, 2]"});
  ExpectInvalid([&] { cross_entropy(logits, probs, Reduction::kMean, 1); },
                {"cross_entropy", "ignore_index = 1", "not supported"});
  ExpectInvalid([&] { cross_entropy(logits, probs, Reduction::kMean, -100, 0, F64({1}, {1})); },
                {"cross_entropy", "weight has shape [1]"});
}

TEST(CrossEntropyTest, Errors) {
  Tensor logits = F64({1, 2, 3, 1, 1, 1}, {2, 3});
  ExpectInvalid(
      [&] {
        cross_entropy(logits, I64({2, 3}, {2}));
      },
      {"cross_entropy", "target[1] = 3", "3 classes", "[2, 3]"});
  ExpectInvalid([&] { cross_entropy(logits, I64({-1, 0}, {2})); }, {"target[0] = -1"});
  ExpectInvalid(
      [&] {
        cross_entropy(logits, F64({2, 0}, {2}));
      },
      {"floating target", "class probabilities", "int64 target"});
  ExpectInvalid([&] { nll_loss(logits, F64({2, 0}, {2})); }, {"target must be int64"});
  ExpectInvalid([&] { cross_entropy(logits, I64({2}, {1})); },
                {"target has shape [1]", "needs target shape [2]"});
  ExpectInvalid([&] { cross_entropy(Tensor::Scalar(1, DType::kFloat64), I64({0}, {})); },
                {"class dimension"});
  ExpectInvalid(
      [&] {
        cross_entropy(logits, I64({0, 0}, {2}), Reduction::kMean, -100, 1.5);
      },
      {"label_smoothing = 1.5"});
  ExpectInvalid([] { ParseReduction("mse_loss", "avg"); }, {"mse_loss", "'avg'"});
}

// --- mse_loss ---

TEST(MseLossTest, ValuesAndGradients) {
  Tensor x = F64({1, 2, 3}, {3});
  Tensor t = F64({1, 1, 1}, {3});
  ExpectNear(mse_loss(x, t, Reduction::kNone), {0, 1, 4});
  ExpectNear(mse_loss(x, t, Reduction::kSum), {5});
  ExpectNear(mse_loss(x, t), {5.0 / 3});
  ExpectNear(mse_loss(x, F64({1}, {})), {5.0 / 3});
  EXPECT_TRUE(std::isnan(Values(mse_loss(F64({}, {0}), F64({}, {0})))[0]));
  for (Reduction r : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
    auto fn = [r](const TensorList& x) { return TensorList{mse_loss(x[0], x[1], r)}; };
    CheckGrads("mse_loss", fn, {Leaf({2, 3}, 1), Leaf({2, 3}, 2)});
    CheckGrads("mse_loss broadcast", fn, {Leaf({2, 3}, 3), Leaf({3}, 4)});
    CheckGrads("mse_loss 0-d", fn, {Leaf({}, 5), Constant({}, 6)});
    ExpectBackwardPathsAgree(fn, {Leaf({2, 3}, 7), Leaf({2, 1}, 8)});
  }
  CheckGrads("mse_loss empty",
             [](const TensorList& x) { return TensorList{mse_loss(x[0], x[1], Reduction::kSum)}; },
             {Leaf({0, 2}, 9), Leaf({0, 2}, 10)});
  EXPECT_EQ(NodeName(mse_loss(Leaf({2}, 11), Constant({2}, 12))), "MseLossBackward0");
  ExpectInvalid([&] { mse_loss(x, F64({1, 2}, {2})); }, {"[3]", "[2]", "broadcast"});
  // Note [mse_loss promotes]: to promote_types of the two, as PyTorch after broadcasting.
  EXPECT_EQ(mse_loss(x, Tensor::FromVector<float>({1, 2, 3}, {3})).dtype(), x.dtype());
  EXPECT_EQ(mse_loss(x, I64({1, 2, 3}, {3})).dtype(), x.dtype());
  EXPECT_EQ(
      mse_loss(Tensor::FromVector<float>({1, 2}, {2}), Tensor::Scalar(1, DType::kFloat64)).dtype(),
      DType::kFloat64);
  ExpectInvalid(
      [&] {
        mse_loss(I64({1, 2}, {2}), I64({1, 2}, {2}));
      },
      {"mse_loss", "promote to int64", "needs a floating dtype"});
}

// --- layer_norm ---

TEST(LayerNormTest, Values) {
  const double s = 1 / std::sqrt(2.0 / 3 + 1e-5);
  ExpectNear(layer_norm(F64({1, 2, 3}, {1, 3}), {3}), {-s, 0, s});
  ExpectNear(
      layer_norm(F64({1, 2, 3, 4, 5, 6}, {2, 3}), {3}, F64({1, 2, 3}, {3}), F64({0, 1, 0}, {3}), 0),
      {-std::sqrt(1.5), 1, 3 * std::sqrt(1.5), -std::sqrt(1.5), 1, 3 * std::sqrt(1.5)});
  Tensor x = F64({1, 2, 3, 4}, {2, 2});
  ExpectNear(layer_norm(x, {2, 2}), Values(layer_norm(F64({1, 2, 3, 4}, {4}), {4})));
}

TEST(LayerNormTest, Gradients) {
  GradCheckOptions loose;
  loose.atol = 1e-4;
  auto with_affine = [](const TensorList& x) {
    return TensorList{layer_norm(x[0], {3}, x[1], x[2], 1e-5)};
  };
  CheckGrads("layer_norm affine", with_affine, {Leaf({2, 3}, 1), Leaf({3}, 2), Leaf({3}, 3)},
             loose);
  CheckGrads(
      "layer_norm plain",
      [](const TensorList& x) {
        return TensorList{layer_norm(x[0], {2, 3})};
      },
      {Leaf({2, 2, 3}, 4)}, loose);
  CheckGrads(
      "layer_norm weight only",
      [](const TensorList& x) { return TensorList{layer_norm(x[0], {2}, x[1])}; },
      {Leaf({3, 2}, 5), Leaf({2}, 6)}, loose);
  CheckGrads(
      "layer_norm 1-d", [](const TensorList& x) { return TensorList{layer_norm(x[0], {4})}; },
      {Leaf({4}, 7)}, loose);
  CheckGrads("layer_norm empty batch", with_affine, {Leaf({0, 3}, 8), Leaf({3}, 9), Leaf({3}, 10)},
             loose);
  ExpectBackwardPathsAgree(with_affine, {Leaf({4, 3}, 11), Leaf({3}, 12), Leaf({3}, 13)});
  EXPECT_EQ(NodeName(layer_norm(Leaf({2, 3}, 14), {3})), "NativeLayerNormBackward0");
}

TEST(LayerNormTest, CreateGraphGradientsOfAConstantInputRequireGrad) {
  const Tensor w = Leaf({3}, 2), b = Leaf({3}, 3);
  ExpectGradientsOfOneFunction(layer_norm(Constant({2, 3}, 1), {3}, w, b, 1e-5), {w, b},
                               "NativeLayerNormBackwardBackward0");
  ExpectGradientsOfOneFunction(layer_norm(Constant({2, 3}, 4), {3}, Constant({3}, 5), b, 1e-5), {b},
                               "NativeLayerNormBackwardBackward0");
}

// Note [layer_norm's statistics in float64]: float32 gradients of a row far from 0 (values near
// -100 that differ by 1.5) with weights near -100 stay within a few float32 ulps of float64's
// on both backward paths. The row of diff_fuzz.py seed 202446368 graph 298: with float32
// statistics the input's gradient was 5.6e-4 off relative (PyTorch's 1e-4).
TEST(LayerNormTest, Float32GradientsOfAShiftedRowAsFloat64s) {
  const Tensor x = F64({-101.454636, -101.131966, -100.36773, -99.867065}, {4});
  const Tensor w = F64({-100.47441, -99.95641, -98.78681, -101.39226}, {4});
  auto grads = [&](DType dtype, bool create_graph) {
    Tensor xd = x.To(DType::kFloat32).To(dtype), wd = w.To(DType::kFloat32).To(dtype);
    xd.set_requires_grad(true);
    wd.set_requires_grad(true);
    autograd::BackwardOptions options;
    options.create_graph = create_graph;
    absl::StatusOr<TensorList> g =
        autograd::Grad({layer_norm(xd, {4}, wd, Tensor(), 1e-5)}, {Tensor::Full({4}, 0.25, dtype)},
                       {xd, wd}, options);
    EXPECT_TRUE(g.ok()) << g.status();
    return g.ok() ? *g : TensorList(2);
  };
  const TensorList ref = grads(DType::kFloat64, false);
  for (bool create_graph : {false, true}) {
    SCOPED_TRACE(create_graph ? "create_graph" : "fused");
    const TensorList got = grads(DType::kFloat32, create_graph);
    for (size_t i = 0; i < 2; ++i) {
      const V r = Values(ref[i]), v = Values(got[i]);
      double scale = 0, error = 0;
      for (size_t k = 0; k < r.size(); ++k) {
        scale = std::max(scale, std::abs(r[k]));
        error = std::max(error, std::abs(v[k] - r[k]));
      }
      EXPECT_LE(error / scale, 3e-7) << "gradient " << i;
    }
  }
}

TEST(LayerNormTest, Errors) {
  Tensor x = F64({1, 2, 3, 4, 5, 6}, {2, 3});
  ExpectInvalid([&] { layer_norm(x, {2}); },
                {"layer_norm", "normalized_shape [2]", "trailing", "[2, 3]"});
  ExpectInvalid([&] { layer_norm(x, {}); }, {"at least one dimension"});
  ExpectInvalid(
      [&] {
        layer_norm(x, {3}, F64({1, 1}, {2}));
      },
      {"weight has shape [2]", "normalized_shape is [3]"});
  ExpectInvalid([&] { layer_norm(x, {3}, Tensor(), I64({1, 1, 1}, {3})); }, {"bias", "int64"});
}

// --- embedding ---

TEST(EmbeddingTest, ValuesAndGradients) {
  Tensor w = F64({1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor e = embedding(w, I64({2, 0}, {1, 2}));
  EXPECT_EQ(ShapeOf(e), S({1, 2, 2}));
  ExpectNear(e, {5, 6, 1, 2});
  EXPECT_EQ(ShapeOf(embedding(w, I64({1}, {}))), S({2}));
  EXPECT_EQ(ShapeOf(embedding(w, I64({}, {0, 4}))), S({0, 4, 2}));
  const Tensor idx = I64({0, 2, 2, 1, 0, 2}, {2, 3});
  CheckGrads("embedding", [&](const TensorList& x) { return TensorList{embedding(x[0], idx)}; },
             {Leaf({3, 2}, 1)});
  // With padding_idx the first derivative deliberately differs from finite differences (the
  // padding row gets none), so only its own derivative is checked.
  EXPECT_TRUE(
      GradGradCheck([&](const TensorList& x) { return TensorList{embedding(x[0], idx, -1)}; },
                    {Leaf({3, 2}, 2)}));
  // The padding row reads normally but gets no gradient.
  Tensor weight = Leaf({3, 2}, 3);
  Tensor out = embedding(weight, idx, /*padding_idx=*/2);
  EXPECT_EQ(Values(out)[2], Values(weight)[4]);  // out[0][1] is row 2
  EXPECT_EQ(Values(out)[3], Values(weight)[5]);
  ASSERT_TRUE(autograd::Backward({sum(out)}, {Tensor()}, {}, {}).ok());
  ExpectNear(weight.grad(), {2, 2, 1, 1, 0, 0});
  EXPECT_EQ(NodeName(out), "EmbeddingBackward0");
  ExpectInvalid([&] { embedding(w, I64({0, 3}, {2})); }, {"embedding", "indices[1] = 3", "[3, 2]"});
  ExpectInvalid([&] { embedding(w, I64({0}, {1}), 3); }, {"padding_idx = 3"});
  ExpectInvalid([&] { embedding(F64({1}, {1}), I64({0}, {1})); }, {"2-d", "[1]"});
  ExpectInvalid([&] { embedding(w, F64({0}, {1})); }, {"indices must be int64"});
}

// --- conv2d ---

// A direct, loop-by-loop conv2d for the expected values.
Tensor NaiveConv2d(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dOptions& o) {
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), wd = x.size(3);
  const int64_t oc = w.size(0), cg = w.size(1), kh = w.size(2), kw = w.size(3);
  const int64_t oh = (h + 2 * o.padding[0] - o.dilation[0] * (kh - 1) - 1) / o.stride[0] + 1;
  const int64_t ow = (wd + 2 * o.padding[1] - o.dilation[1] * (kw - 1) - 1) / o.stride[1] + 1;
  const V xv = Values(x), wv = Values(w), bv = b.defined() ? Values(b) : V(oc, 0);
  V out(n * oc * oh * ow, 0);
  const int64_t per_group = oc / o.groups;
  for (int64_t in = 0; in < n; ++in) {
    for (int64_t o_ = 0; o_ < oc; ++o_) {
      const int64_t g = o_ / per_group;
      for (int64_t y = 0; y < oh; ++y) {
        for (int64_t z = 0; z < ow; ++z) {
          double acc = bv[o_];
          for (int64_t ci = 0; ci < cg; ++ci) {
            for (int64_t i = 0; i < kh; ++i) {
              for (int64_t j = 0; j < kw; ++j) {
                const int64_t hh = y * o.stride[0] - o.padding[0] + i * o.dilation[0];
                const int64_t ww = z * o.stride[1] - o.padding[1] + j * o.dilation[1];
                if (hh < 0 || hh >= h || ww < 0 || ww >= wd) continue;
                acc += xv[((in * c + g * cg + ci) * h + hh) * wd + ww] *
                       wv[((o_ * cg + ci) * kh + i) * kw + j];
              }
            }
          }
          out[((in * oc + o_) * oh + y) * ow + z] = acc;
        }
      }
    }
  }
  return F64(out, {n, oc, oh, ow});
}

Conv2dOptions Options(std::array<int64_t, 2> stride, std::array<int64_t, 2> padding,
                      std::array<int64_t, 2> dilation, int64_t groups) {
  Conv2dOptions o;
  o.stride = stride;
  o.padding = padding;
  o.dilation = dilation;
  o.groups = groups;
  return o;
}

TEST(Conv2dTest, Values) {
  Tensor x = F64({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3});
  ExpectNear(conv2d(x, Tensor::Full({1, 1, 2, 2}, 1, DType::kFloat64)), {12, 16, 24, 28});
  ExpectNear(conv2d(x, Tensor::Full({1, 1, 2, 2}, 1, DType::kFloat64), F64({1}, {1}),
                    Options({2, 2}, {1, 1}, {1, 1}, 1)),
             {2, 6, 12, 29});
  for (const Conv2dOptions& o :
       {Options({1, 1}, {0, 0}, {1, 1}, 1), Options({2, 1}, {1, 0}, {1, 2}, 2),
        Options({1, 3}, {2, 1}, {2, 1}, 1), Options({3, 2}, {0, 2}, {1, 1}, 4)}) {
    Tensor input = Constant({2, 4, 6, 7}, 1);
    Tensor weight = Constant({4, 4 / o.groups, 2, 3}, 2);
    Tensor bias = Constant({4}, 3);
    ExpectNear(conv2d(input, weight, bias, o), Values(NaiveConv2d(input, weight, bias, o)), 1e-12);
  }
  Tensor unbatched = conv2d(Constant({2, 4, 4}, 4), Constant({3, 2, 3, 3}, 5));
  EXPECT_EQ(ShapeOf(unbatched), S({3, 2, 2}));
  EXPECT_EQ(ShapeOf(conv2d(Constant({0, 2, 4, 4}, 6), Constant({3, 2, 3, 3}, 7))), S({0, 3, 2, 2}));
  Tensor f32 = conv2d(x.To(DType::kFloat32), Tensor::Full({1, 1, 2, 2}, 1, DType::kFloat32));
  EXPECT_EQ(f32.dtype(), DType::kFloat32);
  ExpectNear(f32, {12, 16, 24, 28});
}

TEST(Conv2dTest, Gradients) {
  const Conv2dOptions strided = Options({2, 1}, {1, 0}, {1, 2}, 2);
  auto fn = [](const Conv2dOptions& o) -> TensorFn {
    return [o](const TensorList& x) { return TensorList{conv2d(x[0], x[1], x[2], o)}; };
  };
  CheckGrads("conv2d plain", fn(Conv2dOptions()),
             {Leaf({2, 2, 3, 3}, 1), Leaf({2, 2, 2, 2}, 2), Leaf({2}, 3)});
  CheckGrads("conv2d strided, padded, dilated, grouped", fn(strided),
             {Leaf({1, 2, 4, 5}, 4), Leaf({2, 1, 2, 2}, 5), Leaf({2}, 6)});
  CheckGrads("conv2d without bias",
             [](const TensorList& x) { return TensorList{conv2d(x[0], x[1])}; },
             {Leaf({1, 1, 3, 3}, 7), Leaf({1, 1, 2, 2}, 8)});
  CheckGrads("conv2d unbatched", [](const TensorList& x) { return TensorList{conv2d(x[0], x[1])}; },
             {Leaf({1, 3, 3}, 9), Leaf({2, 1, 2, 2}, 10)});
  CheckGrads("conv2d empty batch", fn(Conv2dOptions()),
             {Leaf({0, 1, 3, 3}, 11), Leaf({1, 1, 2, 2}, 12), Leaf({1}, 13)});
  ExpectBackwardPathsAgree(fn(strided),
                           {Leaf({2, 4, 5, 6}, 14), Leaf({4, 2, 2, 3}, 15), Leaf({4}, 16)});
  EXPECT_EQ(NodeName(conv2d(Leaf({1, 1, 2, 2}, 17), Leaf({1, 1, 1, 1}, 18))),
            "ConvolutionBackward0");
}

TEST(Conv2dTest, CreateGraphGradientsOfAConstantInputRequireGrad) {
  const Tensor w = Leaf({2, 2, 2, 2}, 2), b = Leaf({2}, 3);
  ExpectGradientsOfOneFunction(conv2d(Constant({1, 2, 3, 3}, 1), w, b), {w, b},
                               "ConvolutionBackwardBackward0");
  // As in PyTorch, the bias alone is not an input of the convolution's backward: with a
  // constant input and weight, the bias's gradient does not require grad.
  autograd::BackwardOptions create;
  create.create_graph = true;
  absl::StatusOr<TensorList> grads = autograd::Grad(
      {sum(conv2d(Constant({1, 2, 3, 3}, 4), Constant({2, 2, 2, 2}, 5), b))}, {}, {b}, create);
  ASSERT_TRUE(grads.ok()) << grads.status();
  EXPECT_FALSE((*grads)[0].requires_grad());
}

// Note [conv2d over zero channels]: an input of zero channels gives an output of zero
// channels whatever the weight's out_channels, and zero gradients (the bias's of its shape);
// shapes from PyTorch 1.13. Found by diff_fuzz.py: the weight [O, 0, kH, kW] was refused.
TEST(Conv2dTest, ZeroInputChannelsAsPyTorch) {
  const Tensor x = Leaf({2, 0, 4, 4}, 1), w = Leaf({3, 0, 2, 2}, 2), b = Leaf({3}, 3);
  const Tensor y = conv2d(x, w, b);
  EXPECT_EQ(ShapeOf(y), S({2, 0, 3, 3}));
  EXPECT_EQ(NodeName(y), "ConvolutionBackward0");
  EXPECT_EQ(ShapeOf(conv2d(x, w, b, Options({2, 1}, {1, 0}, {1, 2}, 1))), S({2, 0, 3, 2}));
  EXPECT_EQ(ShapeOf(conv2d(x, Leaf({4, 0, 2, 2}, 4), Tensor(), Options({1, 1}, {0, 0}, {1, 1}, 2))),
            S({2, 0, 3, 3}));
  Conv2dOptions same;
  same.same_padding = true;
  EXPECT_EQ(ShapeOf(conv2d(x, Leaf({3, 0, 5, 5}, 5), b, same)), S({2, 0, 4, 4}));
  EXPECT_EQ(ShapeOf(conv2d(Leaf({0, 4, 4}, 6), w)), S({0, 3, 3}));
  absl::StatusOr<TensorList> grads = autograd::Grad({sum(y)}, {}, {x, w, b}, {});
  ASSERT_TRUE(grads.ok()) << grads.status();
  EXPECT_EQ(ShapeOf((*grads)[0]), S({2, 0, 4, 4}));
  EXPECT_EQ(ShapeOf((*grads)[1]), S({3, 0, 2, 2}));
  ExpectNear((*grads)[2], {0, 0, 0});
  // Under create_graph the zeros are the one function's, as PyTorch's: no second gradient.
  ExpectGradientsOfOneFunction(conv2d(x, w, b), {x, w, b}, "ConvolutionBackwardBackward0");
  // The kernel must still fit the padded input, as in PyTorch.
  ExpectInvalid([&] { conv2d(Leaf({2, 0, 1, 1}, 7), w); }, {"smaller than the kernel"});
}

// padding="same", with values from PyTorch 1.13 (F.conv2d(..., padding="same")).
TEST(Conv2dTest, SamePadding) {
  Conv2dOptions same;
  same.same_padding = true;
  const Tensor x = F64({1, 2, 0, -1, 3, 1, 2, 2, 0, -2, 1, 4}, {1, 1, 3, 4});
  const Tensor w = F64({1, -1, 2, 0.5}, {1, 1, 2, 2});
  ExpectNear(conv2d(x, w, F64({0.25}, {1}), same),
             {5.75, 5.25, 6.25, 3.25, 1.25, -4.25, 4.25, 10.25, 2.25, -2.75, -2.75, 4.25});
  Conv2dOptions dilated = same;
  dilated.dilation = {1, 2};
  ExpectNear(conv2d(x, w, Tensor(), dilated),
             {-1.5, 8.0, 6.0, 4.0, -2.0, 1.5, -3.0, 4.0, 2.0, -1.0, -6.0, 1.0});
  // An odd kernel pads symmetrically: the same as padding (k - 1) / 2.
  const Tensor x2 = Constant({2, 3, 5, 6}, 1), w3 = Constant({4, 3, 3, 5}, 2);
  ExpectNear(conv2d(x2, w3, Tensor(), same),
             Values(conv2d(x2, w3, Tensor(), Options({1, 1}, {1, 2}, {1, 1}, 1))));
  for (const S& kernel : {S{4, 3, 1, 1}, S{4, 3, 2, 3}, S{4, 3, 4, 2}}) {
    EXPECT_EQ(ShapeOf(conv2d(x2, Constant(kernel, 3), Tensor(), same)), S({2, 4, 5, 6}));
  }
  EXPECT_EQ(ShapeOf(conv2d(Constant({3, 5, 6}, 4), Constant({2, 3, 2, 2}, 5), Tensor(), same)),
            S({2, 5, 6}));

  auto fn = [](const Conv2dOptions& o) -> TensorFn {
    return [o](const TensorList& x) { return TensorList{conv2d(x[0], x[1], x[2], o)}; };
  };
  CheckGrads("conv2d same, even kernel", fn(same),
             {Leaf({1, 2, 3, 4}, 6), Leaf({2, 2, 2, 3}, 7), Leaf({2}, 8)});
  Conv2dOptions grouped = dilated;
  grouped.groups = 2;
  CheckGrads("conv2d same, dilated, grouped", fn(grouped),
             {Leaf({2, 2, 4, 5}, 9), Leaf({2, 1, 2, 2}, 10), Leaf({2}, 11)});

  Conv2dOptions strided = same;
  strided.stride = {2, 1};
  ExpectInvalid([&] { conv2d(x, w, Tensor(), strided); },
                {"conv2d", "padding='same'", "strided", "[2, 1]"});
  Conv2dOptions bad_dilation = same;
  bad_dilation.dilation = {0, 1};
  ExpectInvalid([&] { conv2d(x, w, Tensor(), bad_dilation); }, {"conv2d: dilation"});
  // Sizes past int64 are refused, not wrapped: here the padding "same" computes.
  Conv2dOptions huge = same;
  huge.dilation = {1, INT64_MAX};
  ExpectInvalid([&] { conv2d(x, w, Tensor(), huge); }, {"conv2d", "too large", "int64"});
}

TEST(Conv2dTest, Errors) {
  Tensor x = Constant({1, 2, 4, 4}, 1);
  Tensor w = Constant({4, 2, 3, 3}, 2);
  ExpectInvalid(
      [&] {
        conv2d(x, Constant({4, 3, 3, 3}, 3));
      },
      {"conv2d", "[1, 2, 4, 4]", "2 channels", "[4, 3, 3, 3]", "expects 3"});
  ExpectInvalid([&] { conv2d(x, w, Constant({3}, 4)); }, {"bias has shape [3]", "needs [4]"});
  ExpectInvalid(
      [&] {
        conv2d(x, w, Tensor(), Options({0, 1}, {0, 0}, {1, 1}, 1));
      },
      {"stride (0, 1)"});
  ExpectInvalid(
      [&] {
        conv2d(x, w, Tensor(), Options({1, 1}, {0, 0}, {3, 1}, 1));
      },
      {"smaller than the kernel"});
  // Sizes past int64 are refused, not wrapped (the attributes come from clients).
  ExpectInvalid(
      [&] {
        conv2d(x, w, Tensor(), Options({1, 1}, {int64_t{1} << 62, 0}, {1, 1}, 1));
      },
      {"conv2d: padding 4611686018427387904", "too large", "int64"});
  ExpectInvalid(
      [&] {
        conv2d(x, w, Tensor(), Options({1, 1}, {0, 0}, {1, int64_t{1} << 62}, 1));
      },
      {"conv2d: padding 0 or dilation 4611686018427387904", "too large"});
  ExpectInvalid(
      [&] {
        conv2d(x, Constant({3, 1, 3, 3}, 5), Tensor(), Options({1, 1}, {0, 0}, {1, 1}, 2));
      },
      {"out_channels = 3", "groups = 2"});
  ExpectInvalid([&] { conv2d(Constant({4, 4}, 6), w); }, {"[4, 4]"});
  ExpectInvalid([&] { conv2d(x, w.To(DType::kFloat32)); }, {"weight", "float32"});
  // As in PyTorch, fewer out_channels than groups (none included) are refused.
  ExpectInvalid(
      [&] {
        conv2d(x, Constant({0, 2, 3, 3}, 8));
      },
      {"[0, 2, 3, 3]", "out_channels = 0", "groups = 1"});
  ExpectInvalid(
      [&] {
        conv2d(x, Constant({0, 1, 3, 3}, 9), Tensor(), Options({1, 1}, {0, 0}, {1, 1}, 2));
      },
      {"out_channels = 0", "groups = 2"});
  // groups at int64's end: no weight with out_channels divisible by it fits but an empty one.
  ExpectInvalid(
      [&] {
        conv2d(x, Constant({0, 2, 3, 3}, 7), Tensor(), Options({1, 1}, {0, 0}, {1, 1}, INT64_MAX));
      },
      {"2 channels", "expects more than int64 counts"});
}

// A stride at int64's end is legal (PyTorch takes it): one output position per dim, whose
// window starts in the padding. Found by BadBytesTest under UBSan: the kernels' window bounds
// overflowed computing (a + stride - 1) / stride.
TEST(Conv2dTest, StridesNearInt64sEnd) {
  Tensor x = F64({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3});
  x.set_requires_grad(true);
  Tensor w = Tensor::Full({1, 1, 2, 2}, 1, DType::kFloat64);
  const Conv2dOptions padded = Options({INT64_MAX, INT64_MAX}, {1, 1}, {1, 1}, 1);
  Tensor y = conv2d(x, w, Tensor(), padded);
  ExpectNear(y, {1});  // the window at (-1, -1) holds x[0][0] alone
  absl::StatusOr<TensorList> g = autograd::Grad({y}, {}, {x}, {});
  ASSERT_TRUE(g.ok()) << g.status();
  ExpectNear((*g)[0], {1, 0, 0, 0, 0, 0, 0, 0, 0});
  ExpectNear(conv2d(x, w, Tensor(), Options({INT64_MAX, 1}, {0, 0}, {1, 1}, 1)), {12, 16});
  // Paddings whose output positions (out_h * out_w) pass int64: refused, not wrapped.
  ExpectInvalid(
      [&] {
        conv2d(x, w, Tensor(), Options({1, 1}, {int64_t{1} << 32, int64_t{1} << 32}, {1, 1}, 1));
      },
      {"more elements than int64 can count"});
}

// --- registry ---

TEST(NNRegistryTest, RunsOpsFromAttrs) {
  const OpRegistry& registry = OpRegistry::Get();
  for (const char* name : {"softmax", "log_softmax", "cross_entropy", "nll_loss", "mse_loss",
                           "layer_norm", "embedding", "conv2d"}) {
    EXPECT_NE(registry.Find(name), nullptr) << name;
  }
  Attrs conv;
  conv.set("stride", int64_t{2});
  conv.set("padding", std::vector<int64_t>{1, 1});
  Tensor x = F64({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3});
  Tensor ones = Tensor::Full({1, 1, 2, 2}, 1, DType::kFloat64);
  ExpectNear(registry.Find("conv2d")->run({x, ones, F64({1}, {1})}, conv)[0], {2, 6, 12, 29});
  ExpectNear(registry.Find("conv2d")->run({x, ones}, Attrs())[0], {12, 16, 24, 28});
  Attrs ln;
  ln.set("normalized_shape", std::vector<int64_t>{3});
  EXPECT_EQ(ShapeOf(registry.Find("layer_norm")->run({F64({1, 2, 3}, {3})}, ln)[0]), S({3}));
  Attrs ce;
  ce.set("reduction", std::string("sum"));
  ExpectNear(registry.Find("cross_entropy")->run({F64({1, 2, 3}, {1, 3}), I64({2}, {1})}, ce)[0],
             {0.4076059644443806});
  ce.set("reduction", std::string("avg"));
  ExpectInvalid(
      [&] {
        registry.Find("cross_entropy")->run({F64({1}, {1, 1}), I64({0}, {1})}, ce);
      },
      {"'avg'"});
  Attrs bad_pair;
  bad_pair.set("stride", std::vector<int64_t>{1, 1, 1});
  ExpectInvalid([&] { registry.Find("conv2d")->run({x, ones}, bad_pair); }, {"'stride'"});
  Attrs same, valid, bogus;
  same.set("padding", std::string("same"));
  valid.set("padding", std::string("valid"));
  bogus.set("padding", std::string("full"));
  EXPECT_EQ(ShapeOf(registry.Find("conv2d")->run({x, ones}, same)[0]), S({1, 1, 3, 3}));
  ExpectNear(registry.Find("conv2d")->run({x, ones}, valid)[0], {12, 16, 24, 28});
  ExpectInvalid(
      [&] {
        registry.Find("conv2d")->run({x, ones}, bogus);
      },
      {"conv2d", "padding = 'full'", "'valid' or 'same'"});
  Attrs mean;
  ExpectNear(
      registry.Find("cross_entropy")
          ->run({F64({1, 2, 3, 1, 1, 1}, {2, 3}), I64({2, 0}, {2}), F64({1, 3, 2}, {3})}, mean)[0],
      {(2 * 0.4076059644443806 + std::log(3.0)) / 3});
}

}  // namespace
}  // namespace gradserve::ops
