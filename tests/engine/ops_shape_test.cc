#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/autograd/autograd.h"
#include "engine/autograd/grad_mode.h"
#include "engine/autograd/node.h"
#include "engine/ops/op_registry.h"
#include "engine/ops/reductions.h"
#include "engine/ops/shape.h"
#include "engine/tensor/tensor.h"
#include "gtest/gtest.h"
#include "tests/engine/gradcheck.h"
#include "tests/engine/op_test_util.h"

namespace gradserve::ops {
namespace {

using ::gradserve::testing::GradCheck;
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

// 0, 1, 2, ... in the given shape.
Tensor Iota(const std::vector<int64_t>& shape) {
  std::vector<double> v(Numel(shape));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i);
  return F64(v, shape);
}
bool SharesStorage(const Tensor& a, const Tensor& b) { return a.storage() == b.storage(); }

// --- reshape ---

TEST(ReshapeTest, InfersMinusOneAndIsAView) {
  Tensor x = Iota({2, 3, 4});
  Tensor y = reshape(x, {4, -1});
  EXPECT_EQ(ShapeOf(y), S({4, 6}));
  EXPECT_TRUE(SharesStorage(x, y));
  EXPECT_EQ(Values(y), Values(x));
  EXPECT_EQ(ShapeOf(reshape(Tensor::Scalar(3, DType::kFloat64), {1, 1})), S({1, 1}));
  EXPECT_EQ(ShapeOf(reshape(Iota({1}), {})), S({}));
  EXPECT_EQ(ShapeOf(reshape(Iota({0, 3}), {3, 0, 5})), S({3, 0, 5}));
}

TEST(ReshapeTest, ViewsStridedInputsWhenPossibleAndCopiesOtherwise) {
  Tensor x = Iota({2, 3});
  Tensor t = transpose(x, 0, 1);  // [3, 2], strides [1, 3]
  Tensor split = reshape(t, {3, 1, 2, 1});
  EXPECT_TRUE(SharesStorage(x, split));
  EXPECT_EQ(Values(split), Values(t));
  Tensor flat = reshape(t, {6});
  EXPECT_FALSE(SharesStorage(x, flat));
  EXPECT_EQ(Values(flat), V({0, 3, 1, 4, 2, 5}));
  // An expanded dim splits without copying.
  Tensor e = expand(Iota({1, 3}), {4, 3});
  Tensor e2 = reshape(e, {2, 2, 3});
  EXPECT_TRUE(SharesStorage(e, e2));
  EXPECT_EQ(Values(e2), Values(e));
  // A narrowed dim merges with the dim outside it only if still contiguous.
  Tensor n = narrow(Iota({4, 3}), 1, 0, 2);
  EXPECT_EQ(Values(reshape(n, {8})), V({0, 1, 3, 4, 6, 7, 9, 10}));
}

TEST(ReshapeTest, Errors) {
  Tensor x = Iota({3, 3});
  ExpectInvalid([&] { reshape(x, {2, 5}); }, {"reshape", "[2, 5]", "[3, 3]", "9 elements"});
  ExpectInvalid([&] { reshape(x, {-1, -1}); }, {"more than one -1"});
  ExpectInvalid([&] { reshape(x, {-2, 9}); }, {"invalid size -2"});
  ExpectInvalid([&] { reshape(x, {-1, 2}); }, {"[-1, 2]", "[3, 3]"});
  ExpectInvalid([&] { reshape(Iota({0}), {0, -1}); }, {"[0, -1]"});
}

// --- transpose, permute ---

TEST(TransposeTest, SwapsDimsAsAView) {
  Tensor x = Iota({2, 3});
  Tensor y = transpose(x, -1, 0);
  EXPECT_EQ(ShapeOf(y), S({3, 2}));
  EXPECT_TRUE(SharesStorage(x, y));
  EXPECT_EQ(Values(y), V({0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(ShapeOf(transpose(Tensor::Scalar(1, DType::kFloat64), 0, -1)), S({}));
  ExpectInvalid([&] { transpose(x, 0, 2); }, {"transpose", "dim1 = 2", "[2, 3]"});
}

TEST(PermuteTest, ReordersDims) {
  Tensor x = Iota({2, 3, 4});
  Tensor y = permute(x, {2, 0, -2});
  EXPECT_EQ(ShapeOf(y), S({4, 2, 3}));
  EXPECT_TRUE(SharesStorage(x, y));
  EXPECT_EQ(Values(y)[1], 4);   // y[0][0][1] = x[0][1][0]
  EXPECT_EQ(Values(y)[3], 12);  // y[0][1][0] = x[1][0][0]
  ExpectInvalid([&] { permute(x, {0, 1}); }, {"permute", "[0, 1]", "[2, 3, 4]"});
  ExpectInvalid([&] { permute(x, {0, 1, 1}); }, {"repeats dimension 1"});
  ExpectInvalid([&] { permute(x, {0, 1, 3}); }, {"dims = 3"});
}

// --- expand, squeeze, unsqueeze ---

TEST(ExpandTest, BroadcastsSizeOneDims) {
  Tensor x = F64({1, 2, 3}, {3, 1});
  Tensor y = expand(x, {2, -1, 4});
  EXPECT_EQ(ShapeOf(y), S({2, 3, 4}));
  EXPECT_EQ(std::vector<int64_t>(y.strides().begin(), y.strides().end()), S({0, 1, 0}));
  EXPECT_TRUE(SharesStorage(x, y));
  EXPECT_EQ(Values(y)[4], 2);
  EXPECT_EQ(ShapeOf(expand(x, {3, 0})), S({3, 0}));
  EXPECT_EQ(ShapeOf(expand(Tensor::Scalar(2, DType::kFloat64), {2, 2})), S({2, 2}));
  ExpectInvalid([&] { expand(x, {3, 1, 1}); }, {"expand", "[3, 1, 1]", "[3, 1]", "has 3"});
  ExpectInvalid([&] { expand(x, {1}); }, {"fewer dimensions"});
  ExpectInvalid([&] { expand(x, {-1, 3, 1}); }, {"new leading dimension 0"});
}

TEST(SqueezeTest, RemovesSizeOneDims) {
  Tensor x = Iota({1, 3, 1});
  EXPECT_EQ(ShapeOf(squeeze(x)), S({3}));
  EXPECT_EQ(ShapeOf(squeeze(x, -1)), S({1, 3}));
  EXPECT_EQ(ShapeOf(squeeze(x, 1)), S({1, 3, 1}));
  EXPECT_TRUE(SharesStorage(x, squeeze(x)));
  EXPECT_EQ(ShapeOf(squeeze(Tensor::Scalar(1, DType::kFloat64), 0)), S({}));
  ExpectInvalid([&] { squeeze(x, 3); }, {"squeeze", "dim = 3", "[1, 3, 1]"});
}

TEST(UnsqueezeTest, InsertsSizeOneDim) {
  Tensor x = Iota({2, 3});
  EXPECT_EQ(ShapeOf(unsqueeze(x, 1)), S({2, 1, 3}));
  EXPECT_EQ(ShapeOf(unsqueeze(x, -1)), S({2, 3, 1}));
  EXPECT_EQ(ShapeOf(unsqueeze(x, -3)), S({1, 2, 3}));
  EXPECT_EQ(ShapeOf(unsqueeze(Tensor::Scalar(1, DType::kFloat64), 0)), S({1}));
  EXPECT_TRUE(SharesStorage(x, unsqueeze(x, 0)));
  ExpectInvalid([&] { unsqueeze(x, 3); }, {"unsqueeze", "dim = 3", "[-3, 2]"});
}

// A tensor with no elements may have a dim whose span passes int64 (found by the fuzzer, as
// conv2d's unsqueeze of an unbatched input): the new dim's stride must not overflow (UBSan).
TEST(UnsqueezeTest, ATensorWithNoElementsAndAHugeDim) {
  const Tensor empty = Tensor::Empty({INT64_MAX, 4, 0}, DType::kFloat32);
  for (int64_t dim : {0, 1, 3}) {
    const Tensor out = unsqueeze(empty, dim);
    EXPECT_EQ(out.dim(), 4);
    EXPECT_EQ(out.numel(), 0);
  }
}

// --- cat, stack ---

TEST(CatTest, JoinsAlongDim) {
  Tensor a = Iota({2, 2});
  Tensor b = F64({9, 8}, {2, 1});
  Tensor c = Iota({2, 0});
  Tensor y = cat({a, b, c}, 1);
  EXPECT_EQ(ShapeOf(y), S({2, 3}));
  EXPECT_EQ(Values(y), V({0, 1, 9, 2, 3, 8}));
  EXPECT_EQ(Values(cat({transpose(a, 0, 1), a}, 0)), V({0, 2, 1, 3, 0, 1, 2, 3}));
  ExpectInvalid([&] { cat({a, b}, 0); }, {"cat", "dimension 0", "[2, 2]", "tensors[1]", "[2, 1]"});
  ExpectInvalid([&] { cat({}, 0); }, {"non-empty"});
  ExpectInvalid([&] { cat({Tensor::Scalar(1, DType::kFloat64)}, 0); }, {"tensors[0] is 0-d"});
  ExpectInvalid([&] { cat({a, a}, 2); }, {"dim = 2"});
  // Note [Promotion in cat and stack]: the list's promoted dtype; a legacy empty [0] skipped.
  EXPECT_EQ(Values(cat({a, I64({1, 2}, {2, 1})}, 1)), V({0, 1, 1, 2, 3, 2}));
  EXPECT_EQ(cat({a, I64({1, 2}, {2, 1})}, 1).dtype(), a.dtype());
  EXPECT_EQ(ShapeOf(cat({Iota({0}), a, Iota({0})}, 1)), S({2, 2}));
  EXPECT_EQ(stack({I64({1, 2}, {2}), Iota({2})}, 0).dtype(), DType::kFloat64);
}

// Found by the fuzzer (conv2d with padding 'same' and a batch of 0): the result of joining
// [0, 2] and [0, 3] has no memory, and the second part starts at an offset of 2 elements;
// computing its address was undefined behaviour (UBSan: non-zero offset applied to null).
TEST(CatTest, JoinsTensorsWithNoElementsAlongAnotherDim) {
  Tensor y = cat({Iota({0, 2}), Iota({0, 3}), Iota({0, 1})}, 1);
  EXPECT_EQ(ShapeOf(y), S({0, 6}));
  EXPECT_EQ(ShapeOf(cat({Iota({2, 0, 3}), Iota({2, 0, 1})}, 2)), S({2, 0, 4}));
  EXPECT_EQ(narrow(y, 1, 2, 3).raw_data(), nullptr);
}

TEST(StackTest, JoinsAlongNewDim) {
  Tensor a = F64({1, 2}, {2});
  Tensor b = F64({3, 4}, {2});
  EXPECT_EQ(Values(stack({a, b}, 0)), V({1, 2, 3, 4}));
  Tensor y = stack({a, b}, -1);
  EXPECT_EQ(ShapeOf(y), S({2, 2}));
  EXPECT_EQ(Values(y), V({1, 3, 2, 4}));
  EXPECT_EQ(ShapeOf(stack({Tensor::Scalar(1, DType::kFloat64)}, 0)), S({1}));
  ExpectInvalid([&] { stack({a, Iota({3})}, 0); }, {"stack", "[2]", "tensors[1]", "[3]"});
  ExpectInvalid([&] { stack({a, b}, 2); }, {"dim = 2"});
}

// --- narrow, select ---

TEST(NarrowTest, SlicesAsAView) {
  Tensor x = Iota({3, 4});
  Tensor y = narrow(x, 1, 1, 2);
  EXPECT_TRUE(SharesStorage(x, y));
  EXPECT_EQ(Values(y), V({1, 2, 5, 6, 9, 10}));
  EXPECT_EQ(Values(narrow(x, 0, -1, 1)), V({8, 9, 10, 11}));
  EXPECT_EQ(ShapeOf(narrow(x, 0, 3, 0)), S({0, 4}));
  ExpectInvalid([&] { narrow(x, 1, 3, 2); }, {"narrow", "length = 2", "start 3", "size 4"});
  ExpectInvalid([&] { narrow(x, 1, 5, 0); }, {"start = 5"});
  ExpectInvalid([&] { narrow(Tensor::Scalar(1, DType::kFloat64), 0, 0, 1); }, {"narrow"});
}

TEST(SelectTest, PicksAndRemovesDim) {
  Tensor x = Iota({3, 4});
  Tensor y = select(x, 1, -1);
  EXPECT_TRUE(SharesStorage(x, y));
  EXPECT_EQ(Values(y), V({3, 7, 11}));
  EXPECT_EQ(ShapeOf(select(Iota({2}), 0, 1)), S({}));
  ExpectInvalid([&] { select(x, 0, 3); }, {"select", "index = 3", "size 3", "[3, 4]"});
  ExpectInvalid([&] { select(x, 2, 0); }, {"dim = 2"});
}

// --- index_select, gather ---

TEST(IndexSelectTest, PicksSlices) {
  Tensor x = Iota({3, 2});
  EXPECT_EQ(Values(index_select(x, 0, I64({2, 0, 2}, {3}))), V({4, 5, 0, 1, 4, 5}));
  EXPECT_EQ(Values(index_select(transpose(x, 0, 1), 1, I64({1}, {1}))), V({2, 3}));
  EXPECT_EQ(ShapeOf(index_select(x, 1, I64({1}, {}))), S({3, 1}));
  EXPECT_EQ(ShapeOf(index_select(x, 0, I64({}, {0}))), S({0, 2}));
  EXPECT_EQ(ShapeOf(index_select(Tensor::Scalar(5, DType::kFloat64), 0, I64({0}, {}))), S({}));
  Tensor ints = index_select(I64({7, 8, 9}, {3}), 0, I64({2}, {1}));
  EXPECT_EQ(ints.dtype(), DType::kInt64);
  EXPECT_EQ(ints.data<int64_t>()[0], 9);
}

TEST(IndexSelectTest, RejectsBadIndices) {
  Tensor x = Iota({3, 2});
  ExpectInvalid(
      [&] {
        index_select(x, 0, I64({0, 3}, {2}));
      },
      {"index_select", "index[1] = 3", "dimension 0", "[3, 2]"});
  ExpectInvalid([&] { index_select(x, 0, I64({-1}, {1})); }, {"index[0] = -1"});
  ExpectInvalid([&] { index_select(x, 0, F64({0}, {1})); }, {"index must be int64", "float64"});
  ExpectInvalid([&] { index_select(x, 0, I64({0, 0}, {1, 2})); }, {"0-d or 1-d", "[1, 2]"});
  ExpectInvalid([&] { index_select(x, 2, I64({0}, {1})); }, {"dim = 2"});
}

TEST(GatherTest, PicksAlongDim) {
  Tensor x = Iota({2, 3});
  Tensor idx = I64({2, 0, 1, 1}, {2, 2});
  EXPECT_EQ(Values(gather(x, 1, idx)), V({2, 0, 4, 4}));
  EXPECT_EQ(Values(gather(x, 0, I64({1, 0, 1}, {1, 3}))), V({3, 1, 5}));
  EXPECT_EQ(Values(gather(transpose(x, 0, 1), 0, I64({2, 1}, {1, 2}))), V({2, 4}));
  EXPECT_EQ(ShapeOf(gather(x, 1, I64({}, {2, 0}))), S({2, 0}));
  EXPECT_EQ(Values(gather(Tensor::Scalar(5, DType::kFloat64), 0, I64({0}, {})))[0], 5);
}

TEST(GatherTest, RejectsBadIndices) {
  Tensor x = Iota({2, 3});
  ExpectInvalid(
      [&] {
        gather(x, 1, I64({0, 3}, {1, 2}));
      },
      {"gather", "index[0, 1] = 3", "dimension 1", "[2, 3]"});
  ExpectInvalid([&] { gather(x, 1, I64({0, 1}, {2})); }, {"as many dimensions"});
  ExpectInvalid([&] { gather(x, 1, I64({0, 0, 0}, {3, 1})); }, {"size 3 in dimension 0"});
  ExpectInvalid([&] { gather(x, 0, F64({0}, {1, 1})); }, {"index must be int64"});
}

// --- registry ---

TEST(ShapeRegistryTest, RunsOpsFromAttrs) {
  const OpRegistry& registry = OpRegistry::Get();
  for (const char* name : {"reshape", "transpose", "permute", "expand", "squeeze", "unsqueeze",
                           "cat", "stack", "narrow", "select", "index_select", "gather"}) {
    EXPECT_NE(registry.Find(name), nullptr) << name;
  }
  Attrs attrs;
  attrs.set("dim", int64_t{1});
  Tensor a = Iota({2, 1});
  TensorList out = registry.Find("cat")->run({a, a, a}, attrs);
  EXPECT_EQ(ShapeOf(out[0]), S({2, 3}));
  EXPECT_TRUE(registry.Find("cat")->variadic);
  EXPECT_EQ(ShapeOf(registry.Find("squeeze")->run({a}, Attrs())[0]), S({2}));
  Attrs bad;
  bad.set("shape", std::string("oops"));
  ExpectInvalid([&] { registry.Find("reshape")->run({a}, bad); }, {"shape"});
}

// --- gradients: first and second order, float64, against finite differences ---

// Checks fn's gradients and their gradients at inputs.
void CheckGrads(const std::string& what, const TensorFn& fn, const TensorList& inputs) {
  SCOPED_TRACE(what);
  EXPECT_TRUE(GradCheck(fn, inputs));
  EXPECT_TRUE(GradGradCheck(fn, inputs));
}
Tensor Leaf(const std::vector<int64_t>& shape, uint32_t seed) { return RandomInput(shape, seed); }
// The grad_fn name of an op's output.
std::string NodeName(const Tensor& t) { return t.grad_fn() ? t.grad_fn()->name() : "none"; }

TEST(ShapeGradTest, ReshapeTransposePermute) {
  for (const auto& [from, to] : std::vector<std::pair<S, S>>{
           {{2, 3}, {3, 2}}, {{2, 3}, {-1}}, {{}, {1, 1}}, {{1}, {}}, {{0, 3}, {3, 0}}}) {
    CheckGrads("reshape " + ShapeToString(from) + " to " + ShapeToString(to),
               [to = to](const TensorList& x) { return TensorList{reshape(x[0], to)}; },
               {Leaf(from, 1)});
  }
  CheckGrads("reshape of a transposed (copying) input",
             [](const TensorList& x) { return TensorList{reshape(transpose(x[0], 0, 1), {6})}; },
             {Leaf({2, 3}, 2)});
  for (const S& shape : {S{2, 3}, S{1, 4}, S{0, 2}}) {
    CheckGrads("transpose " + ShapeToString(shape),
               [](const TensorList& x) { return TensorList{transpose(x[0], 0, -1)}; },
               {Leaf(shape, 3)});
  }
  CheckGrads("transpose 0-d", [](const TensorList& x) { return TensorList{transpose(x[0], 0, 0)}; },
             {Leaf({}, 4)});
  CheckGrads("permute",
             [](const TensorList& x) {
               return TensorList{permute(x[0], {2, 0, 1})};
             },
             {Leaf({2, 1, 3}, 5)});
  Tensor x = Leaf({2, 3}, 6);
  EXPECT_EQ(NodeName(reshape(x, {6})), "ViewBackward0");
  EXPECT_EQ(NodeName(transpose(x, 0, 1)), "TransposeBackward0");
  EXPECT_EQ(NodeName(permute(x, {1, 0})), "PermuteBackward0");
}

TEST(ShapeGradTest, ExpandSqueezeUnsqueeze) {
  CheckGrads("expand [3, 1] to [2, 3, 4]",
             [](const TensorList& x) {
               return TensorList{expand(x[0], {2, -1, 4})};
             },
             {Leaf({3, 1}, 1)});
  CheckGrads("expand 0-d",
             [](const TensorList& x) {
               return TensorList{expand(x[0], {2, 2})};
             },
             {Leaf({}, 2)});
  CheckGrads("expand to zero size",
             [](const TensorList& x) {
               return TensorList{expand(x[0], {0, 3})};
             },
             {Leaf({1, 3}, 3)});
  CheckGrads("squeeze", [](const TensorList& x) { return TensorList{squeeze(x[0])}; },
             {Leaf({1, 3, 1}, 4)});
  CheckGrads("squeeze dim", [](const TensorList& x) { return TensorList{squeeze(x[0], 2)}; },
             {Leaf({1, 3, 1}, 5)});
  CheckGrads("unsqueeze", [](const TensorList& x) { return TensorList{unsqueeze(x[0], 1)}; },
             {Leaf({2, 3}, 6)});
  CheckGrads("unsqueeze 0-d", [](const TensorList& x) { return TensorList{unsqueeze(x[0], 0)}; },
             {Leaf({}, 7)});
  Tensor x = Leaf({1, 3}, 8);
  EXPECT_EQ(NodeName(expand(x, {2, 3})), "ExpandBackward0");
  EXPECT_EQ(NodeName(squeeze(x)), "SqueezeBackward0");
  EXPECT_EQ(NodeName(squeeze(x, 0)), "SqueezeBackward1");
  EXPECT_EQ(NodeName(unsqueeze(x, 0)), "UnsqueezeBackward0");
}

TEST(ShapeGradTest, CatStackNarrowSelect) {
  CheckGrads("cat", [](const TensorList& x) { return TensorList{cat(x, 1)}; },
             {Leaf({2, 2}, 1), Leaf({2, 1}, 2), Leaf({2, 0}, 3)});
  CheckGrads("cat with a constant",
             [](const TensorList& x) {
               return TensorList{cat({x[0], x[1]}, 0)};
             },
             {Leaf({1, 3}, 4), RandomInput({2, 3}, 5, -1, 1, /*requires_grad=*/false)});
  CheckGrads("stack", [](const TensorList& x) { return TensorList{stack(x, -1)}; },
             {Leaf({2, 3}, 6), Leaf({2, 3}, 7)});
  CheckGrads("stack 0-d", [](const TensorList& x) { return TensorList{stack(x, 0)}; },
             {Leaf({}, 8), Leaf({}, 9)});
  CheckGrads("narrow", [](const TensorList& x) { return TensorList{narrow(x[0], 1, 1, 2)}; },
             {Leaf({2, 4}, 10)});
  CheckGrads("narrow whole", [](const TensorList& x) { return TensorList{narrow(x[0], 0, 0, 2)}; },
             {Leaf({2, 1}, 11)});
  CheckGrads("narrow empty", [](const TensorList& x) { return TensorList{narrow(x[0], 1, 4, 0)}; },
             {Leaf({2, 4}, 12)});
  CheckGrads("select", [](const TensorList& x) { return TensorList{select(x[0], 1, -2)}; },
             {Leaf({2, 3}, 13)});
  CheckGrads("select to 0-d", [](const TensorList& x) { return TensorList{select(x[0], 0, 0)}; },
             {Leaf({1}, 14)});
  TensorList parts = {Leaf({2}, 15), Leaf({2}, 16)};
  EXPECT_EQ(NodeName(cat(parts, 0)), "CatBackward0");
  EXPECT_EQ(NodeName(stack(parts, 0)), "StackBackward0");
  EXPECT_EQ(NodeName(narrow(parts[0], 0, 0, 1)), "SliceBackward0");
  EXPECT_EQ(NodeName(select(parts[0], 0, 0)), "SelectBackward0");
}

TEST(ShapeGradTest, IndexSelectAndGather) {
  const Tensor repeated = I64({2, 0, 2}, {3});
  CheckGrads("index_select with repeats",
             [&](const TensorList& x) { return TensorList{index_select(x[0], 0, repeated)}; },
             {Leaf({3, 2}, 1)});
  CheckGrads("index_select dim 1",
             [](const TensorList& x) { return TensorList{index_select(x[0], 1, I64({1}, {}))}; },
             {Leaf({2, 3}, 2)});
  CheckGrads("index_select empty index",
             [](const TensorList& x) { return TensorList{index_select(x[0], 0, I64({}, {0}))}; },
             {Leaf({2, 3}, 3)});
  CheckGrads("index_select 0-d",
             [](const TensorList& x) { return TensorList{index_select(x[0], 0, I64({0}, {1}))}; },
             {Leaf({}, 4)});
  const Tensor idx = I64({2, 0, 1, 1, 0, 0}, {2, 3});
  CheckGrads("gather dim 1", [&](const TensorList& x) { return TensorList{gather(x[0], 1, idx)}; },
             {Leaf({2, 4}, 5)});
  CheckGrads("gather dim 0, smaller index",
             [](const TensorList& x) {
               return TensorList{gather(x[0], 0, I64({1, 1}, {1, 2}))};
             },
             {Leaf({2, 3}, 6)});
  CheckGrads("gather 0-d",
             [](const TensorList& x) { return TensorList{gather(x[0], 0, I64({0}, {}))}; },
             {Leaf({}, 7)});
  CheckGrads("scatter_add (gather's adjoint)",
             [&](const TensorList& x) {
               return TensorList{ScatterAddIntoZeros({2, 4}, 1, idx, x[0])};
             },
             {Leaf({2, 3}, 8)});
  CheckGrads("index_add skipping an index (embedding's adjoint)",
             [&](const TensorList& x) {
               return TensorList{IndexAddIntoZeros({3, 2}, 0, repeated, x[0], /*skip=*/2)};
             },
             {Leaf({3, 2}, 9)});
  Tensor x = Leaf({3, 2}, 10);
  EXPECT_EQ(NodeName(index_select(x, 0, repeated)), "IndexSelectBackward0");
  EXPECT_EQ(NodeName(gather(x, 1, I64({0}, {1, 1}))), "GatherBackward0");
}

TEST(ShapeGradTest, ScatterAddIsDeterministicWithRepeats) {
  // Every element of src lands on index 0: the sum is taken in one fixed order.
  Tensor src = F64({0.1, 0.2, 0.3, 1e16, -1e16, 0.4}, {1, 6});
  Tensor idx = I64({0, 0, 0, 0, 0, 0}, {1, 6});
  const double first = Values(ScatterAddIntoZeros({1, 2}, 1, idx, src))[0];
  for (int i = 0; i < 5; ++i) EXPECT_EQ(Values(ScatterAddIntoZeros({1, 2}, 1, idx, src))[0], first);
}

TEST(ShapeGradTest, SavedIndexIsReleasedAfterBackward) {
  Tensor x = Leaf({3, 2}, 1);
  Tensor y = sum(index_select(x, 0, I64({1, 2}, {2})));
  autograd::BackwardOptions options;
  ASSERT_TRUE(autograd::Backward({y}, {Tensor()}, {}, options).ok());
  EXPECT_EQ(Values(x.grad()), V({0, 0, 1, 1, 1, 1}));
  absl::Status again = autograd::Backward({y}, {Tensor()}, {}, options);
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
}

TEST(ShapeGradTest, NoGraphWithoutGradMode) {
  Tensor x = Leaf({2, 3}, 1);
  autograd::NoGradGuard no_grad;
  EXPECT_FALSE(reshape(x, {6}).requires_grad());
  EXPECT_FALSE(cat({x, x}, 0).requires_grad());
}

}  // namespace
}  // namespace gradserve::ops
