#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "engine/autograd/autograd.h"
#include "engine/autograd/node.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/op_registry.h"
#include "engine/ops/reductions.h"
#include "gtest/gtest.h"
#include "tests/engine/gradcheck.h"
#include "tests/engine/op_test_util.h"

namespace gradserve::ops {
namespace {

using ::gradserve::testing::GradCheck;
using ::gradserve::testing::GradGradCheck;
using ::gradserve::testing::RandomInput;
using ::gradserve::testing::op_test::ExpectInvalid;
using ::gradserve::testing::op_test::ExpectNear;
using ::gradserve::testing::op_test::F64;
using ::gradserve::testing::op_test::I64;
using ::gradserve::testing::op_test::Values;

using ReduceFn = Tensor (*)(const Tensor&, absl::Span<const int64_t>, bool);

struct Reduction {
  std::string name;
  ReduceFn fn;
};

class ReductionTest : public ::testing::TestWithParam<Reduction> {};

// (shape, dims, keepdim) combinations: all dims, one dim, negative dims, several dims, 0-d,
// size-1 and zero-size dims (amax skips reductions over zero-size dims).
struct ReduceCase {
  Shape shape;
  std::vector<int64_t> dim;
  bool keepdim;
};
const std::vector<ReduceCase> kCases = {
    {{2, 3}, {}, false},
    {{2, 3}, {}, true},
    {{2, 3}, {0}, false},
    {{2, 3}, {-1}, true},
    {{2, 3, 4}, {0, 2}, false},
    {{2, 3, 4}, {2, 0}, true},
    {{}, {}, false},
    {{}, {0}, true},
    {{1}, {0}, false},
    {{3, 1}, {1}, false},
    {{0, 3}, {1}, false},
    {{2, 0}, {0}, true},
    {{0}, {}, false},
};

bool ReducesZeroSizeDim(const ReduceCase& c) {
  const int64_t rank = static_cast<int64_t>(c.shape.size());
  for (int64_t d = 0; d < rank; ++d) {
    bool reduced = c.dim.empty();
    for (int64_t r : c.dim) reduced |= (r < 0 ? r + rank : r) == d;
    if (reduced && c.shape[d] == 0) return true;
  }
  return false;
}

TEST_P(ReductionTest, GradCheck) {
  const Reduction& r = GetParam();
  uint32_t seed = 1;
  for (const ReduceCase& c : kCases) {
    if (r.name == "amax" && ReducesZeroSizeDim(c)) continue;
    Tensor x = RandomInput(c.shape, seed++);
    auto fn = [&](const TensorList& in) { return TensorList{r.fn(in[0], c.dim, c.keepdim)}; };
    EXPECT_TRUE(GradCheck(fn, {x})) << r.name << " " << ShapeToString(c.shape);
    EXPECT_TRUE(GradGradCheck(fn, {x})) << r.name << " " << ShapeToString(c.shape);
  }
}

TEST_P(ReductionTest, OutputShapes) {
  const Reduction& r = GetParam();
  Tensor x = RandomInput({2, 3, 4}, 1, -1, 1, false);
  EXPECT_EQ(r.fn(x, {}, false).shape(), (Shape{}));
  EXPECT_EQ(r.fn(x, {}, true).shape(), (Shape{1, 1, 1}));
  EXPECT_EQ(r.fn(x, {1}, false).shape(), (Shape{2, 4}));
  EXPECT_EQ(r.fn(x, {-1, 0}, true).shape(), (Shape{1, 3, 1}));
  EXPECT_EQ(r.fn(Tensor::Scalar(2, DType::kFloat64), {-1}, false).shape(), (Shape{}));
}

TEST_P(ReductionTest, Float32AgreesWithFloat64) {
  const Reduction& r = GetParam();
  Tensor x = RandomInput({5, 7}, 2, -1, 1, false).To(DType::kFloat32);
  Tensor y = r.fn(x, {1}, false);
  EXPECT_EQ(y.dtype(), DType::kFloat32);
  const std::vector<double> expected = Values(r.fn(x.To(DType::kFloat64), {1}, false));
  const std::vector<double> got = Values(y);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], 1e-6);
}

TEST_P(ReductionTest, InvalidDims) {
  const Reduction& r = GetParam();
  Tensor x = RandomInput({2, 3}, 1);
  ExpectInvalid([&] { r.fn(x, {2}, false); },
                r.name + ": dim 2 is out of range for a tensor of shape [2, 3]");
  ExpectInvalid([&] { r.fn(x, {1, -1}, false); }, r.name + ": dim -1 appears more than once");
  ExpectInvalid([&] { r.fn(Tensor(), {}, false); }, r.name + ": input is an undefined tensor");
}

INSTANTIATE_TEST_SUITE_P(Ops, ReductionTest,
                         ::testing::Values(Reduction{"sum", &sum}, Reduction{"mean", &mean},
                                           Reduction{"amax", &amax}),
                         [](const ::testing::TestParamInfo<Reduction>& info) {
                           return info.param.name;
                         });

TEST(ReductionValuesTest, HandComputed) {
  Tensor x = F64({1, 5, 3, 4, 2, 6}, {2, 3});
  ExpectNear(sum(x), {21});
  ExpectNear(sum(x, {0}), {5, 7, 9});
  ExpectNear(sum(x, {1}, true), {9, 12});
  ExpectNear(mean(x), {3.5});
  ExpectNear(mean(x, {0}), {2.5, 3.5, 4.5});
  ExpectNear(amax(x), {6});
  ExpectNear(amax(x, {1}), {5, 6});
  ExpectNear(amax(x, {0}), {4, 5, 6});
  // Empty reductions: sum 0, mean NaN, as in PyTorch.
  Tensor empty = Tensor::Zeros({0, 3}, DType::kFloat64);
  ExpectNear(sum(empty), {0});
  ExpectNear(mean(empty, {0}), {NAN, NAN, NAN});
  // NaN wins in amax.
  ExpectNear(amax(F64({1, NAN, 3}, {3})), {NAN});
}

TEST(ReductionValuesTest, IntegerAndBool) {
  Tensor i = Tensor::FromVector<int64_t>({1, 7, 3}, {3});
  EXPECT_EQ(sum(i).dtype(), DType::kInt64);
  ExpectNear(sum(i), {11});
  EXPECT_EQ(amax(i).dtype(), DType::kInt64);
  ExpectNear(amax(i), {7});
  Tensor b = Tensor::FromVector<bool>({true, false, true}, {3});
  EXPECT_EQ(sum(b).dtype(), DType::kInt64);
  ExpectNear(sum(b), {2});
  EXPECT_EQ(amax(b).dtype(), DType::kBool);
  ExpectInvalid([&] { mean(i); },
                "mean: input must be floating (float32, float64, float16 or bfloat16), got int64");
  ExpectInvalid(
      [&] {
        amax(Tensor::Zeros({2, 0}, DType::kFloat64), {1});
      },
      "amax: cannot reduce dim 1 of size 0");
}

TEST(ReductionValuesTest, AmaxSplitsGradientAmongTies) {
  Tensor x = F64({3, 1, 3, 2, 2, 2}, {2, 3});
  x.set_requires_grad(true);
  Tensor y = amax(x, {1});
  absl::StatusOr<TensorList> g = autograd::Grad({y}, {F64({1, 3}, {2})}, {x}, {});
  ASSERT_TRUE(g.ok()) << g.status();
  ExpectNear((*g)[0], {0.5, 0, 0.5, 1, 1, 1});
  // All dims.
  absl::StatusOr<TensorList> g_all = autograd::Grad({amax(x)}, {}, {x}, {});
  ASSERT_TRUE(g_all.ok()) << g_all.status();
  ExpectNear((*g_all)[0], {0.5, 0, 0.5, 0, 0, 0});
}

TEST(ReductionValuesTest, GradientsOfSumAndMean) {
  Tensor x = RandomInput({2, 3}, 3);
  absl::StatusOr<TensorList> g = autograd::Grad({mean(x, {0})}, {F64({1, 2, 3}, {3})}, {x}, {});
  ASSERT_TRUE(g.ok()) << g.status();
  ExpectNear((*g)[0], {0.5, 1, 1.5, 0.5, 1, 1.5});
  absl::StatusOr<TensorList> gs = autograd::Grad({sum(x)}, {}, {x}, {});
  ASSERT_TRUE(gs.ok()) << gs.status();
  ExpectNear((*gs)[0], {1, 1, 1, 1, 1, 1});
}

TEST(ReductionValuesTest, BackwardNodeNames) {
  Tensor x = RandomInput({2, 3}, 1);
  EXPECT_EQ(sum(x).grad_fn()->name(), "SumBackward0");
  EXPECT_EQ(sum(x, {1}).grad_fn()->name(), "SumBackward1");
  EXPECT_EQ(mean(x).grad_fn()->name(), "MeanBackward0");
  EXPECT_EQ(mean(x, {0}, true).grad_fn()->name(), "MeanBackward1");
  EXPECT_EQ(amax(x, {0}).grad_fn()->name(), "AmaxBackward0");
}

TEST(ReductionValuesTest, LongSumIsAccurateInFloat32) {
  Tensor x = Tensor::Full({1 << 20}, 0.1, DType::kFloat32);
  EXPECT_NEAR(sum(x).item(), 0.1f * (1 << 20), 1e-2);
}

// Note [Reducing a row in lanes]: rows of every length around the lane count and its multiples,
// so that each lane, the tail and the short path all take part; the values are integers, so
// every order of summing gives the same exact result.
TEST(ReductionValuesTest, LongRowsReduceInLanes) {
  for (int64_t n : {1, 7, 15, 16, 17, 23, 24, 31, 100, 1001}) {
    SCOPED_TRACE(n);
    std::vector<double> values(static_cast<size_t>(n));
    std::vector<int64_t> ints(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      values[i] = static_cast<double>((i * 37) % 101) - 50;
      ints[i] = (i * 37) % 101 - 50;
    }
    double total = 0;
    for (double v : values) total += v;
    ExpectNear(sum(F64(values, {n})), {total});
    ExpectNear(mean(F64(values, {n})), {total / static_cast<double>(n)});
    ExpectNear(sum(I64(ints, {n})), {total});
    // The same row read with stride 2 out of a buffer twice as long.
    std::vector<double> spaced(static_cast<size_t>(2 * n), 1e6);
    for (int64_t i = 0; i < n; ++i) spaced[2 * i] = values[i];
    ExpectNear(sum(F64(spaced, {2 * n}).AsStrided({n}, {2}, 0)), {total});
    // The largest element, and a NaN, at every position: whichever lane holds it wins.
    for (int64_t at = 0; at < n; ++at) {
      std::vector<double> peaked = values;
      peaked[at] = 1000;
      ExpectNear(amax(F64(peaked, {n})), {1000});
      std::vector<int64_t> peaked_ints = ints;
      peaked_ints[at] = 1000;
      ExpectNear(amax(I64(peaked_ints, {n})), {1000});
      peaked[at] = NAN;
      ExpectNear(amax(F64(peaked, {n})), {NAN});
    }
  }
}

TEST(ReductionValuesTest, StridedInput) {
  Tensor base = F64({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor t = base.AsStrided({3, 2}, {1, 3}, 0);
  ExpectNear(sum(t, {1}), {5, 7, 9});
  ExpectNear(amax(t, {0}), {3, 6});
}

TEST(ReductionValuesTest, RunThroughTheRegistry) {
  const OpRegistry& registry = OpRegistry::Get();
  Tensor x = F64({1, 5, 3, 4, 2, 6}, {2, 3});
  ExpectNear(registry.Find("sum")->run({x}, Attrs())[0], {21});
  ExpectNear(registry.Find("sum")->run({x}, Attrs({{"dim", int64_t{1}}}))[0], {9, 12});
  Tensor kept = registry.Find("mean")->run(
      {x}, Attrs({{"dim", std::vector<int64_t>{0}}, {"keepdim", true}}))[0];
  EXPECT_EQ(kept.shape(), (Shape{1, 3}));
  ExpectNear(registry.Find("amax")->run({x}, Attrs({{"dim", int64_t{-1}}}))[0], {5, 6});
}

}  // namespace
}  // namespace gradserve::ops
