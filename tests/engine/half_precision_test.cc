// float16 and bfloat16: the conversions, PyTorch's promotion, and ops through the registry
// computing in float32 with 16-bit results and gradients (Note [Half precision computes in
// float32], Note [Ops on 16-bit floats]). Each graph runs twice: on 16-bit leaves, and on the
// same values in float32; the two must agree within the 16-bit type's precision.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/autograd/autograd.h"
#include "engine/kernels/basic_kernels.h"
#include "engine/kernels/op_kernels.h"
#include "engine/ops/op_registry.h"
#include "engine/tensor/half.h"
#include "engine/util/math_mode.h"
#include "gtest/gtest.h"
#include "tests/engine/cuda_test_util.h"
#include "tests/engine/op_test_util.h"

namespace gradserve {
namespace {

using ::gradserve::ops::Attrs;
using ::gradserve::ops::OpRegistry;
using ::gradserve::testing::op_test::ExpectInvalid;

float HalfValue(uint16_t bits) { return static_cast<float>(Half::FromBits(bits)); }
uint16_t HalfBits(float f) { return Half(f).bits; }
uint16_t BFloat16Bits(float f) { return BFloat16(f).bits; }

TEST(HalfConversionTest, RoundsToNearestEvenWithOverflowToInfinity) {
  EXPECT_EQ(HalfBits(1.0f), 0x3C00);
  EXPECT_EQ(HalfBits(-2.0f), 0xC000);
  EXPECT_EQ(HalfBits(-0.0f), 0x8000);
  EXPECT_EQ(HalfBits(65504.0f), 0x7BFF);  // the largest half
  EXPECT_EQ(HalfBits(65519.0f), 0x7BFF);  // below the midpoint to 65536
  EXPECT_EQ(HalfBits(65520.0f), 0x7C00);  // the midpoint rounds (to even) to infinity
  EXPECT_EQ(HalfBits(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(HalfBits(1.0f + std::ldexp(1.0f, -11)), 0x3C00);      // a tie: to even, down
  EXPECT_EQ(HalfBits(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);  // a tie: to even, up
  EXPECT_EQ(HalfBits(std::ldexp(1.0f, -14)), 0x0400);             // the least normal
  EXPECT_EQ(HalfBits(std::ldexp(1.0f, -24)), 0x0001);             // the least subnormal
  EXPECT_EQ(HalfBits(std::ldexp(1.0f, -25)), 0x0000);             // a tie: to even, zero
  EXPECT_EQ(HalfBits(std::ldexp(3.0f, -26)), 0x0001);             // above the tie
  EXPECT_EQ(HalfBits(std::ldexp(1023.5f, -24)), 0x0400);  // a subnormal carries into the normals
  EXPECT_TRUE(std::isnan(HalfValue(HalfBits(std::nanf("")))));
  EXPECT_EQ(HalfValue(0x3555), 0.333251953125f);
  EXPECT_EQ(HalfValue(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(HalfValue(0xFC00), -std::numeric_limits<float>::infinity());
}

TEST(HalfConversionTest, EveryHalfAndBFloat16RoundTripsThroughFloat) {
  for (uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    const float h = HalfValue(static_cast<uint16_t>(bits));
    const float b = static_cast<float>(BFloat16::FromBits(static_cast<uint16_t>(bits)));
    if (std::isnan(h)) {
      EXPECT_TRUE(std::isnan(HalfValue(HalfBits(h))));
    } else {
      ASSERT_EQ(HalfBits(h), bits) << h;
    }
    if (std::isnan(b)) {
      EXPECT_TRUE(std::isnan(static_cast<float>(BFloat16(b))));
    } else {
      ASSERT_EQ(BFloat16Bits(b), bits) << b;
    }
  }
}

TEST(HalfConversionTest, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(BFloat16Bits(1.0f), 0x3F80);
  EXPECT_EQ(BFloat16Bits(1.0f + std::ldexp(1.0f, -8)), 0x3F80);        // a tie: down to even
  EXPECT_EQ(BFloat16Bits(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);    // a tie: up to even
  EXPECT_EQ(BFloat16Bits(std::numeric_limits<float>::max()), 0x7F80);  // rounds to infinity
  EXPECT_EQ(BFloat16Bits(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_TRUE(std::isnan(static_cast<float>(BFloat16(std::nanf("")))));
}

TEST(HalfDTypeTest, NamesSizesAndPromotion) {
  EXPECT_EQ(ElementSize(DType::kFloat16), 2u);
  EXPECT_EQ(ElementSize(DType::kBFloat16), 2u);
  EXPECT_TRUE(IsFloating(DType::kBFloat16));
  EXPECT_EQ(ParseDType("half"), DType::kFloat16);
  EXPECT_EQ(ParseDType("bfloat16"), DType::kBFloat16);
  EXPECT_STREQ(DTypeName(DType::kFloat16), "float16");
  using ops::PromoteTypes;
  // torch.promote_types.
  EXPECT_EQ(PromoteTypes(DType::kFloat16, DType::kBFloat16), DType::kFloat32);
  EXPECT_EQ(PromoteTypes(DType::kFloat16, DType::kFloat32), DType::kFloat32);
  EXPECT_EQ(PromoteTypes(DType::kBFloat16, DType::kFloat64), DType::kFloat64);
  EXPECT_EQ(PromoteTypes(DType::kInt64, DType::kFloat16), DType::kFloat16);
  EXPECT_EQ(PromoteTypes(DType::kBFloat16, DType::kBool), DType::kBFloat16);
  // torch.result_type: a float scalar or a 0-d float32 tensor keeps a 16-bit tensor's dtype.
  const Tensor h = Tensor::Zeros({3}, DType::kFloat16);
  const Tensor f0 = Tensor::Zeros({}, DType::kFloat32);
  const Tensor i = Tensor::Zeros({3}, DType::kInt64);
  const Tensor b0 = Tensor::Zeros({}, DType::kBFloat16);
  EXPECT_EQ(ops::ResultType({&h}, ops::ScalarKind::kFloat), DType::kFloat16);
  EXPECT_EQ(ops::ResultType({&h, &f0}), DType::kFloat16);
  EXPECT_EQ(ops::ResultType({&i, &b0}), DType::kBFloat16);
}

TEST(HalfDTypeTest, BasicKernelsReadAndWrite16Bits) {
  const Tensor x = Tensor::FromVector<float>({1.5f, -2.25f, 65504.f, 1e-3f}, {4});
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    const Tensor h = x.To(dtype);
    EXPECT_EQ(h.dtype(), dtype);
    const Tensor back = h.To(DType::kFloat64);
    EXPECT_EQ(back.data<double>()[0], 1.5);
    EXPECT_EQ(back.data<double>()[1], -2.25);
    const Tensor sum = AddSameShape(h, h);
    EXPECT_EQ(sum.To(DType::kFloat32).data<float>()[0], 3.0f);
    AccumulateInto(sum, h);
    EXPECT_EQ(sum.To(DType::kFloat32).data<float>()[1], -6.75f);
    EXPECT_FALSE(HasNaN(h));
    Fill(sum, std::nan(""));
    EXPECT_TRUE(HasNaN(sum));
    EXPECT_EQ(Tensor::Scalar(0.1, dtype).item(),
              static_cast<double>(h.dtype() == DType::kFloat16 ? HalfValue(HalfBits(0.1f))
                                                               : float(BFloat16(0.1f))));
  }
  // float16 overflows at 65520, bfloat16 does not.
  EXPECT_TRUE(std::isinf(Tensor::Scalar(70000, DType::kFloat16).item()));
  EXPECT_EQ(Tensor::Scalar(70000, DType::kBFloat16).item(), 70144);
}

TensorList RunOps(const char* op, const TensorList& inputs, const Attrs& attrs = {}) {
  const ops::OpSchema* schema = OpRegistry::Get().Find(op);
  EXPECT_NE(schema, nullptr) << op;
  if (schema == nullptr) return {};  // .at(0) then throws: the test fails, nothing crashes
  return schema->run(inputs, attrs);
}
Tensor RunOp(const char* op, const TensorList& inputs, const Attrs& attrs = {}) {
  return RunOps(op, inputs, attrs).at(0);
}

std::vector<float> Floats(const Tensor& t) {
  const Tensor f = t.To(DType::kFloat32).contiguous();
  return std::vector<float>(f.data<float>(), f.data<float>() + f.numel());
}

// Deterministic values in [-1, 1), rounded to dtype and kept as a leaf of that dtype.
Tensor Leaf(absl::Span<const int64_t> shape, int seed, DType dtype) {
  std::vector<float> v(static_cast<size_t>(CheckedNumel(shape).value()));
  uint32_t state = 2654435761u * static_cast<uint32_t>(seed + 1);
  for (float& x : v) {
    state = state * 1664525u + 1013904223u;
    x = static_cast<float>(state >> 8) / static_cast<float>(1 << 23) - 1.0f;
  }
  Tensor t = Tensor::FromVector(v, shape).To(dtype);
  t.set_requires_grad(true);
  return t;
}

// The same values as a float32 leaf.
Tensor AsFloat32Leaf(const Tensor& leaf) {
  Tensor t = leaf.detach().To(DType::kFloat32);
  t.set_requires_grad(true);
  return t;
}

void ExpectClose(const Tensor& got, const Tensor& want, double tol, const std::string& what) {
  const std::vector<float> g = Floats(got), w = Floats(want);
  ASSERT_EQ(g.size(), w.size()) << what;
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_NEAR(g[i], w[i], tol * (1 + std::abs(w[i]))) << what << " [" << i << "]";
  }
}

// A small MLP with a broadcast bias (expand, whose backward sums in float32), an in-place
// activation and a value used twice (its gradients accumulate in 16 bits).
struct MlpResult {
  Tensor loss;
  TensorList grads;
};
MlpResult Mlp(const Tensor& x, const Tensor& w, const Tensor& b) {
  Attrs size;
  size.set("size", std::vector<int64_t>{4, 6});
  Tensor h = RunOp("add", {RunOp("linear", {x, w}), RunOp("expand", {b}, size)});
  h = RunOp("relu_", {h});
  const Tensor t = RunOp("tanh", {h});
  const Tensor loss = RunOp("sum", {RunOp("mul", {t, RunOp("add", {t, h})})});
  auto grads = autograd::Grad({loss}, {Tensor()}, {x, w, b}, {});
  EXPECT_TRUE(grads.ok()) << grads.status();
  return {loss, grads.ok() ? *grads : TensorList{}};
}

class HalfOpsTest : public ::testing::TestWithParam<DType> {
 protected:
  // Relative tolerance: a few units in the last place of a 16-bit result.
  double tol() const { return GetParam() == DType::kFloat16 ? 4e-3 : 3e-2; }
};

// One row per op of OpsComputing16Bit (Note [Ops on 16-bit floats]).
struct Computes16BitCase {
  const char* op;
  int inputs;     // tensor inputs, all leaves but an in-place op's self
  bool in_place;  // self is a non-leaf copy of the first leaf
  Attrs attrs;
};

std::vector<Computes16BitCase> Computes16BitCases() {
  std::vector<Computes16BitCase> cases = {
      {"add", 2, false, {}},     {"sub", 2, false, {}},     {"mul", 2, false, {}},
      {"div", 2, false, {}},     {"add_", 2, true, {}},     {"sub_", 2, true, {}},
      {"mul_", 2, true, {}},     {"div_", 2, true, {}},     {"abs", 1, false, {}},
      {"neg", 1, false, {}},     {"exp", 1, false, {}},     {"log", 1, false, {}},
      {"sqrt", 1, false, {}},    {"rsqrt", 1, false, {}},   {"sin", 1, false, {}},
      {"cos", 1, false, {}},     {"tanh", 1, false, {}},    {"tanh_", 1, true, {}},
      {"sigmoid", 1, false, {}}, {"sigmoid_", 1, true, {}}, {"relu", 1, false, {}},
      {"relu_", 1, true, {}},    {"gelu", 1, false, {}},    {"sum", 1, false, {}},
  };
  return cases;
}

// Values in [0.25, 0.75): log, sqrt, rsqrt and div see ordinary values.
Tensor Positive(absl::Span<const int64_t> shape, int seed, DType dtype, Device device) {
  const Tensor raw = Leaf(shape, seed, DType::kFloat32).detach();
  Tensor t = Tensor::Empty(shape, DType::kFloat32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = 0.5f + 0.25f * raw.data<float>()[i];
  return t.To(dtype).To(device);
}

// op's value, its gradients and its second derivatives (through a create_graph pass) for 16-bit
// or float32 leaves of the same values, all computed on `device`.
TensorList ValueAndDerivatives(const Computes16BitCase& c, DType dtype, Device device) {
  const Shape shape = {3, 4};
  TensorList leaves;
  for (int k = 0; k < c.inputs; ++k) {
    Tensor leaf = Positive(shape, 30 + k, dtype, device);
    leaf.set_requires_grad(true);
    leaves.push_back(leaf);
  }
  TensorList inputs = leaves;
  if (c.in_place) inputs[0] = RunOp("mul", {leaves[0], Tensor::Scalar(1, dtype, device)});
  const Tensor out = RunOp(c.op, inputs, c.attrs);
  const Tensor seed = Positive(out.shape(), 40, dtype, device);
  const Tensor loss = RunOp("sum", {RunOp("mul", {out, seed})});
  autograd::BackwardOptions create;
  create.create_graph = true;
  create.retain_graph = true;
  auto grads = autograd::Grad({loss}, {Tensor()}, leaves, create);
  EXPECT_TRUE(grads.ok()) << c.op << ": " << grads.status();
  if (!grads.ok()) return {};
  Tensor total;
  for (int k = 0; k < c.inputs; ++k) {
    const Tensor term =
        RunOp("sum", {RunOp("mul", {(*grads)[k], Positive(shape, 50 + k, dtype, device)})});
    total = k == 0 ? term : RunOp("add", {total, term});
  }
  autograd::BackwardOptions zeros;
  zeros.materialize_grads = true;
  TensorList result = {out};
  for (const Tensor& g : *grads) result.push_back(g);
  if (total.requires_grad()) {  // relu's, abs's and sum's gradients are constant
    auto second = autograd::Grad({total}, {Tensor()}, leaves, zeros);
    EXPECT_TRUE(second.ok()) << c.op << ": " << second.status();
    if (second.ok()) result.insert(result.end(), second->begin(), second->end());
  }
  return result;
}

void ExpectComputes16Bit(DType dtype, Device device, double tol) {
  std::vector<std::string> listed;
  for (absl::string_view op : ops::OpsComputing16Bit()) listed.emplace_back(op);
  std::vector<std::string> tested;
  for (const Computes16BitCase& c : Computes16BitCases()) {
    tested.emplace_back(c.op);
    SCOPED_TRACE(c.op);
    try {
      const TensorList half = ValueAndDerivatives(c, dtype, device);
      const TensorList full = ValueAndDerivatives(c, DType::kFloat32, device);
      if (half.size() != full.size()) {
        ADD_FAILURE() << c.op << ": " << half.size() << " results in 16 bits, " << full.size()
                      << " in float32";
        continue;
      }
      for (size_t i = 0; i < half.size(); ++i) {
        EXPECT_EQ(half[i].dtype(), dtype) << "result " << i;
        // Second derivatives pass through more roundings.
        ExpectClose(half[i].To(kCPU), full[i].To(kCPU),
                    i <= static_cast<size_t>(c.inputs) ? tol : 3 * tol,
                    absl::StrCat(c.op, " result ", i));
      }
    } catch (const StatusError& e) {
      ADD_FAILURE() << c.op << ": " << e.status();
    }
  }
  std::sort(listed.begin(), listed.end());
  std::sort(tested.begin(), tested.end());
  EXPECT_EQ(listed, tested) << "each op of OpsComputing16Bit needs a row here, and only those";
}

TEST_P(HalfOpsTest, EveryOpComputing16BitMatchesFloat32) {
  ExpectComputes16Bit(GetParam(), kCPU, tol());
}

TEST_P(HalfOpsTest, MlpForwardAndGradientsMatchFloat32) {
  const DType dtype = GetParam();
  const Tensor x = Leaf({4, 8}, 1, dtype), w = Leaf({6, 8}, 2, dtype), b = Leaf({1, 6}, 3, dtype);
  const MlpResult half = Mlp(x, w, b);
  const MlpResult full = Mlp(AsFloat32Leaf(x), AsFloat32Leaf(w), AsFloat32Leaf(b));
  EXPECT_EQ(half.loss.dtype(), dtype);
  ExpectClose(half.loss, full.loss, tol(), "loss");
  ASSERT_EQ(half.grads.size(), 3u);
  const char* names[] = {"x", "w", "b"};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(half.grads[i].dtype(), dtype) << names[i];
    ExpectClose(half.grads[i], full.grads[i], tol(), names[i]);
  }
}

TEST_P(HalfOpsTest, ViewsStayViewsAndInPlaceWritesThe16BitTensor) {
  const DType dtype = GetParam();
  Tensor x = Leaf({2, 3}, 4, dtype);
  const Tensor y = RunOp("mul", {x, Tensor::Scalar(2, dtype)});
  Attrs dims;
  dims.set("dim0", int64_t{0});
  dims.set("dim1", int64_t{1});
  const Tensor view = RunOp("transpose", {y}, dims);
  EXPECT_EQ(view.dtype(), dtype);
  EXPECT_EQ(view.storage(), y.storage());
  const int64_t version = y.version();
  const Tensor written = RunOp("mul_", {y, Tensor::Scalar(3, DType::kFloat32)});
  EXPECT_TRUE(written.is_same(y));
  EXPECT_EQ(y.dtype(), dtype);
  EXPECT_GT(y.version(), version);
  EXPECT_EQ(Floats(view)[1], Floats(y)[3]);  // the view sees the write
  EXPECT_NEAR(Floats(y)[3], Floats(x)[3] * 6, tol() * 6);
  auto grads = autograd::Grad({RunOp("sum", {y})}, {Tensor()}, {x}, {});
  ASSERT_TRUE(grads.ok()) << grads.status();
  EXPECT_EQ((*grads)[0].dtype(), dtype);
  for (float g : Floats((*grads)[0])) EXPECT_EQ(g, 6.0f);
}

TEST_P(HalfOpsTest, MixedDtypesPromoteAsPyTorch) {
  const DType dtype = GetParam();
  const Tensor h = Leaf({3}, 5, dtype);
  const Tensor f = Leaf({3}, 6, DType::kFloat32);
  EXPECT_EQ(RunOp("add", {h, f}).dtype(), DType::kFloat32);
  const DType other = dtype == DType::kFloat16 ? DType::kBFloat16 : DType::kFloat16;
  EXPECT_EQ(RunOp("mul", {h, Leaf({3}, 7, other)}).dtype(), DType::kFloat32);
  EXPECT_EQ(RunOp("add", {h, Tensor::Scalar(1, DType::kFloat64)}).dtype(), dtype);  // 0-d
  Attrs dim;
  dim.set("dim", int64_t{0});
  const TensorList max = RunOps("max", {h}, dim);  // values keep the dtype, indices are int64
  EXPECT_EQ(max.at(0).dtype(), dtype);
  EXPECT_EQ(max.at(1).dtype(), DType::kInt64);
  Attrs to;
  to.set("dtype", std::string(DTypeName(dtype)));
  const Tensor back = RunOp("to", {f}, to);
  EXPECT_EQ(back.dtype(), dtype);
  auto grads = autograd::Grad({RunOp("sum", {RunOp("mul", {back, h})})}, {Tensor()}, {f, h}, {});
  ASSERT_TRUE(grads.ok()) << grads.status();
  EXPECT_EQ((*grads)[0].dtype(), DType::kFloat32);
  EXPECT_EQ((*grads)[1].dtype(), dtype);
}

TEST_P(HalfOpsTest, ArgumentErrorsNameTheOp) {
  const DType dtype = GetParam();
  const Tensor h = Leaf({3}, 8, dtype);
  ExpectInvalid([&] { RunOp("matmul", {h, Leaf({2}, 9, dtype)}); }, {"matmul"});
  Tensor leaf = Leaf({3}, 10, dtype);
  ExpectInvalid([&] { RunOp("relu_", {leaf}); }, {"relu_", "leaf"});
}

// The same leaves on a GPU, where matmul multiplies 16-bit matrices on tensor cores and every
// other op computes in float32 as on the CPU; skipped without a GPU.
class CudaHalfTest : public HalfOpsTest {
 protected:
  void SetUp() override {
    if (const std::string why = testing::GpuUnavailable(); !why.empty()) GTEST_SKIP() << why;
  }
  static Tensor OnGpu(const Tensor& leaf) {
    Tensor t = leaf.detach().To(testing::kGpu);
    t.set_requires_grad(true);
    return t;
  }
};

TEST_P(CudaHalfTest, MlpMatchesTheCpu) {
  const DType dtype = GetParam();
  const Tensor x = Leaf({4, 8}, 1, dtype), w = Leaf({6, 8}, 2, dtype), b = Leaf({1, 6}, 3, dtype);
  const MlpResult cpu = Mlp(x, w, b);
  const MlpResult gpu = Mlp(OnGpu(x), OnGpu(w), OnGpu(b));
  EXPECT_EQ(gpu.loss.device(), testing::kGpu);
  ExpectClose(gpu.loss.To(kCPU), cpu.loss, tol(), "loss");
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(gpu.grads[i].dtype(), dtype);
    ExpectClose(gpu.grads[i].To(kCPU), cpu.grads[i], tol(), "grad");
  }
}

// PyTorch CUDA's own loss and gradients for the same MLP on the same values, written by
// scripts/gpu/torch_half_reference.py, which scripts/gpu/check runs first and names in
// GRADSERVE_TORCH_HALF_REFERENCE; skipped without it.
TEST_P(CudaHalfTest, MlpMatchesPyTorchCuda) {
  const char* path = std::getenv("GRADSERVE_TORCH_HALF_REFERENCE");
  if (path == nullptr) GTEST_SKIP() << "GRADSERVE_TORCH_HALF_REFERENCE is not set";
  constexpr size_t kPerDtype = 1 + 4 * 8 + 6 * 8 + 6;  // loss, x, w, b
  std::vector<float> all(2 * kPerDtype);
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(all.data()), static_cast<std::streamsize>(all.size() * 4));
  ASSERT_TRUE(in) << "cannot read " << 2 * kPerDtype << " floats from " << path;
  const DType dtype = GetParam();
  const float* torch = all.data() + (dtype == DType::kFloat16 ? 0 : kPerDtype);
  const Tensor x = Leaf({4, 8}, 1, dtype), w = Leaf({6, 8}, 2, dtype), b = Leaf({1, 6}, 3, dtype);
  const MlpResult gpu = Mlp(OnGpu(x), OnGpu(w), OnGpu(b));
  ASSERT_EQ(gpu.grads.size(), 3u);
  auto reference = [&](size_t offset, std::vector<int64_t> shape) {
    const int64_t n = CheckedNumel(shape).value();
    return Tensor::FromVector(std::vector<float>(torch + offset, torch + offset + n), shape);
  };
  ExpectClose(gpu.loss.To(kCPU), reference(0, {}), tol(), "loss");
  ExpectClose(gpu.grads[0].To(kCPU), reference(1, {4, 8}), tol(), "grad x");
  ExpectClose(gpu.grads[1].To(kCPU), reference(1 + 32, {6, 8}), tol(), "grad w");
  ExpectClose(gpu.grads[2].To(kCPU), reference(1 + 32 + 48, {1, 6}), tol(), "grad b");
}

TEST_P(CudaHalfTest, EveryOpComputing16BitMatchesFloat32) {
  ExpectComputes16Bit(GetParam(), testing::kGpu, tol());
}

TEST_P(CudaHalfTest, BatchedMatmulOnTensorCoresMatchesFloat32) {
  const DType dtype = GetParam();
  const Tensor a = Leaf({3, 64, 128}, 11, dtype), b = Leaf({128, 96}, 12, dtype);
  const Tensor ga = OnGpu(a), gb = OnGpu(b);
  const Tensor got = RunOp("matmul", {ga, gb});
  EXPECT_EQ(got.dtype(), dtype);
  const Tensor fa = AsFloat32Leaf(a), fb = AsFloat32Leaf(b);
  const Tensor want = RunOp("matmul", {fa, fb});
  ExpectClose(got.To(kCPU), want, tol(), "matmul");
  // The gradients are 16-bit products on the GPU too, b's summed over the batch.
  auto g16 = autograd::Grad({RunOp("sum", {got})}, {Tensor()}, {ga, gb}, {});
  auto g32 = autograd::Grad({RunOp("sum", {want})}, {Tensor()}, {fa, fb}, {});
  ASSERT_TRUE(g16.ok()) << g16.status();
  ASSERT_TRUE(g32.ok()) << g32.status();
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ((*g16)[i].dtype(), dtype);
    ExpectClose((*g16)[i].To(kCPU), (*g32)[i], tol(), "grad");
  }
}

// Note [TF32 per request]: float32 products on the GPU use TF32 only under a MathModeScope that
// asks, in the forward pass and in the backward pass the scope's thread starts.
TEST(CudaMathModeTest, Tf32OnlyWhenAsked) {
  if (const std::string why = testing::GpuUnavailable(); !why.empty()) GTEST_SKIP() << why;
  const Tensor a = Leaf({256, 256}, 21, DType::kFloat32), b = Leaf({256, 256}, 22, DType::kFloat32);
  const Tensor exact =
      RunOp("matmul", {a.detach().To(DType::kFloat64), b.detach().To(DType::kFloat64)});
  auto max_error = [&](const Tensor& got, const Tensor& want) {
    const std::vector<float> g = Floats(got.To(kCPU)), w = Floats(want);
    double worst = 0;
    for (size_t i = 0; i < g.size(); ++i) worst = std::max(worst, std::abs(double(g[i]) - w[i]));
    return worst;
  };
  // Gradient of sum(a @ b) by a: ones @ b^T, whose products are exact in float32 but not in TF32.
  auto run = [&](bool allow_tf32, Tensor* grad) {
    MathModeScope scope({.allow_tf32 = allow_tf32});
    Tensor ga = a.detach().To(testing::kGpu);
    ga.set_requires_grad(true);
    const Tensor out = RunOp("matmul", {ga, b.detach().To(testing::kGpu)});
    auto grads = autograd::Grad({RunOp("sum", {out})}, {Tensor()}, {ga}, {});
    EXPECT_TRUE(grads.ok()) << grads.status();
    if (grads.ok()) *grad = (*grads)[0];
    return out;
  };
  Tensor strict_grad, tf32_grad;
  const Tensor strict = run(false, &strict_grad);
  const Tensor tf32 = run(true, &tf32_grad);
  const double strict_error = max_error(strict, exact), tf32_error = max_error(tf32, exact);
  EXPECT_LT(strict_error, 1e-4);
  EXPECT_GT(tf32_error, 10 * strict_error);
  EXPECT_LT(tf32_error, 0.1);
  const Tensor exact_grad = RunOp("sum", {b.detach()}, [] {
    Attrs attrs;
    attrs.set("dim", std::vector<int64_t>{1});
    return attrs;
  }());
  const Tensor row = RunOp("unsqueeze", {exact_grad}, [] {
    Attrs attrs;
    attrs.set("dim", int64_t{0});
    return attrs;
  }());
  Attrs size;
  size.set("size", std::vector<int64_t>{256, 256});
  const Tensor want = RunOp("expand", {row}, size);
  EXPECT_LT(max_error(strict_grad, want), 1e-4);
  EXPECT_GT(max_error(tf32_grad, want), 10 * max_error(strict_grad, want));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaHalfTest, ::testing::Values(DType::kFloat16, DType::kBFloat16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

INSTANTIATE_TEST_SUITE_P(Dtypes, HalfOpsTest, ::testing::Values(DType::kFloat16, DType::kBFloat16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

}  // namespace
}  // namespace gradserve
