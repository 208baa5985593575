// The ops real models need (issue 28): activations.h, comparison.h, statistics.h, linear.h,
// indexing.h, pooling.h, normalization.h, dropout.h, attention.h.
// Values here are checked against hand-computed ones; tests/python/test_model_ops.py compares
// every gradient with PyTorch's.

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "engine/autograd/autograd.h"
#include "engine/device/device_registry.h"
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
#include "engine/ops/reductions.h"
#include "engine/ops/statistics.h"
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
using ::gradserve::testing::op_test::ExpectNear;
using ::gradserve::testing::op_test::F64;
using ::gradserve::testing::op_test::I64;
using ::gradserve::testing::op_test::ShapeOf;
using ::gradserve::testing::op_test::Values;
using S = std::vector<int64_t>;
using V = std::vector<double>;

Tensor Leaf(const S& shape, uint32_t seed) { return RandomInput(shape, seed); }
Tensor Bool(const std::vector<int64_t>& values, const S& shape) {
  return I64(values, shape).To(DType::kBool);
}

// First and second derivatives against finite differences.
void CheckGrads(const std::string& what, const TensorFn& fn, const TensorList& inputs) {
  SCOPED_TRACE(what);
  GradCheckOptions options;
  options.atol = 1e-4;
  EXPECT_TRUE(GradCheck(fn, inputs, options));
  EXPECT_TRUE(GradGradCheck(fn, inputs, options));
}

TensorFn Unary(Tensor (*fn)(const Tensor&)) {
  return [fn](const TensorList& x) { return TensorList{fn(x[0])}; };
}

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(ActivationsTest, Values) {
  const Tensor x = F64({-2, 0, 3}, {3});
  ExpectNear(silu(x), {-2 / (1 + std::exp(2.0)), 0, 3 / (1 + std::exp(-3.0))});
  ExpectNear(leaky_relu(x), {-0.02, 0, 3});
  ExpectNear(leaky_relu(x, 0.5), {-1, 0, 3});
  ExpectNear(elu(x), {std::exp(-2.0) - 1, 0, 3});
  ExpectNear(elu(F64({-1, 1000}, {2}), 2), {2 * (std::exp(-1.0) - 1), 1000});
  ExpectNear(erf(x), {std::erf(-2.0), 0, std::erf(3.0)});
}

TEST(ActivationsTest, Gradients) {
  CheckGrads("silu", Unary(silu), {Leaf({2, 3}, 1)});
  CheckGrads("leaky_relu", [](const TensorList& x) { return TensorList{leaky_relu(x[0], 0.2)}; },
             {Leaf({2, 3}, 2)});
  CheckGrads("elu", [](const TensorList& x) { return TensorList{elu(x[0], 1.5)}; },
             {Leaf({2, 3}, 3)});
  CheckGrads("erf", Unary(erf), {Leaf({4}, 4)});
}

TEST(ActivationsTest, GradientsAtZeroAndFarOutAsPyTorch) {
  // PyTorch: leaky_relu's gradient at 0 is the slope, elu's is alpha; elu at 1000 has
  // gradient 1, not the NaN of 0 * exp(1000).
  Tensor x = F64({0, 1000}, {2});
  x.set_requires_grad(true);
  auto grad = [&](const Tensor& y) {
    absl::StatusOr<TensorList> g = autograd::Grad({sum(y)}, {}, {x}, {});
    EXPECT_TRUE(g.ok()) << g.status();
    return (*g)[0];
  };
  ExpectNear(grad(leaky_relu(x, 0.3)), {0.3, 1});
  ExpectNear(grad(elu(x, 2)), {2, 1});
}

TEST(ActivationsTest, Errors) {
  ExpectInvalid([] { silu(I64({1}, {1})); }, {"silu", "must be floating"});
  ExpectInvalid([] { elu(I64({1}, {1})); }, {"elu", "must be floating"});
}

TEST(ComparisonTest, MaximumMinimumValues) {
  const Tensor a = F64({1, 5, kNan, 2}, {4});
  const Tensor b = F64({3, 4, 0, 2}, {4});
  ExpectNear(maximum(a, b), {3, 5, kNan, 2});
  ExpectNear(minimum(a, b), {1, 4, kNan, 2});
  ExpectNear(maximum(b, a), {3, 5, kNan, 2});
  // Broadcasting and promotion: int64 with float64 gives float64.
  const Tensor m = maximum(I64({1, 7}, {2, 1}), F64({2, 3}, {2}));
  EXPECT_EQ(m.dtype(), DType::kFloat64);
  EXPECT_EQ(ShapeOf(m), (S{2, 2}));
  ExpectNear(m, {2, 3, 7, 7});
  EXPECT_EQ(maximum(I64({1, 7}, {2}), I64({3, 2}, {2})).dtype(), DType::kInt64);
}

TEST(ComparisonTest, TiesSplitTheGradient) {
  Tensor a = F64({1, 2}, {2});
  Tensor b = F64({1, 3}, {2});
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  absl::StatusOr<TensorList> g = autograd::Grad({sum(maximum(a, b))}, {}, {a, b}, {});
  ASSERT_TRUE(g.ok()) << g.status();
  ExpectNear((*g)[0], {0.5, 0});
  ExpectNear((*g)[1], {0.5, 1});
}

TEST(ComparisonTest, Gradients) {
  auto binary = [](Tensor (*fn)(const Tensor&, const Tensor&)) {
    return [fn](const TensorList& x) { return TensorList{fn(x[0], x[1])}; };
  };
  CheckGrads("maximum", binary(maximum), {Leaf({2, 3}, 5), Leaf({3}, 6)});
  CheckGrads("minimum", binary(minimum), {Leaf({2, 1}, 7), Leaf({2, 3}, 8)});
  const Tensor mask = Bool({1, 0, 0, 1, 1, 0}, {2, 3});
  CheckGrads("masked_fill scalar",
             [mask](const TensorList& x) { return TensorList{masked_fill(x[0], mask, 0.5)}; },
             {Leaf({2, 3}, 9)});
  CheckGrads("masked_fill tensor",
             [](const TensorList& x) {
               return TensorList{masked_fill(x[0], Bool({1, 0, 1}, {3}), x[1])};
             },
             {Leaf({2, 3}, 10), Leaf({}, 11)});
  CheckGrads("tril", [](const TensorList& x) { return TensorList{tril(x[0], -1)}; },
             {Leaf({2, 3, 4}, 12)});
  CheckGrads("triu", [](const TensorList& x) { return TensorList{triu(x[0], 1)}; },
             {Leaf({3, 4}, 13)});
}

TEST(ComparisonTest, MaskedFillAndTriangleValues) {
  const Tensor x = F64({1, 2, 3, 4}, {2, 2});
  EXPECT_EQ(Values(masked_fill(x, Bool({0, 1}, {2}), -kInf)), (V{1, -kInf, 3, -kInf}));
  ExpectNear(masked_fill(x, Bool({1, 0, 0, 1}, {2, 2}), F64({7}, {})), {7, 2, 3, 7});
  ExpectNear(tril(F64({1, 2, 3, 4, 5, 6}, {2, 3})), {1, 0, 0, 4, 5, 0});
  ExpectNear(triu(F64({1, 2, 3, 4, 5, 6}, {2, 3})), {1, 2, 3, 0, 5, 6});
  ExpectNear(triu(F64({1, 2, 3, 4, 5, 6}, {2, 3}), 1), {0, 2, 3, 0, 0, 6});
  ExpectNear(tril(F64({1, 2, 3, 4, 5, 6}, {2, 3}), -1), {0, 0, 0, 4, 0, 0});
}

TEST(ComparisonTest, Errors) {
  const Tensor x = F64({1, 2, 3, 4}, {2, 2});
  ExpectInvalid([&] { masked_fill(x, I64({1, 0}, {2}), 1.0); }, {"masked_fill", "mask", "bool"});
  ExpectInvalid(
      [&] {
        masked_fill(x, Bool({1, 0, 1, 0, 1, 0, 1, 0}, {2, 2, 2}), 1.0);
      },
      {"masked_fill", "[2, 2, 2]", "[2, 2]"});
  ExpectInvalid(
      [&] {
        masked_fill(x, Bool({1, 0}, {2}), F64({1, 2}, {2}));
      },
      {"masked_fill", "0-dimensional"});
  ExpectInvalid([&] { tril(F64({1, 2}, {2})); }, {"tril", "at least 2 dimensions"});
  ExpectInvalid([&] { maximum(x, F64({1, 2, 3}, {3})); }, {"maximum", "cannot be broadcast"});
}

TEST(StatisticsTest, Values) {
  const Tensor x = F64({1, 2, 3, 4, 5, 7}, {2, 3});
  ExpectNear(logsumexp(x, {1}), {std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)),
                                 std::log(std::exp(4.0) + std::exp(5.0) + std::exp(7.0))});
  // Far from 1: no overflow, and infinite rows as PyTorch.
  const V far = Values(logsumexp(F64({1000, 1000, -kInf, -kInf, kInf, 1}, {3, 2}), {1}));
  EXPECT_NEAR(far[0], 1000 + std::log(2.0), 1e-12);
  EXPECT_EQ(far[1], -kInf);
  EXPECT_EQ(far[2], kInf);
  ExpectNear(var(x, {1}), {1, 7.0 / 3});
  ExpectNear(var(x, {1}, 0), {2.0 / 3, 14.0 / 9});
  ExpectNear(var(x), {(1 + 4 + 9 + 16 + 25 + 49 - 22.0 * 22 / 6) / 5});
  ExpectNear(std_dev(x, {1}, 1, true), {1, std::sqrt(7.0 / 3)});
  EXPECT_EQ(ShapeOf(std_dev(x, {1}, 1, true)), (S{2, 1}));
  ExpectNear(var(F64({3}, {1}), {0}), {kNan});  // N - correction = 0: 0 / 0
  ExpectNear(amin(x, {0}), {1, 2, 3});

  auto [values, indices] = max(F64({1, 9, 9, 2, kNan, 0}, {2, 3}), 1);
  ExpectNear(values, {9, kNan});
  EXPECT_EQ(Values(indices), (V{1, 1}));
  EXPECT_EQ(indices.dtype(), DType::kInt64);
  auto [low, where] = min(F64({4, 1, 1, 2}, {2, 2}), 0, /*keepdim=*/true);
  ExpectNear(low, {1, 1});
  EXPECT_EQ(Values(where), (V{1, 0}));
  EXPECT_EQ(ShapeOf(where), (S{1, 2}));
}

TEST(StatisticsTest, Gradients) {
  CheckGrads("logsumexp",
             [](const TensorList& x) {
               return TensorList{logsumexp(x[0], {0, 2})};
             },
             {Leaf({2, 3, 2}, 20)});
  CheckGrads("var", [](const TensorList& x) { return TensorList{var(x[0], {1}, 1, true)}; },
             {Leaf({2, 4}, 21)});
  CheckGrads("var all", [](const TensorList& x) { return TensorList{var(x[0], {}, 0)}; },
             {Leaf({3, 2}, 22)});
  CheckGrads("std", [](const TensorList& x) { return TensorList{std_dev(x[0], {0})}; },
             {Leaf({3, 2}, 23)});
  CheckGrads("amin", [](const TensorList& x) { return TensorList{amin(x[0], {1})}; },
             {Leaf({3, 4}, 24)});
  CheckGrads("max", [](const TensorList& x) { return TensorList{max(x[0], 1).first}; },
             {Leaf({3, 4}, 25)});
  CheckGrads("min keepdim",
             [](const TensorList& x) { return TensorList{min(x[0], 0, true).first}; },
             {Leaf({3, 4}, 26)});
}

TEST(StatisticsTest, StdOfAConstantHasZeroGradient) {
  Tensor x = F64({2, 2, 2}, {3});
  x.set_requires_grad(true);
  absl::StatusOr<TensorList> g = autograd::Grad({std_dev(x)}, {}, {x}, {});
  ASSERT_TRUE(g.ok()) << g.status();
  ExpectNear((*g)[0], {0, 0, 0});
}

TEST(StatisticsTest, MaxGivesTheGradientToTheIndexedElement) {
  Tensor x = F64({3, 1, 3}, {3});
  x.set_requires_grad(true);
  absl::StatusOr<TensorList> g = autograd::Grad({max(x, 0).first}, {}, {x}, {});
  ASSERT_TRUE(g.ok()) << g.status();
  ExpectNear((*g)[0], {1, 0, 0});
}

TEST(StatisticsTest, Errors) {
  ExpectInvalid([] { max(F64({}, {0, 2}), 0); }, {"max", "size 0"});
  ExpectInvalid([] { max(F64({1, 2}, {2}), 3); }, {"max", "dim"});
  ExpectInvalid([] { var(F64({1, 2}, {2}), {0, 0}); }, {"var", "more than once"});
  ExpectInvalid([] { logsumexp(I64({1, 2}, {2}), {0}); }, {"logsumexp", "must be floating"});
}

TEST(LinearTest, ValuesAndGradients) {
  // [1, 2] @ [[1, 2], [3, 4], [5, 6]]^T + [1, 0, -1].
  ExpectNear(linear(F64({1, 2}, {1, 2}), F64({1, 2, 3, 4, 5, 6}, {3, 2}), F64({1, 0, -1}, {3})),
             {6, 11, 16});
  CheckGrads("linear", [](const TensorList& x) { return TensorList{linear(x[0], x[1], x[2])}; },
             {Leaf({2, 3, 4}, 30), Leaf({5, 4}, 31), Leaf({5}, 32)});
  CheckGrads("linear no bias", [](const TensorList& x) { return TensorList{linear(x[0], x[1])}; },
             {Leaf({4}, 33), Leaf({2, 4}, 34)});
  CheckGrads("bmm", [](const TensorList& x) { return TensorList{bmm(x[0], x[1])}; },
             {Leaf({2, 3, 4}, 35), Leaf({2, 4, 2}, 36)});
  CheckGrads("baddbmm",
             [](const TensorList& x) { return TensorList{baddbmm(x[0], x[1], x[2], 0.5, 2)}; },
             {Leaf({3, 2}, 37), Leaf({2, 3, 4}, 38), Leaf({2, 4, 2}, 39)});
}

TEST(LinearTest, BaddbmmWithBetaZeroIgnoresInput) {
  Tensor input = F64({kNan, kNan}, {1, 1, 2});
  input.set_requires_grad(true);
  const Tensor out = baddbmm(input, F64({1, 2}, {1, 1, 2}), F64({1, 0, 0, 1}, {1, 2, 2}), 0, 1);
  ExpectNear(out, {1, 2});
  absl::StatusOr<TensorList> g = autograd::Grad({sum(out)}, {}, {input}, {});
  ASSERT_TRUE(g.ok()) << g.status();
  ExpectNear((*g)[0], {0, 0});
}

TEST(LinearTest, Errors) {
  const Tensor x = F64({1, 2, 3, 4, 5, 6}, {2, 3});
  ExpectInvalid([&] { linear(x, F64({1, 2, 3, 4}, {2, 2})); }, {"linear", "3 features", "[2, 2]"});
  ExpectInvalid(
      [&] {
        linear(x, F64({1, 2, 3}, {1, 3}), F64({1, 2}, {2}));
      },
      {"linear", "bias", "[2]"});
  ExpectInvalid([&] { bmm(x, x); }, {"bmm", "3-d", "[2, 3]"});
  ExpectInvalid(
      [&] {
        bmm(F64({1, 2}, {1, 1, 2}), F64({1, 2}, {2, 1, 1}));
      },
      {"bmm", "[1, 1, 2]", "[2, 1, 1]"});
  ExpectInvalid(
      [&] {
        baddbmm(F64({1, 2, 3}, {3}), F64({1, 2}, {1, 1, 2}), F64({1, 2}, {1, 2, 1}));
      },
      {"baddbmm", "does not broadcast"});
}

TEST(IndexingTest, Values) {
  const Tensor x = F64({1, 2, 3, 4, 5, 6}, {2, 3});
  ExpectNear(flip(x, {1}), {3, 2, 1, 6, 5, 4});
  ExpectNear(flip(x, {0, -1}), {6, 5, 4, 3, 2, 1});
  ExpectNear(roll(x, {1}, {1}), {3, 1, 2, 6, 4, 5});
  ExpectNear(roll(x, {-4}, {1}), {2, 3, 1, 5, 6, 4});
  ExpectNear(roll(x, {2}), {5, 6, 1, 2, 3, 4});
  ExpectNear(roll(x, {1, 1}, {0, 1}), {6, 4, 5, 3, 1, 2});
  ExpectNear(slice(x, 1, 0, std::nullopt, 2), {1, 3, 4, 6});
  ExpectNear(slice(x, 1, -2, 100, 1), {2, 3, 5, 6});
  EXPECT_EQ(ShapeOf(slice(x, 0, 5, std::nullopt, 3)), (S{0, 3}));
  ExpectNear(cumsum(x, 1), {1, 3, 6, 4, 9, 15});
  ExpectNear(cumsum(x, 0), {1, 2, 3, 5, 7, 9});
  const Tensor ints = cumsum(Bool({1, 0, 1}, {3}), 0);
  EXPECT_EQ(ints.dtype(), DType::kInt64);
  EXPECT_EQ(Values(ints), (V{1, 1, 2}));
  ExpectNear(scatter_add(F64({0, 0, 0}, {3}), 0, I64({2, 2, 0}, {3}), F64({1, 2, 4}, {3})),
             {4, 0, 3});
  // src larger than index: only index's part of it is used.
  ExpectNear(scatter_add(F64({0, 0}, {1, 2}), 1, I64({1}, {1, 1}), F64({5, 7, 9}, {1, 3})), {0, 5});
  ExpectNear(index_add(x, 0, I64({1, 1}, {2}), F64({1, 1, 1, 2, 2, 2}, {2, 3}), 0.5),
             {1, 2, 3, 5.5, 6.5, 7.5});
}

TEST(IndexingTest, Gradients) {
  CheckGrads("flip",
             [](const TensorList& x) {
               return TensorList{flip(x[0], {0, 2})};
             },
             {Leaf({2, 3, 2}, 40)});
  CheckGrads("roll",
             [](const TensorList& x) {
               return TensorList{roll(x[0], {1, -1}, {0, 1})};
             },
             {Leaf({3, 4}, 41)});
  CheckGrads("slice", [](const TensorList& x) { return TensorList{slice(x[0], 1, 1, -1, 2)}; },
             {Leaf({2, 6}, 42)});
  CheckGrads("cumsum", [](const TensorList& x) { return TensorList{cumsum(x[0], -1)}; },
             {Leaf({2, 4}, 43)});
  const Tensor index = I64({0, 2, 2, 1, 0, 0}, {2, 3});
  CheckGrads("scatter_add",
             [index](const TensorList& x) { return TensorList{scatter_add(x[0], 1, index, x[1])}; },
             {Leaf({2, 3}, 44), Leaf({2, 4}, 45)});
  CheckGrads("index_add",
             [](const TensorList& x) {
               return TensorList{index_add(x[0], 1, I64({2, 0}, {2}), x[1], 2)};
             },
             {Leaf({2, 3}, 46), Leaf({2, 2}, 47)});
}

TEST(IndexingTest, Errors) {
  const Tensor x = F64({1, 2, 3, 4, 5, 6}, {2, 3});
  ExpectInvalid([&] { flip(x, {1, -1}); }, {"flip", "more than once"});
  ExpectInvalid([&] { roll(x, {1, 2}, {0}); }, {"roll", "same length"});
  ExpectInvalid([&] { slice(x, 1, 0, 2, 0); }, {"slice", "step = 0"});
  ExpectInvalid(
      [&] {
        scatter_add(x, 1, I64({3}, {1, 1}), F64({1}, {1, 1}));
      },
      {"scatter_add", "index"});
  ExpectInvalid(
      [&] {
        index_add(x, 0, I64({0}, {1}), F64({1, 2}, {1, 2}));
      },
      {"index_add", "source"});
  ExpectInvalid([&] { cumsum(x, 2); }, {"cumsum", "dim"});
}

Pool2dOptions Window(int64_t k, int64_t stride, int64_t padding) {
  Pool2dOptions o;
  o.kernel_size = {k, k};
  o.stride = {stride, stride};
  o.padding = {padding, padding};
  return o;
}

TEST(PoolingTest, Values) {
  // [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
  const Tensor x = F64({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 3, 3});
  ExpectNear(max_pool2d(x, Window(2, 1, 0)), {5, 6, 8, 9});
  ExpectNear(max_pool2d(x, Window(2, 2, 1)), {1, 3, 7, 9});
  ExpectNear(avg_pool2d(x, Window(2, 1, 0)), {3, 4, 6, 7});
  ExpectNear(avg_pool2d(x, Window(2, 2, 1)), {0.25, 5.0 / 4, 11.0 / 4, 7});
  Pool2dOptions exclude = Window(2, 2, 1);
  exclude.count_include_pad = false;
  ExpectNear(avg_pool2d(x, exclude), {1, 2.5, 5.5, 7});
  ExpectNear(adaptive_avg_pool2d(x, {1, 1}), {5});
  // Bins of 3 in 2: rows [0, 2) and [1, 3).
  ExpectNear(adaptive_avg_pool2d(x, {2, 1}), {3.5, 6.5});
  EXPECT_EQ(ShapeOf(max_pool2d(Leaf({2, 3, 5, 4}, 50), Window(3, 2, 1))), (S{2, 3, 3, 2}));
  // ceil_mode: the last window overhangs the input; PyTorch gives [[5, 6], [8, 9]].
  Pool2dOptions ceil = Window(2, 2, 0);
  ceil.ceil_mode = true;
  ExpectNear(max_pool2d(x, ceil), {5, 6, 8, 9});
  EXPECT_EQ(ShapeOf(max_pool2d(Leaf({1, 5, 5}, 51), ceil)), (S{1, 3, 3}));
}

TEST(PoolingTest, Gradients) {
  CheckGrads("max_pool2d",
             [](const TensorList& x) { return TensorList{max_pool2d(x[0], Window(2, 1, 1))}; },
             {Leaf({1, 2, 3, 3}, 51)});
  CheckGrads("avg_pool2d",
             [](const TensorList& x) { return TensorList{avg_pool2d(x[0], Window(2, 2, 1))}; },
             {Leaf({2, 2, 3, 3}, 52)});
  CheckGrads("adaptive_avg_pool2d",
             [](const TensorList& x) {
               return TensorList{adaptive_avg_pool2d(x[0], {2, 3})};
             },
             {Leaf({2, 3, 5}, 53)});
}

TEST(PoolingTest, Errors) {
  const Tensor x = F64({1, 2, 3, 4}, {1, 1, 2, 2});
  ExpectInvalid([&] { max_pool2d(x, Window(3, 1, 0)); }, {"max_pool2d", "larger than"});
  ExpectInvalid([&] { avg_pool2d(x, Window(2, 1, 2)); }, {"avg_pool2d", "half of kernel_size"});
  ExpectInvalid(
      [&] {
        max_pool2d(F64({1, 2}, {2}), Window(1, 1, 0));
      },
      {"max_pool2d", "[N, C, H, W]"});
  Pool2dOptions ceil = Window(1, 1, 0);
  ceil.ceil_mode = true;
  ExpectInvalid([&] { avg_pool2d(x, ceil); }, {"avg_pool2d", "ceil_mode"});
  ExpectInvalid([&] { adaptive_avg_pool2d(x, {0, 1}); }, {"adaptive_avg_pool2d", "positive"});
}

TEST(NormalizationTest, BatchNorm) {
  // One channel, values 1 and 3: mean 2, biased variance 1, unbiased 2.
  const Tensor x = F64({1, 3}, {2, 1});
  BatchNormResult r = batch_norm(x, F64({0}, {1}), F64({1}, {1}), Tensor(), Tensor(), true, 0.5, 0);
  ExpectNear(r.output, {-1, 1});
  ExpectNear(r.running_mean, {1});
  ExpectNear(r.running_var, {1.5});
  r = batch_norm(x, F64({1}, {1}), F64({4}, {1}), F64({2}, {1}), F64({1}, {1}), false, 0.1, 0);
  ExpectNear(r.output, {1, 3});
  ExpectNear(r.running_var, {4});
  CheckGrads("batch_norm training",
             [](const TensorList& x) {
               return TensorList{batch_norm(x[0], Tensor(), Tensor(), x[1], x[2], true).output};
             },
             {Leaf({3, 2, 2}, 60), Leaf({2}, 61), Leaf({2}, 62)});
  CheckGrads("batch_norm eval",
             [](const TensorList& x) {
               return TensorList{batch_norm(x[0], F64({0.1, -0.2}, {2}), F64({1.5, 0.5}, {2}), x[1],
                                            Tensor(), false)
                                     .output};
             },
             {Leaf({3, 2}, 63), Leaf({2}, 64)});
  ExpectInvalid(
      [] {
        batch_norm(F64({1, 2}, {1, 2}), Tensor(), Tensor(), Tensor(), Tensor(), true);
      },
      {"batch_norm", "more than 1 value per channel"});
  ExpectInvalid(
      [] {
        batch_norm(F64({1, 2}, {2, 1}), Tensor(), Tensor(), Tensor(), Tensor(), false);
      },
      {"batch_norm", "running_mean"});
}

TEST(NormalizationTest, GroupNorm) {
  // Mean 4, biased variance 5.
  const double s = std::sqrt(5.0);
  ExpectNear(group_norm(F64({1, 3, 5, 7}, {1, 2, 2}), 1, Tensor(), Tensor(), 0),
             {-3 / s, -1 / s, 1 / s, 3 / s});
  CheckGrads("group_norm",
             [](const TensorList& x) { return TensorList{group_norm(x[0], 2, x[1], x[2])}; },
             {Leaf({2, 4, 3}, 65), Leaf({4}, 66), Leaf({4}, 67)});
  ExpectInvalid([] { group_norm(F64({1, 2, 3}, {1, 3}), 2); }, {"group_norm", "divide"});
}

TEST(DropoutTest, SeededAndReproducible) {
  const Tensor x = Leaf({4, 50}, 70);
  auto [out, mask] = dropout(x, 0.3, true, 42);
  auto [again, mask_again] = dropout(x, 0.3, true, 42);
  EXPECT_EQ(Values(mask), Values(mask_again));
  EXPECT_NE(Values(mask), Values(dropout(x, 0.3, true, 43).second));
  EXPECT_EQ(mask.dtype(), DType::kBool);
  const V xs = Values(x), ms = Values(mask), os = Values(out);
  int kept = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    EXPECT_NEAR(os[i], ms[i] * xs[i] / 0.7, 1e-12);
    kept += ms[i] != 0;
  }
  EXPECT_GT(kept, 100);
  EXPECT_LT(kept, 180);
  ExpectNear(dropout(x, 0.3, false, 1).first, xs);
  ExpectNear(dropout(x, 1, true, 1).first, V(xs.size(), 0.0));
  CheckGrads("dropout",
             [](const TensorList& x) { return TensorList{dropout(x[0], 0.5, true, 7).first}; },
             {Leaf({3, 4}, 71)});
  ExpectInvalid([&] { dropout(x, 1.5); }, {"dropout", "p = 1.5"});
}

TEST(AttentionTest, ValuesAndGradients) {
  // One query attending equally to two keys.
  const Tensor q = F64({0, 0}, {1, 2});
  const Tensor k = F64({1, 0, 0, 1}, {2, 2});
  const Tensor v = F64({1, 2, 3, 4}, {2, 2});
  ExpectNear(scaled_dot_product_attention(q, k, v), {2, 3});
  ExpectNear(scaled_dot_product_attention(q, k, v, Bool({1, 0}, {1, 2})), {1, 2});
  // Causal: the first query sees only the first key.
  ExpectNear(scaled_dot_product_attention(F64({0, 0, 0, 0}, {2, 2}), k, v, Tensor(), 0, true),
             {1, 2, 2, 3});
  CheckGrads("sdpa",
             [](const TensorList& x) {
               return TensorList{scaled_dot_product_attention(x[0], x[1], x[2])};
             },
             {Leaf({2, 3, 4}, 80), Leaf({2, 5, 4}, 81), Leaf({2, 5, 3}, 82)});
  CheckGrads(
      "sdpa causal",
      [](const TensorList& x) {
        return TensorList{scaled_dot_product_attention(x[0], x[1], x[2], Tensor(), 0, true, 0.5)};
      },
      {Leaf({3, 2}, 83), Leaf({3, 2}, 84), Leaf({3, 2}, 85)});
  CheckGrads("sdpa float mask",
             [](const TensorList& x) {
               return TensorList{scaled_dot_product_attention(x[0], x[1], x[2], x[3])};
             },
             {Leaf({2, 2}, 86), Leaf({3, 2}, 87), Leaf({3, 2}, 88), Leaf({2, 3}, 89)});
  ExpectInvalid([&] { scaled_dot_product_attention(q, k, v, Tensor(), 0.1); },
                {"scaled_dot_product_attention", "dropout_p"});
  ExpectInvalid(
      [&] {
        scaled_dot_product_attention(q, F64({1, 2, 3}, {1, 3}), v);
      },
      {"scaled_dot_product_attention", "[1, 3]"});
}

// Every new op on sim:0 (host memory behind a device's interface) gives the CPU's values and
// gradients: the masks and indices the ops make on the host reach the input's device.
TEST(ModelOpsDeviceTest, SimulatedDeviceMatchesCpu) {
  (void)RegisterSimulatedDevices(2);
  const Device sim{DeviceType::kSimulated, 0};
  struct Case {
    const char* what;
    TensorFn fn;
    S shape;
  };
  const Case cases[] = {
      {"maximum",
       [](const TensorList& x) { return TensorList{maximum(x[0], mul(x[0], -1.0))}; },
       {2, 3}},
      {"masked_fill",
       [](const TensorList& x) {
         return TensorList{masked_fill(x[0], CompareMask("t", Comparison::kLess, x[0], 0.0), 2.0)};
       },
       {2, 3}},
      {"tril", [](const TensorList& x) { return TensorList{tril(x[0], 0)}; }, {3, 3}},
      {"logsumexp", [](const TensorList& x) { return TensorList{logsumexp(x[0], {1})}; }, {2, 3}},
      {"std", [](const TensorList& x) { return TensorList{std_dev(x[0], {0})}; }, {3, 2}},
      {"max", [](const TensorList& x) { return TensorList{max(x[0], 1).first}; }, {2, 4}},
      {"flip roll",
       [](const TensorList& x) { return TensorList{roll(flip(x[0], {0}), {1}, {1})}; },
       {2, 3}},
      {"slice", [](const TensorList& x) { return TensorList{slice(x[0], 1, 0, 5, 2)}; }, {2, 5}},
      {"cumsum", [](const TensorList& x) { return TensorList{cumsum(x[0], 1)}; }, {2, 3}},
      {"max_pool2d",
       [](const TensorList& x) { return TensorList{max_pool2d(x[0], Window(2, 1, 1))}; },
       {1, 3, 3}},
      {"avg_pool2d",
       [](const TensorList& x) { return TensorList{avg_pool2d(x[0], Window(2, 1, 1))}; },
       {1, 3, 3}},
      {"adaptive_avg_pool2d",
       [](const TensorList& x) {
         return TensorList{adaptive_avg_pool2d(x[0], {2, 2})};
       },
       {1, 3, 3}},
      {"group_norm",
       [](const TensorList& x) { return TensorList{group_norm(x[0], 1)}; },
       {2, 2, 3}},
      {"dropout",
       [](const TensorList& x) { return TensorList{dropout(x[0], 0.5, true, 3).first}; },
       {4, 4}},
      {"sdpa causal",
       [](const TensorList& x) {
         return TensorList{scaled_dot_product_attention(x[0], x[0], x[0], Tensor(), 0, true)};
       },
       {3, 2}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const Tensor cpu = Leaf(c.shape, 90);
    Tensor dev = cpu.detach().To(sim);
    dev.set_requires_grad(true);
    const Tensor a = c.fn({cpu})[0];
    const Tensor b = c.fn({dev})[0];
    ASSERT_EQ(b.device(), sim);
    ExpectNear(b.To(kCPU), Values(a), 1e-12);
    absl::StatusOr<TensorList> ga = autograd::Grad({sum(a)}, {}, {cpu}, {});
    absl::StatusOr<TensorList> gb = autograd::Grad({sum(b)}, {}, {dev}, {});
    ASSERT_TRUE(ga.ok() && gb.ok()) << ga.status() << gb.status();
    ExpectNear((*gb)[0].To(kCPU), Values((*ga)[0]), 1e-12);
  }
}

TEST(ModelOpsRegistryTest, EveryOpIsRegistered) {
  for (const char* name : {"erf",
                           "silu",
                           "leaky_relu",
                           "elu",
                           "maximum",
                           "minimum",
                           "masked_fill",
                           "tril",
                           "triu",
                           "logsumexp",
                           "var",
                           "std",
                           "amin",
                           "max",
                           "min",
                           "linear",
                           "bmm",
                           "baddbmm",
                           "flip",
                           "roll",
                           "slice",
                           "scatter_add",
                           "index_add",
                           "cumsum",
                           "max_pool2d",
                           "avg_pool2d",
                           "adaptive_avg_pool2d",
                           "batch_norm",
                           "group_norm",
                           "dropout",
                           "scaled_dot_product_attention"}) {
    EXPECT_NE(OpRegistry::Get().Find(name), nullptr) << name;
  }
  const OpSchema* max_op = OpRegistry::Get().Find("max");
  ASSERT_NE(max_op, nullptr);
  EXPECT_EQ(max_op->num_outputs, 2);
  Attrs attrs;
  attrs.set("dim", int64_t{1});
  const TensorList out = max_op->run({F64({1, 3, 2, 0}, {2, 2})}, attrs);
  ExpectNear(out[0], {3, 2});
  EXPECT_EQ(Values(out[1]), (V{1, 0}));
}

}  // namespace
}  // namespace gradserve::ops
