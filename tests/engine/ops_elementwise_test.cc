#include <cmath>
#include <string>
#include <vector>

#include "engine/autograd/autograd.h"
#include "engine/autograd/grad_mode.h"
#include "engine/autograd/node.h"
#include "engine/ops/broadcast.h"
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
using ::gradserve::testing::op_test::Values;

// The shapes every unary op is checked on: 0-d, size-1, plain, zero-size and size-1 dims.
const std::vector<Shape> kUnaryShapes = {{}, {1}, {3}, {2, 3}, {0}, {2, 0}, {2, 1, 3}};

// Pairs of broadcastable shapes for the binary ops.
const std::vector<std::pair<Shape, Shape>> kBinaryShapes = {
    {{2, 3}, {2, 3}}, {{2, 3}, {3}}, {{2, 1}, {1, 3}}, {{}, {2, 3}},     {{3}, {}},
    {{}, {}},         {{0, 3}, {3}}, {{1}, {2, 1, 3}}, {{2, 0}, {1, 1}}, {{1, 1}, {2, 2}}};

// --- Unary ops ---

struct UnaryCase {
  std::string name;
  Tensor (*fn)(const Tensor&);
  double (*reference)(double);
  double low, high;  // the domain sampled
};

double RefSigmoid(double x) { return 1 / (1 + std::exp(-x)); }
double RefRelu(double x) { return x < 0 ? 0 : x; }
double RefRsqrt(double x) { return 1 / std::sqrt(x); }
double RefNeg(double x) { return -x; }
double RefAbs(double x) { return std::abs(x); }
double RefExp(double x) { return std::exp(x); }
double RefLog(double x) { return std::log(x); }
double RefSqrt(double x) { return std::sqrt(x); }
double RefSin(double x) { return std::sin(x); }
double RefCos(double x) { return std::cos(x); }
double RefTanh(double x) { return std::tanh(x); }
double RefErf(double x) { return std::erf(x); }

Tensor GeluNone(const Tensor& x) { return gelu(x, "none"); }
Tensor GeluTanh(const Tensor& x) { return gelu(x, "tanh"); }
double RefGeluNone(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double RefGeluTanh(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}
Tensor Softplus2(const Tensor& x) { return softplus(x, 2, 1); }
double RefSoftplus2(double x) { return 2 * x > 1 ? x : std::log1p(std::exp(2 * x)) / 2; }
Tensor ClampBoth(const Tensor& x) { return clamp(x, -0.5, 0.5); }
double RefClampBoth(double x) { return std::min(std::max(x, -0.5), 0.5); }
Tensor ClampMin(const Tensor& x) { return clamp(x, 0.25, std::nullopt); }
double RefClampMin(double x) { return std::max(x, 0.25); }
Tensor PowScalar3(const Tensor& x) { return pow(x, 3.0); }
double RefPow3(double x) { return x * x * x; }
Tensor PowScalarHalf(const Tensor& x) { return pow(x, -1.5); }
double RefPowHalf(double x) { return std::pow(x, -1.5); }
Tensor MulScalar(const Tensor& x) { return mul(x, 1.0001); }
double RefMulScalar(double x) { return x * 1.0001; }
Tensor AddScalar(const Tensor& x) { return add(x, 2.0, 3.0); }
double RefAddScalar(double x) { return x + 6; }
Tensor SubScalar(const Tensor& x) { return sub(x, 2.0); }
double RefSubScalar(double x) { return x - 2; }
Tensor RsubScalar(const Tensor& x) { return rsub(x, 2.0, 3.0); }
double RefRsubScalar(double x) { return 2 - 3 * x; }
Tensor DivScalar(const Tensor& x) { return div(x, 4.0); }
double RefDivScalar(double x) { return x / 4; }

const std::vector<UnaryCase>& UnaryCases() {
  static const std::vector<UnaryCase> cases = {
      {"neg", &neg, &RefNeg, -1, 1},
      {"abs", &abs, &RefAbs, -1, 1},
      {"exp", &exp, &RefExp, -1, 1},
      {"log", &log, &RefLog, 0.5, 2},
      {"sqrt", &sqrt, &RefSqrt, 0.5, 2},
      {"rsqrt", &rsqrt, &RefRsqrt, 0.5, 2},
      {"sin", &sin, &RefSin, -2, 2},
      {"cos", &cos, &RefCos, -2, 2},
      {"tanh", &tanh, &RefTanh, -2, 2},
      {"sigmoid", &sigmoid, &RefSigmoid, -3, 3},
      {"erf", &erf, &RefErf, -2, 2},
      {"relu", &relu, &RefRelu, -1, 1},
      {"gelu_none", &GeluNone, &RefGeluNone, -3, 3},
      {"gelu_tanh", &GeluTanh, &RefGeluTanh, -3, 3},
      {"softplus", &Softplus2, &RefSoftplus2, -1, 1},
      {"clamp", &ClampBoth, &RefClampBoth, -1, 1},
      {"clamp_min", &ClampMin, &RefClampMin, -1, 1},
      {"pow_scalar", &PowScalar3, &RefPow3, -2, 2},
      {"pow_negative", &PowScalarHalf, &RefPowHalf, 0.5, 2},
      {"mul_scalar", &MulScalar, &RefMulScalar, -1, 1},
      {"add_scalar", &AddScalar, &RefAddScalar, -1, 1},
      {"sub_scalar", &SubScalar, &RefSubScalar, -1, 1},
      {"rsub_scalar", &RsubScalar, &RefRsubScalar, -1, 1},
      {"div_scalar", &DivScalar, &RefDivScalar, -1, 1},
  };
  return cases;
}

class UnaryOpTest : public ::testing::TestWithParam<UnaryCase> {};

TEST_P(UnaryOpTest, ForwardMatchesReference) {
  const UnaryCase& c = GetParam();
  Tensor x = RandomInput({2, 3}, 7, c.low, c.high, false);
  std::vector<double> expected;
  for (double v : Values(x)) expected.push_back(c.reference(v));
  Tensor y = c.fn(x);
  EXPECT_EQ(y.dtype(), DType::kFloat64);
  EXPECT_EQ(y.shape(), x.shape());
  ExpectNear(y, expected, 1e-12);
}

TEST_P(UnaryOpTest, Float32ForwardAgreesWithFloat64) {
  const UnaryCase& c = GetParam();
  Tensor x = RandomInput({4, 5}, 8, c.low, c.high, false);
  Tensor y32 = c.fn(x.To(DType::kFloat32));
  EXPECT_EQ(y32.dtype(), DType::kFloat32);
  ExpectNear(y32, Values(c.fn(x.To(DType::kFloat32).To(DType::kFloat64))), 1e-5);
}

TEST_P(UnaryOpTest, GradCheck) {
  const UnaryCase& c = GetParam();
  uint32_t seed = 10;
  for (const Shape& shape : kUnaryShapes) {
    Tensor x = RandomInput(shape, seed++, c.low, c.high);
    auto fn = [&c](const TensorList& in) { return TensorList{c.fn(in[0])}; };
    EXPECT_TRUE(GradCheck(fn, {x})) << c.name << " at " << ShapeToString(shape);
    EXPECT_TRUE(GradGradCheck(fn, {x})) << c.name << " at " << ShapeToString(shape);
  }
}

TEST_P(UnaryOpTest, RecordsOnlyWhenNeeded) {
  const UnaryCase& c = GetParam();
  Tensor x = RandomInput({3}, 3, c.low, c.high);
  EXPECT_NE(c.fn(x).grad_fn(), nullptr);
  EXPECT_EQ(c.fn(x.detach()).grad_fn(), nullptr);
  autograd::NoGradGuard no_grad;
  EXPECT_EQ(c.fn(x).grad_fn(), nullptr);
}

INSTANTIATE_TEST_SUITE_P(Ops, UnaryOpTest, ::testing::ValuesIn(UnaryCases()),
                         [](const ::testing::TestParamInfo<UnaryCase>& info) {
                           return info.param.name;
                         });

TEST(UnaryOpTest, HandComputedValues) {
  Tensor x = F64({-2, -0.5, 0, 0.5, 2}, {5});
  ExpectNear(relu(x), {0, 0, 0, 0.5, 2});
  ExpectNear(abs(x), {2, 0.5, 0, 0.5, 2});
  ExpectNear(neg(x), {2, 0.5, 0, -0.5, -2});
  ExpectNear(clamp(x, -1.0, 1.0), {-1, -0.5, 0, 0.5, 1});
  // min > max gives max everywhere, as in PyTorch.
  ExpectNear(clamp(x, 1.0, -1.0), {-1, -1, -1, -1, -1});
  ExpectNear(sigmoid(F64({0}, {1})), {0.5});
  ExpectNear(gelu(F64({0, 1}, {2})), {0, 0.8413447460685429});
  ExpectNear(gelu(F64({1}, {1}), "tanh"), {0.8411919906082768});
  ExpectNear(softplus(F64({0, 30}, {2})), {std::log(2.0), 30});
  ExpectNear(sqrt(F64({4, 9}, {2})), {2, 3});
  ExpectNear(rsqrt(F64({4}, {1})), {0.5});
  ExpectNear(pow(F64({2, 3}, {2}), 2.0), {4, 9});
  ExpectNear(log(F64({-1}, {1})), {NAN});
  ExpectNear(relu(F64({NAN}, {1})), {NAN});
}

TEST(UnaryOpTest, HandComputedGradients) {
  Tensor x = F64({-2, -0.5, 0.5, 2}, {4});
  x.set_requires_grad(true);
  auto grad = [&](Tensor y) {
    absl::StatusOr<TensorList> g =
        autograd::Grad({y}, {Tensor::Full(y.shape(), 1, DType::kFloat64)}, {x}, {});
    EXPECT_TRUE(g.ok()) << g.status();
    return (*g)[0];
  };
  ExpectNear(grad(relu(x)), {0, 0, 1, 1});
  ExpectNear(grad(abs(x)), {-1, -1, 1, 1});
  ExpectNear(grad(clamp(x, -1.0, 1.0)), {0, 1, 1, 0});
  ExpectNear(grad(tanh(x)), {1 - std::pow(std::tanh(-2.0), 2), 1 - std::pow(std::tanh(-0.5), 2),
                             1 - std::pow(std::tanh(0.5), 2), 1 - std::pow(std::tanh(2.0), 2)});
  ExpectNear(grad(mul(x, 3.0)), {3, 3, 3, 3});
  ExpectNear(grad(pow(x, 2.0)), {-4, -1, 1, 4});
  ExpectNear(grad(pow(x, 0.0)), {0, 0, 0, 0});
  // abs has gradient 0 at 0, as in PyTorch.
  Tensor zero = F64({0}, {1});
  zero.set_requires_grad(true);
  absl::StatusOr<TensorList> g = autograd::Grad({abs(zero)}, {}, {zero}, {});
  ASSERT_TRUE(g.ok()) << g.status();
  ExpectNear((*g)[0], {0});
}

TEST(UnaryOpTest, IntegersAndBools) {
  Tensor i = Tensor::FromVector<int64_t>({-2, 0, 3}, {3});
  EXPECT_EQ(neg(i).dtype(), DType::kInt64);
  ExpectNear(neg(i), {2, 0, -3});
  // Note [Integer tensors wrap around]: -(-2^63) and |-2^63| are -2^63, as PyTorch's, with no
  // undefined behaviour (the request fuzzer's find, under UBSan).
  const Tensor min = Tensor::FromVector<int64_t>({INT64_MIN}, {1});
  EXPECT_EQ(neg(min).data<int64_t>()[0], INT64_MIN);
  EXPECT_EQ(abs(min).data<int64_t>()[0], INT64_MIN);
  EXPECT_EQ(abs(i).dtype(), DType::kInt64);
  EXPECT_EQ(relu(i).dtype(), DType::kInt64);
  ExpectNear(relu(i), {0, 0, 3});
  // Floating ops compute integers as float32, as PyTorch's do.
  EXPECT_EQ(exp(i).dtype(), DType::kFloat32);
  ExpectNear(exp(i), {std::exp(-2.0), 1, std::exp(3.0)}, 1e-6);
  EXPECT_EQ(mul(i, 2.5).dtype(), DType::kFloat32);
  EXPECT_EQ(clamp(i, -1.0, 1.0, /*integral_bounds=*/true).dtype(), DType::kInt64);
  ExpectNear(clamp(i, -1.0, 1.0, true), {-1, 0, 1});
  EXPECT_EQ(clamp(i, -1.0, 1.0).dtype(), DType::kFloat32);
  Tensor b = Tensor::FromVector<bool>({true, false}, {2});
  EXPECT_EQ(sigmoid(b).dtype(), DType::kFloat32);
  ExpectInvalid([&] { neg(b); }, "neg: input must be float32, float64 or int64, got bool");
  ExpectInvalid([&] { relu(b); }, "relu: input");
}

TEST(UnaryOpTest, InvalidArguments) {
  Tensor x = RandomInput({2}, 1);
  ExpectInvalid([&] { gelu(x, "fast"); }, "gelu: approximate must be 'none' or 'tanh'");
  ExpectInvalid([&] { clamp(x, std::nullopt, std::nullopt); }, "clamp: at least one of min");
  ExpectInvalid([&] { exp(Tensor()); }, "exp: input is an undefined tensor");
}

TEST(UnaryOpTest, BackwardNodeNames) {
  Tensor x = RandomInput({2}, 1, 0.5, 1);
  EXPECT_EQ(mul(x, 2.0).grad_fn()->name(), "MulBackward0");
  EXPECT_EQ(tanh(x).grad_fn()->name(), "TanhBackward0");
  EXPECT_EQ(exp(x).grad_fn()->name(), "ExpBackward0");
  EXPECT_EQ(relu(x).grad_fn()->name(), "ReluBackward0");
  EXPECT_EQ(gelu(x).grad_fn()->name(), "GeluBackward0");
  EXPECT_EQ(clamp(x, 0.0, 1.0).grad_fn()->name(), "ClampBackward1");
  EXPECT_EQ(pow(x, 2.0).grad_fn()->name(), "PowBackward0");
  EXPECT_EQ(pow(x, x).grad_fn()->name(), "PowBackward1");
  EXPECT_EQ(add(x, x).grad_fn()->name(), "AddBackward0");
  EXPECT_EQ(rsub(x, 1.0).grad_fn()->name(), "RsubBackward1");
  EXPECT_EQ(to(x, DType::kFloat32).grad_fn()->name(), "ToCopyBackward0");
}

TEST(UnaryOpTest, SecondBackwardThroughFreedGraphFails) {
  Tensor x = RandomInput({2}, 1);
  Tensor y = tanh(x);
  ASSERT_TRUE(autograd::Grad({y}, {Tensor::Full({2}, 1, DType::kFloat64)}, {x}, {}).ok());
  absl::StatusOr<TensorList> again =
      autograd::Grad({y}, {Tensor::Full({2}, 1, DType::kFloat64)}, {x}, {});
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition) << again.status();
  EXPECT_NE(std::string(again.status().message()).find("TanhBackward0"), std::string::npos);
}

// --- Binary ops ---

struct BinaryCase {
  std::string name;
  Tensor (*fn)(const Tensor&, const Tensor&);
  double (*reference)(double, double);
  double low0, high0, low1, high1;
};

Tensor Add2(const Tensor& a, const Tensor& b) { return add(a, b, 2); }
double RefAdd2(double a, double b) { return a + 2 * b; }
Tensor SubHalf(const Tensor& a, const Tensor& b) { return sub(a, b, 0.5); }
double RefSubHalf(double a, double b) { return a - 0.5 * b; }
Tensor Mul(const Tensor& a, const Tensor& b) { return mul(a, b); }
double RefMul(double a, double b) { return a * b; }
Tensor Div(const Tensor& a, const Tensor& b) { return div(a, b); }
double RefDiv(double a, double b) { return a / b; }
Tensor Pow(const Tensor& a, const Tensor& b) { return pow(a, b); }
double RefPow(double a, double b) { return std::pow(a, b); }
// where with a fixed pattern of conditions, broadcast like the operands.
Tensor WherePattern(const Tensor& a, const Tensor& b) {
  absl::StatusOr<Shape> shape = BroadcastShapes(a.shape(), b.shape());
  if (!shape.ok()) return where(Tensor::FromVector<bool>({true}, {1}), a, b);  // must throw
  Tensor c = Tensor::Empty(*shape, DType::kBool);
  for (int64_t i = 0; i < c.numel(); ++i) c.data<bool>()[i] = i % 3 != 1;
  return where(c, a, b);
}

const std::vector<BinaryCase>& BinaryCases() {
  static const std::vector<BinaryCase> cases = {
      {"add", &Add2, &RefAdd2, -1, 1, -1, 1},    {"sub", &SubHalf, &RefSubHalf, -1, 1, -1, 1},
      {"mul", &Mul, &RefMul, -1, 1, -1, 1},      {"div", &Div, &RefDiv, -1, 1, 0.5, 2},
      {"pow", &Pow, &RefPow, 0.5, 2, -1.5, 1.5}, {"where", &WherePattern, nullptr, -1, 1, -1, 1},
  };
  return cases;
}

class BinaryOpTest : public ::testing::TestWithParam<BinaryCase> {};

TEST_P(BinaryOpTest, ForwardBroadcastsAsNumPy) {
  const BinaryCase& c = GetParam();
  if (c.reference == nullptr) return;  // where: WhereForwardAndGradients checks it by hand
  Tensor a = RandomInput({2, 1}, 1, c.low0, c.high0, false);
  Tensor b = RandomInput({3}, 2, c.low1, c.high1, false);
  Tensor y = c.fn(a, b);
  EXPECT_EQ(y.shape(), (Shape{2, 3}));
  const std::vector<double> va = Values(a), vb = Values(b);
  std::vector<double> expected;
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) expected.push_back(c.reference(va[i], vb[j]));
  }
  ExpectNear(y, expected);
  // float32 agrees.
  ExpectNear(c.fn(a.To(DType::kFloat32), b.To(DType::kFloat32)), expected, 1e-5);
}

TEST_P(BinaryOpTest, GradCheckOverBroadcastShapes) {
  const BinaryCase& c = GetParam();
  uint32_t seed = 100;
  for (const auto& [sa, sb] : kBinaryShapes) {
    for (bool swap : {false, true}) {
      const Shape& s0 = swap ? sb : sa;
      const Shape& s1 = swap ? sa : sb;
      Tensor a = RandomInput(s0, seed++, c.low0, c.high0);
      Tensor b = RandomInput(s1, seed++, c.low1, c.high1);
      auto fn = [&c](const TensorList& in) { return TensorList{c.fn(in[0], in[1])}; };
      EXPECT_TRUE(GradCheck(fn, {a, b}))
          << c.name << " " << ShapeToString(s0) << " " << ShapeToString(s1);
      EXPECT_TRUE(GradGradCheck(fn, {a, b}))
          << c.name << " " << ShapeToString(s0) << " " << ShapeToString(s1);
    }
  }
}

TEST_P(BinaryOpTest, GradCheckWithOneInputConstant) {
  const BinaryCase& c = GetParam();
  Tensor a = RandomInput({2, 3}, 5, c.low0, c.high0);
  Tensor b = RandomInput({3}, 6, c.low1, c.high1, /*requires_grad=*/false);
  auto fn = [&c](const TensorList& in) { return TensorList{c.fn(in[0], in[1])}; };
  EXPECT_TRUE(GradCheck(fn, {a, b}));
  EXPECT_TRUE(GradGradCheck(fn, {a, b}));
  // Nothing requires grad: nothing to check, and that is no failure.
  EXPECT_TRUE(GradCheck(fn, {a.detach(), b.detach()}));
}

// Binary ops whose operands are themselves results: each saves them with their grad_fn, which a
// double backward must reach (SavedVariable keeps such a tensor as it is).
TEST(BinaryOpTest, SecondDerivativesThroughSavedIntermediates) {
  Tensor x = RandomInput({2, 3}, 11);
  Tensor y = RandomInput({3}, 12);
  auto fn = [](const TensorList& in) {
    const Tensor a = ops::sin(in[0]);
    const Tensor b = ops::tanh(in[1]);
    return TensorList{ops::mul(ops::mul(a, b), ops::div(b, ops::exp(a)))};
  };
  EXPECT_TRUE(GradCheck(fn, {x, y}));
  EXPECT_TRUE(GradGradCheck(fn, {x, y}));
}

TEST_P(BinaryOpTest, ShapeMismatchIsInvalidArgument) {
  const BinaryCase& c = GetParam();
  Tensor a = RandomInput({2, 3}, 1, c.low0, c.high0);
  Tensor b = RandomInput({4}, 2, c.low1, c.high1);
  ExpectInvalid([&] { c.fn(a, b); }, "shapes [2, 3] and [4] cannot be broadcast");
}

INSTANTIATE_TEST_SUITE_P(Ops, BinaryOpTest, ::testing::ValuesIn(BinaryCases()),
                         [](const ::testing::TestParamInfo<BinaryCase>& info) {
                           return info.param.name;
                         });

TEST(BinaryOpTest, ErrorMessagesNameTheOp) {
  Tensor a = RandomInput({2, 3}, 1);
  Tensor b = RandomInput({4}, 2);
  ExpectInvalid([&] { mul(a, b); }, "mul: shapes [2, 3] and [4] cannot be broadcast");
  ExpectInvalid([&] { add(a, Tensor()); }, "add: other is an undefined tensor");
  Tensor flags = Tensor::FromVector<bool>({true}, {1});
  ExpectInvalid([&] { sub(flags, flags); }, "sub: input must be float32, float64 or int64");
  ExpectInvalid([&] { where(a, a, a); }, "where: condition must be bool, got float64");
  Tensor i = Tensor::FromVector<int64_t>({2}, {1});
  ExpectInvalid([&] { add(i, i, 0.5); }, "add: alpha must be an integer");
  ExpectInvalid([&] { pow(i, Tensor::FromVector<int64_t>({-1}, {1})); },
                "pow: integers to negative integer powers are not allowed");
}

TEST(BinaryOpTest, DTypePromotionFollowsPyTorch) {
  Tensor f32 = Tensor::Full({3}, 1.5, DType::kFloat32);
  Tensor f64 = Tensor::Full({3}, 2.0, DType::kFloat64);
  Tensor f64_0d = Tensor::Scalar(2.0, DType::kFloat64);
  Tensor f32_0d = Tensor::Scalar(2.0, DType::kFloat32);
  Tensor i64 = Tensor::FromVector<int64_t>({1, 2, 3}, {3});
  Tensor b = Tensor::FromVector<bool>({true, false, true}, {3});
  EXPECT_EQ(add(f32, f64).dtype(), DType::kFloat64);
  EXPECT_EQ(mul(f32, f64_0d).dtype(), DType::kFloat32);  // dimensioned wins in its category
  EXPECT_EQ(mul(f32_0d, f64_0d).dtype(), DType::kFloat64);
  EXPECT_EQ(mul(i64, f64_0d).dtype(), DType::kFloat64);  // a 0-d float beats dimensioned ints
  EXPECT_EQ(add(i64, i64).dtype(), DType::kInt64);
  ExpectNear(add(i64, i64, 2), {3, 6, 9});
  EXPECT_EQ(add(i64, b).dtype(), DType::kInt64);
  EXPECT_EQ(div(i64, i64).dtype(), DType::kFloat32);
  ExpectNear(div(i64, Tensor::FromVector<int64_t>({2, 4, 2}, {3})), {0.5, 0.5, 1.5});
  EXPECT_EQ(pow(i64, i64).dtype(), DType::kInt64);
  ExpectNear(pow(i64, i64), {1, 4, 27});
  // bool + bool is logical or, bool * bool logical and.
  EXPECT_EQ(add(b, b).dtype(), DType::kBool);
  ExpectNear(add(b, Tensor::FromVector<bool>({false, false, true}, {3})), {1, 0, 1});
  ExpectNear(mul(b, Tensor::FromVector<bool>({false, false, true}, {3})), {0, 0, 1});
}

TEST(BinaryOpTest, MixedPrecisionGradientsComeBackInEachInputsDType) {
  Tensor a = Tensor::Full({2}, 3, DType::kFloat32);
  a.set_requires_grad(true);
  Tensor b = Tensor::Full({2}, 4, DType::kFloat64);
  b.set_requires_grad(true);
  Tensor y = mul(a, b);
  EXPECT_EQ(y.dtype(), DType::kFloat64);
  absl::StatusOr<TensorList> g =
      autograd::Grad({y}, {Tensor::Full({2}, 1, DType::kFloat64)}, {a, b}, {});
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ((*g)[0].dtype(), DType::kFloat32);
  EXPECT_EQ((*g)[1].dtype(), DType::kFloat64);
  ExpectNear((*g)[0], {4, 4});
  ExpectNear((*g)[1], {3, 3});
}

TEST(BinaryOpTest, WhereForwardAndGradients) {
  Tensor c = Tensor::FromVector<bool>({true, false, true}, {3});
  Tensor x = F64({1, 2, 3}, {3});
  x.set_requires_grad(true);
  Tensor y = F64({10}, {1});
  y.set_requires_grad(true);
  Tensor out = where(c, x, y);
  ExpectNear(out, {1, 10, 3});
  absl::StatusOr<TensorList> g = autograd::Grad({out}, {F64({1, 2, 3}, {3})}, {x, y}, {});
  ASSERT_TRUE(g.ok()) << g.status();
  ExpectNear((*g)[0], {1, 0, 3});
  ExpectNear((*g)[1], {2});
  // The condition broadcasts too.
  ExpectNear(where(Tensor::FromVector<bool>({false}, {1}), x, y), {10, 10, 10});
}

TEST(BinaryOpTest, PowGradientAtZeroBaseFollowsPyTorch) {
  Tensor x = F64({0, 0, 2}, {3});
  x.set_requires_grad(true);
  Tensor e = F64({2, 0, 0}, {3});
  e.set_requires_grad(true);
  Tensor y = pow(x, e);
  ExpectNear(y, {0, 1, 1});
  absl::StatusOr<TensorList> g =
      autograd::Grad({y}, {Tensor::Full({3}, 1, DType::kFloat64)}, {x, e}, {});
  ASSERT_TRUE(g.ok()) << g.status();
  ExpectNear((*g)[0], {0, 0, 0});
  ExpectNear((*g)[1], {0, 0, std::log(2.0)});
}

// --- sum_to and broadcast_to ---

TEST(BroadcastTest, SumToReducesLeadingAndSizeOneDims) {
  Tensor g = F64({1, 2, 3, 4, 5, 6}, {2, 3});
  ExpectNear(sum_to(g, {3}), {5, 7, 9});
  ExpectNear(sum_to(g, {2, 1}), {6, 15});
  ExpectNear(sum_to(g, {}), {21});
  EXPECT_TRUE(sum_to(g, {2, 3}).is_same(g));
  EXPECT_EQ(sum_to(g, {1, 1}).shape(), (Shape{1, 1}));
  ExpectInvalid([&] { sum_to(g, {2}); }, "sum_to: shape [2] cannot be broadcast to [2, 3]");
}

TEST(BroadcastTest, BroadcastToIsAView) {
  Tensor x = F64({1, 2}, {2, 1});
  Tensor y = broadcast_to(x, {3, 2, 2});
  EXPECT_EQ(y.shape(), (Shape{3, 2, 2}));
  EXPECT_EQ(y.storage(), x.storage());
  ExpectNear(y, {1, 1, 2, 2, 1, 1, 2, 2, 1, 1, 2, 2});
  ExpectInvalid([&] { broadcast_to(x, {3}); }, "broadcast_to: shape [2, 1] cannot be broadcast");
  ExpectInvalid([&] { broadcast_to(x, {-1, 1}); }, "broadcast_to: invalid shape [-1, 1]");
}

TEST(BroadcastTest, GradChecks) {
  for (const auto& [from, to] : std::vector<std::pair<Shape, Shape>>{{{2, 3}, {3}},
                                                                     {{2, 3}, {2, 1}},
                                                                     {{2, 3}, {}},
                                                                     {{4, 1, 3}, {1, 3}},
                                                                     {{0, 3}, {3}},
                                                                     {{2, 0}, {1}}}) {
    Tensor g = RandomInput(from, 3);
    auto sum_fn = [to = to](const TensorList& in) { return TensorList{sum_to(in[0], to)}; };
    EXPECT_TRUE(GradCheck(sum_fn, {g})) << ShapeToString(from) << " to " << ShapeToString(to);
    EXPECT_TRUE(GradGradCheck(sum_fn, {g})) << ShapeToString(from);
    Tensor x = RandomInput(to, 4);
    auto expand_fn = [from = from](const TensorList& in) {
      return TensorList{broadcast_to(in[0], from)};
    };
    EXPECT_TRUE(GradCheck(expand_fn, {x})) << ShapeToString(to) << " to " << ShapeToString(from);
    EXPECT_TRUE(GradGradCheck(expand_fn, {x})) << ShapeToString(to);
  }
}

// --- Strided inputs ---

TEST(StridedTest, NonContiguousOperandsUseTheStridedWalk) {
  Tensor base = F64({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor t = base.AsStrided({3, 2}, {1, 3}, 0);  // the transpose
  ExpectNear(mul(t, 2.0), {2, 8, 4, 10, 6, 12});
  ExpectNear(add(t, F64({10, 20}, {2})), {11, 24, 12, 25, 13, 26});
  ExpectNear(exp(t), {std::exp(1.0), std::exp(4.0), std::exp(2.0), std::exp(5.0), std::exp(3.0),
                      std::exp(6.0)});
}

// --- Registry ---

TEST(RegistryTest, ElementwiseOpsRunThroughTheirSchemas) {
  const OpRegistry& registry = OpRegistry::Get();
  for (const char* name :
       {"add", "sub", "mul", "div",  "neg",     "pow",  "exp",  "log",      "sqrt",  "rsqrt",
        "abs", "sin", "cos", "tanh", "sigmoid", "relu", "gelu", "softplus", "clamp", "where"}) {
    const OpSchema* schema = registry.Find(name);
    ASSERT_NE(schema, nullptr) << name;
    EXPECT_FALSE(schema->doc.empty()) << name;
    for (const AttrSpec& attr : schema->attrs) EXPECT_FALSE(attr.doc.empty()) << name;
  }
  Tensor x = F64({1, 2}, {2});
  const OpSchema* mul_op = registry.Find("mul");
  ExpectNear(mul_op->run({x}, Attrs({{"other", 3.0}}))[0], {3, 6});
  ExpectNear(mul_op->run({x, x}, Attrs())[0], {1, 4});
  ExpectInvalid([&] { mul_op->run({x, x}, Attrs({{"other", 3.0}})); }, "not both");
  ExpectInvalid([&] { mul_op->run({x}, Attrs()); }, "mul: other is missing");
  // An int scalar keeps an int64 tensor int64; a float one makes it float32.
  Tensor i = Tensor::FromVector<int64_t>({1, 2}, {2});
  EXPECT_EQ(mul_op->run({i}, Attrs({{"other", int64_t{3}}}))[0].dtype(), DType::kInt64);
  EXPECT_EQ(mul_op->run({i}, Attrs({{"other", 3.0}}))[0].dtype(), DType::kFloat32);
  ExpectNear(registry.Find("add")->run({x}, Attrs({{"other", 1.0}, {"alpha", 2.0}}))[0], {3, 4});
  ExpectNear(registry.Find("pow")->run({x}, Attrs({{"exponent", 2.0}}))[0], {1, 4});
  ExpectNear(registry.Find("clamp")->run({x}, Attrs({{"max", 1.5}}))[0], {1, 1.5});
  EXPECT_EQ(registry.Find("clamp")->run({i}, Attrs({{"max", int64_t{1}}}))[0].dtype(),
            DType::kInt64);
  ExpectNear(registry.Find("gelu")->run({x}, Attrs({{"approximate", std::string("tanh")}}))[0],
             Values(gelu(x, "tanh")));
  ExpectNear(registry.Find("softplus")->run({x}, Attrs({{"beta", 2.0}}))[0],
             Values(softplus(x, 2)));
  Tensor c = Tensor::FromVector<bool>({true, false}, {2});
  ExpectNear(registry.Find("where")->run({c, x, neg(x)}, Attrs())[0], {1, -2});
}

}  // namespace
}  // namespace gradserve::ops
