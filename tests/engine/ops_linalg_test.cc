#include <cmath>
#include <string>
#include <vector>

#include "engine/autograd/autograd.h"
#include "engine/autograd/node.h"
#include "engine/ops/linalg.h"
#include "engine/ops/op_registry.h"
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
using ::gradserve::testing::op_test::Values;

std::vector<double> Reference(const Tensor& a, const Tensor& b) {
  const std::vector<double> va = Values(a), vb = Values(b);
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  std::vector<double> out(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t p = 0; p < k; ++p) out[i * n + j] += va[i * k + p] * vb[p * n + j];
    }
  }
  return out;
}

struct MatmulShapes {
  Shape a, b, out;
};

const std::vector<MatmulShapes> kShapes = {
    {{3}, {3}, {}},                           // dot
    {{2, 3}, {3}, {2}},                       // matrix-vector
    {{3}, {3, 4}, {4}},                       // vector-matrix
    {{2, 3}, {3, 4}, {2, 4}},                 // matrices
    {{2, 2, 3}, {3, 4}, {2, 2, 4}},           // batched times matrix
    {{3, 2}, {2, 2, 4}, {2, 3, 4}},           // matrix times batched
    {{2, 2, 3}, {2, 3, 4}, {2, 2, 4}},        // batched
    {{2, 1, 2, 3}, {3, 3, 2}, {2, 3, 2, 2}},  // broadcast batch dims
    {{3}, {2, 3, 4}, {2, 4}},                 // vector times batched
    {{2, 2, 3}, {3}, {2, 2}},                 // batched times vector
    {{1, 3}, {3, 1}, {1, 1}},                 // size-1 dims
    {{0, 3}, {3, 4}, {0, 4}},                 // zero rows
    {{2, 0}, {0, 4}, {2, 4}},                 // zero inner size: zeros
    {{2, 3}, {3, 0}, {2, 0}},                 // zero columns
    {{0}, {0}, {}},                           // empty dot
    {{0, 2, 3}, {3, 2}, {0, 2, 2}},           // zero batch
};

TEST(MatmulTest, ShapesFollowTorchMatmul) {
  uint32_t seed = 1;
  for (const MatmulShapes& s : kShapes) {
    const Tensor a = RandomInput(s.a, seed++);
    const Tensor b = RandomInput(s.b, seed++);
    Tensor out = matmul(a, b);
    EXPECT_EQ(out.shape(), s.out) << ShapeToString(s.a) << " @ " << ShapeToString(s.b);
  }
}

TEST(MatmulTest, GradCheckAndGradGradCheck) {
  uint32_t seed = 100;
  for (const MatmulShapes& s : kShapes) {
    Tensor a = RandomInput(s.a, seed++);
    Tensor b = RandomInput(s.b, seed++);
    auto fn = [](const TensorList& in) { return TensorList{matmul(in[0], in[1])}; };
    EXPECT_TRUE(GradCheck(fn, {a, b})) << ShapeToString(s.a) << " @ " << ShapeToString(s.b);
    EXPECT_TRUE(GradGradCheck(fn, {a, b})) << ShapeToString(s.a) << " @ " << ShapeToString(s.b);
  }
}

TEST(MatmulTest, GradCheckWithOneConstantOperand) {
  auto fn = [](const TensorList& in) { return TensorList{matmul(in[0], in[1])}; };
  EXPECT_TRUE(GradCheck(fn, {RandomInput({2, 3}, 1), RandomInput({3, 2}, 2, -1, 1, false)}));
  EXPECT_TRUE(GradGradCheck(fn, {RandomInput({3}, 3, -1, 1, false), RandomInput({2, 3, 2}, 4)}));
}

TEST(MatmulTest, HandComputedValues) {
  Tensor a = Tensor::FromVector<double>({1, 2, 3, 4}, {2, 2});
  Tensor b = Tensor::FromVector<double>({5, 6, 7, 8}, {2, 2});
  ExpectNear(matmul(a, b), {19, 22, 43, 50});
  Tensor v = Tensor::FromVector<double>({1, -1}, {2});
  ExpectNear(matmul(a, v), {-1, -1});
  ExpectNear(matmul(v, a), {-2, -2});
  ExpectNear(matmul(v, v), {2});
  ExpectNear(matmul(Tensor::Zeros({2, 0}, DType::kFloat64), Tensor::Zeros({0, 3}, DType::kFloat64)),
             {0, 0, 0, 0, 0, 0});
}

TEST(MatmulTest, TransposedAndStridedOperands) {
  Tensor base = RandomInput({4, 3}, 5, -1, 1, false);
  Tensor other = RandomInput({4, 5}, 6, -1, 1, false);
  Tensor transposed = base.AsStrided({3, 4}, {1, 3}, 0);  // column-major: BLAS transposes
  ExpectNear(matmul(transposed, other), Reference(transposed.contiguous(), other), 1e-12);
  // Every other column: neither row- nor column-major, so it is packed first.
  Tensor wide = RandomInput({3, 8}, 7, -1, 1, false);
  Tensor every_other = wide.AsStrided({3, 4}, {8, 2}, 0);
  ExpectNear(matmul(every_other, other), Reference(every_other.contiguous(), other), 1e-12);
  // A broadcast (stride 0) operand.
  Tensor row = RandomInput({1, 4}, 8, -1, 1, false);
  Tensor repeated = row.AsStrided({3, 4}, {0, 1}, 0);
  ExpectNear(matmul(repeated, other), Reference(repeated.contiguous(), other), 1e-12);
}

TEST(MatmulTest, Float32AgreesWithFloat64) {
  Tensor a = RandomInput({2, 16, 32}, 1, -1, 1, false);
  Tensor b = RandomInput({32, 8}, 2, -1, 1, false);
  Tensor y = matmul(a.To(DType::kFloat32), b.To(DType::kFloat32));
  EXPECT_EQ(y.dtype(), DType::kFloat32);
  const std::vector<double> expected = Values(matmul(a, b));
  const std::vector<double> got = Values(y);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], 1e-5);
}

// Note [Contracting with a vector in float64]: the float32 gradient of a vector operand is the
// float64 contraction rounded once, with products of 1000s cancelling to smaller sums. Before,
// each product was rounded to float32 first and some elements were ulps off.
TEST(MatmulTest, Float32VectorGradientIsTheContractionRoundedOnce) {
  const Tensor m = RandomInput({4, 8, 16}, 7, -1000, 1000, false);
  const Tensor g = RandomInput({4, 8}, 8, -1, 1, false);
  const Tensor h = RandomInput({4, 16}, 9, -1, 1, false);
  Tensor v = RandomInput({16}, 10, -1, 1, false).To(DType::kFloat32);
  Tensor w = RandomInput({8}, 11, -1, 1, false).To(DType::kFloat32);
  v.set_requires_grad(true);
  w.set_requires_grad(true);
  const Tensor m32 = m.To(DType::kFloat32);
  const Tensor m64 = m32.To(DType::kFloat64);  // the float32 values, exactly
  for (bool create_graph : {false, true}) {
    SCOPED_TRACE(create_graph ? "create_graph" : "plain");
    autograd::BackwardOptions options;
    options.create_graph = create_graph;
    // m [4, 8, 16] @ v [16] (matrix-vector) and w [8] @ m [4, 8, 16] (vector-matrix).
    absl::StatusOr<TensorList> gv =
        autograd::Grad({matmul(m32, v)}, {g.To(DType::kFloat32)}, {v}, options);
    absl::StatusOr<TensorList> gw =
        autograd::Grad({matmul(w, m32)}, {h.To(DType::kFloat32)}, {w}, options);
    ASSERT_TRUE(gv.ok() && gw.ok());
    const Tensor g64 = g.To(DType::kFloat32).To(DType::kFloat64);
    const Tensor h64 = h.To(DType::kFloat32).To(DType::kFloat64);
    const std::vector<double> mv = Values(m64), gd = Values(g64), hd = Values(h64);
    const std::vector<double> got_v = Values((*gv)[0]), got_w = Values((*gw)[0]);
    for (int64_t k = 0; k < 16; ++k) {
      double total = 0;
      for (int64_t r = 0; r < 32; ++r) total += mv[r * 16 + k] * gd[r];
      EXPECT_EQ(got_v[k], static_cast<double>(static_cast<float>(total))) << "v " << k;
    }
    for (int64_t k = 0; k < 8; ++k) {
      double total = 0;
      for (int64_t b = 0; b < 4; ++b) {
        for (int64_t n = 0; n < 16; ++n) total += mv[(b * 8 + k) * 16 + n] * hd[b * 16 + n];
      }
      EXPECT_EQ(got_w[k], static_cast<double>(static_cast<float>(total))) << "w " << k;
    }
  }
}

TEST(MatmulTest, Int64) {
  Tensor a = Tensor::FromVector<int64_t>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = Tensor::FromVector<int64_t>({1, 0, 0, 1, 1, 1}, {3, 2});
  Tensor y = matmul(a, b);
  EXPECT_EQ(y.dtype(), DType::kInt64);
  ExpectNear(y, {4, 5, 10, 11});
  ExpectNear(matmul(Tensor::FromVector<int64_t>({1, 2, 3}, {3}), a.AsStrided({3, 2}, {1, 3}, 0)),
             {14, 32});
}

// Note [Integer tensors wrap around]: sums past int64 wrap as PyTorch's do ((2^63 - 1)^2 is 1
// modulo 2^64), with no undefined behaviour (the request fuzzer's find, under UBSan).
TEST(MatmulTest, Int64SumsWrapAround) {
  const int64_t max = INT64_MAX;
  Tensor a = Tensor::FromVector<int64_t>({max, max}, {1, 2});
  Tensor b = Tensor::FromVector<int64_t>({max, 1}, {2, 1});
  EXPECT_EQ(matmul(a, b).data<int64_t>()[0], static_cast<int64_t>(uint64_t{1} + uint64_t(max)));
  EXPECT_EQ(
      matmul(a.AsStrided({1, 1}, {1, 1}, 0), a.AsStrided({1, 1}, {1, 1}, 0)).data<int64_t>()[0], 1);
}

TEST(MatmulTest, InvalidArguments) {
  Tensor a = RandomInput({2, 3}, 1);
  ExpectInvalid(
      [&] {
        matmul(a, RandomInput({4, 5}, 2));
      },
      "matmul: shapes [2, 3] and [4, 5] cannot be multiplied (3 != 4)");
  ExpectInvalid([&] { matmul(RandomInput({3}, 1), RandomInput({4}, 2)); },
                "matmul: shapes [3] and [4] cannot be multiplied");
  ExpectInvalid([&] { matmul(Tensor::Scalar(1, DType::kFloat64), a); },
                "matmul: both arguments need at least 1 dimension");
  ExpectInvalid(
      [&] {
        matmul(a, RandomInput({3, 2}, 2).To(DType::kFloat32));
      },
      "matmul: input and other must have the same dtype, got float64 and float32");
  ExpectInvalid(
      [&] {
        matmul(RandomInput({2, 2, 3}, 1), RandomInput({3, 3, 2}, 2));
      },
      "matmul: shapes [2] and [3] cannot be broadcast");
  Tensor flags = Tensor::FromVector<bool>({true, false}, {2});
  ExpectInvalid([&] { matmul(flags, flags); }, "matmul: bool tensors are not supported");
}

TEST(MatmulTest, BackwardNodeNames) {
  Tensor m = RandomInput({2, 2}, 1);
  Tensor v = RandomInput({2}, 2);
  Tensor b = RandomInput({3, 2, 2}, 3);
  EXPECT_EQ(matmul(v, v).grad_fn()->name(), "DotBackward0");
  EXPECT_EQ(matmul(m, v).grad_fn()->name(), "MvBackward0");
  EXPECT_EQ(matmul(m, m).grad_fn()->name(), "MmBackward0");
  EXPECT_EQ(matmul(b, b).grad_fn()->name(), "BmmBackward0");
}

TEST(MatmulTest, HandComputedGradients) {
  Tensor a = Tensor::FromVector<double>({1, 2, 3, 4}, {2, 2});
  a.set_requires_grad(true);
  Tensor b = Tensor::FromVector<double>({5, 6, 7, 8}, {2, 2});
  b.set_requires_grad(true);
  absl::StatusOr<TensorList> g =
      autograd::Grad({matmul(a, b)}, {Tensor::Full({2, 2}, 1, DType::kFloat64)}, {a, b}, {});
  ASSERT_TRUE(g.ok()) << g.status();
  ExpectNear((*g)[0], {11, 15, 11, 15});  // ones @ b^T
  ExpectNear((*g)[1], {4, 4, 6, 6});      // a^T @ ones
}

TEST(MatmulTest, RunsThroughTheRegistry) {
  Tensor a = Tensor::FromVector<double>({1, 2, 3, 4}, {2, 2});
  ExpectNear(OpRegistry::Get().Find("matmul")->run({a, a}, Attrs())[0], {7, 10, 15, 22});
}

}  // namespace
}  // namespace gradserve::ops
