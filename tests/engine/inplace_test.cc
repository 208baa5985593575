// In-place writes and version counters (Note [Version counter], Note [Saved versions]): the
// engine-level half of PyTorch's test_autograd.py in-place tests.

#include <cmath>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/autograd/autograd.h"
#include "engine/autograd/grad_mode.h"
#include "engine/autograd/node.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/indexing.h"
#include "engine/ops/reductions.h"
#include "engine/ops/shape.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/gradcheck.h"
#include "tests/engine/op_test_util.h"

namespace gradserve::ops {
namespace {

using ::gradserve::testing::GradCheck;
using ::gradserve::testing::GradGradCheck;
using ::gradserve::testing::RandomInput;
using ::gradserve::testing::op_test::ExpectNear;
using ::gradserve::testing::op_test::F64;
using ::gradserve::testing::op_test::Values;
using ::testing::HasSubstr;

Tensor Leaf(const std::vector<double>& values) {
  Tensor t = F64(values, {static_cast<int64_t>(values.size())});
  t.set_requires_grad(true);
  t.set_name("x");
  return t;
}

absl::StatusOr<TensorList> GradOf(const Tensor& root, const Tensor& input) {
  return autograd::Grad({root}, {Tensor()}, {input}, {});
}

TEST(VersionCounterTest, SharedByBaseViewsAndAliases) {
  Tensor base = F64({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor view = transpose(base, 0, 1);
  Tensor row = select(base, 0, 1);
  Tensor alias = base.detach();
  EXPECT_EQ(base.version(), 0u);
  row.BumpVersion();
  EXPECT_EQ(base.version(), 1u);
  EXPECT_EQ(view.version(), 1u);
  EXPECT_EQ(alias.version(), 1u);
  EXPECT_TRUE(view.is_view());
  EXPECT_TRUE(row.is_view());
  EXPECT_FALSE(base.is_view());
  // A copy has its own counter.
  EXPECT_EQ(base.Clone().version(), 0u);
}

TEST(SavedVersionTest, ModifiedSavedInputFailsNamingValueAndVersions) {
  Tensor x = Leaf({1, 2, 3});
  Tensor y = sum(mul(x, x));  // MulBackward0 saves x twice
  x.BumpVersion();
  absl::StatusOr<TensorList> grads = GradOf(y, x);
  ASSERT_FALSE(grads.ok());
  EXPECT_EQ(grads.status().code(), absl::StatusCode::kFailedPrecondition) << grads.status();
  const std::string message(grads.status().message());
  EXPECT_THAT(message, HasSubstr("one of the variables needed for gradient computation has "
                                 "been modified by an inplace operation"));
  EXPECT_THAT(message, HasSubstr("'x'"));
  EXPECT_THAT(message, HasSubstr("MulBackward0"));
  EXPECT_THAT(message, HasSubstr("is at version 1; expected version 0"));
}

TEST(SavedVersionTest, ModifiedSavedOutputFailsNamingItsNode) {
  Tensor x = Leaf({0.5, -1});
  Tensor h = tanh(x);  // TanhBackward0 saves its output
  Tensor y = sum(h);
  h.BumpVersion();
  h.BumpVersion();
  absl::StatusOr<TensorList> grads = GradOf(y, x);
  ASSERT_FALSE(grads.ok());
  EXPECT_EQ(grads.status().code(), absl::StatusCode::kFailedPrecondition) << grads.status();
  const std::string message(grads.status().message());
  EXPECT_THAT(message, HasSubstr("output 0 of TanhBackward0"));
  EXPECT_THAT(message, HasSubstr("is at version 2; expected version 0"));
}

TEST(SavedVersionTest, UnsavedTensorsMayChange) {
  // add saves nothing: writing into its input after it ran breaks nothing, as in PyTorch.
  Tensor x = Leaf({1, 2});
  Tensor y = sum(add(x, 1.0));
  x.BumpVersion();
  absl::StatusOr<TensorList> grads = GradOf(y, x);
  ASSERT_TRUE(grads.ok()) << grads.status();
}

// --- In-place ops (Note [In-place ops]) ---

TEST(InPlaceTest, WritesSelfAndBumpsItsVersion) {
  Tensor t = F64({1, -2, 3}, {3});
  const void* data = t.raw_data();
  Tensor r = add_(t, 1.0);
  EXPECT_TRUE(r.is_same(t));
  EXPECT_EQ(t.raw_data(), data);
  EXPECT_EQ(t.version(), 1u);
  mul_(t, F64({2, 2, 2}, {3}));
  relu_(t);
  EXPECT_EQ(t.version(), 3u);
  ExpectNear(t, {4, 0, 8});
  clamp_(t, 1.0, 5.0);
  ExpectNear(t, {4, 1, 5});
  masked_fill_(t, Tensor::FromVector<bool>({true, false, false}, {3}), -1);
  ExpectNear(t, {-1, 1, 5});
  copy_(t, F64({7}, {1}));
  ExpectNear(t, {7, 7, 7});
  div_(t, 2.0);
  sub_(t, F64({0.5, 1.5, 2.5}, {3}));
  ExpectNear(t, {3, 2, 1});
  zero_(t);
  ExpectNear(t, {0, 0, 0});
  fill_(t, 0.5);
  sigmoid_(t);
  tanh_(t);
  EXPECT_NEAR(Values(t)[0], std::tanh(1 / (1 + std::exp(-0.5))), 1e-15);
  EXPECT_EQ(t.version(), 12u);
}

TEST(InPlaceTest, ViewsSeeTheWrite) {
  Tensor base = F64({1, 2, 3, 4}, {2, 2});
  Tensor row = select(base, 0, 1);
  add_(row, 10.0);
  ExpectNear(base, {1, 2, 13, 14});
  EXPECT_EQ(base.version(), 1u);
}

TEST(InPlaceTest, RebasesHistory) {
  Tensor x = Leaf({1, 2, 3});
  Tensor h = mul(x, 2.0);
  const auto* first = h.grad_fn().get();
  mul_(h, x);  // h = 2x * x
  ASSERT_NE(h.grad_fn(), nullptr);
  EXPECT_NE(h.grad_fn().get(), first);
  EXPECT_EQ(h.grad_fn()->name(), "MulBackward0");
  absl::StatusOr<TensorList> grads = GradOf(sum(h), x);
  ASSERT_TRUE(grads.ok()) << grads.status();
  ExpectNear((*grads)[0], {4, 8, 12});  // d(2x^2)/dx
}

TEST(InPlaceTest, NodeNamesArePyTorchs) {
  Tensor x = Leaf({1, 2});
  auto name_after = [&](auto op) {
    Tensor h = mul(x, 2.0);
    op(h);
    return h.grad_fn()->name();
  };
  EXPECT_EQ(name_after([](Tensor& h) { add_(h, 1.0); }), "AddBackward0");
  EXPECT_EQ(name_after([](Tensor& h) { relu_(h); }), "ReluBackward0");
  EXPECT_EQ(name_after([](Tensor& h) { clamp_(h, 0.0, 1.0); }), "ClampBackward1");
  EXPECT_EQ(name_after([](Tensor& h) { fill_(h, 1); }), "FillBackward2");
  EXPECT_EQ(name_after([](Tensor& h) { zero_(h); }), "ZeroBackward0");
  EXPECT_EQ(name_after([&](Tensor& h) { copy_(h, x); }), "CopyBackwards");
  EXPECT_EQ(name_after([](Tensor& h) {
              masked_fill_(h, Tensor::FromVector<bool>({true, false}, {2}), 0);
            }),
            "MaskedFillBackward0");
}

TEST(InPlaceTest, LeafThatRequiresGradIsRefusedUnlessNoGrad) {
  Tensor x = Leaf({1, 2});
  EXPECT_THROW(add_(x, 1.0), StatusError);
  try {
    relu_(x);
  } catch (const StatusError& e) {
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(e.status().message()),
                HasSubstr("a leaf Variable that requires grad is being used in an in-place "
                          "operation"));
  }
  EXPECT_EQ(x.version(), 0u);
  {
    autograd::GradModeGuard no_grad(false);
    add_(x, 1.0);  // what an optimizer step does
  }
  ExpectNear(x, {2, 3});
  {
    autograd::GradModeGuard no_grad(false);
    mul_(x, x);  // self as its own operand
  }
  ExpectNear(x, {4, 9});
  EXPECT_TRUE(x.is_leaf());
  EXPECT_TRUE(x.requires_grad());
}

TEST(InPlaceTest, EveryViewOpMarksItsOutput) {
  Tensor base = F64({1, 2, 3, 4, 5, 6}, {2, 3});
  for (const Tensor& view :
       {transpose(base, 0, 1), permute(base, {1, 0}), reshape(base, {3, 2}), select(base, 0, 1),
        narrow(base, 1, 0, 2), squeeze(unsqueeze(base, 0), 0), expand(select(base, 1, 0), {2, 2}),
        slice(base, 1, 0, 3, 2), slice(base, 1, 1, 3, 1)}) {
    EXPECT_TRUE(view.is_view()) << ShapeToString(view.shape());
  }
}

TEST(InPlaceTest, OverlappingSelfIsRefused) {
  Tensor e = expand(F64({1}, {1}), {3});
  EXPECT_THROW(add_(e, 1.0), StatusError);
}

TEST(InPlaceTest, ShapeAndDTypeOfTheResultMustBeSelfs) {
  Tensor t = F64({1, 2}, {2});
  EXPECT_THROW(add_(t, F64({1, 2, 3, 4}, {2, 2})), StatusError);
  Tensor i = Tensor::FromVector<int64_t>({1, 2}, {2});
  EXPECT_THROW(div_(i, 2.0), StatusError);
  EXPECT_THROW(sigmoid_(i), StatusError);
  add_(i, Tensor::Scalar(3, DType::kInt64));
  EXPECT_EQ(i.data<int64_t>()[1], 5);
}

TEST(InPlaceTest, SavedResultThenWrittenFailsAsInPyTorch) {
  // x * 2, sigmoid_, mul_(2): SigmoidBackward0 saved its result at version 1; it is at 2.
  Tensor x = Leaf({1, 2, 3});
  Tensor y = mul(x, 2.0);
  sigmoid_(y);
  mul_(y, 2.0);
  absl::StatusOr<TensorList> grads = GradOf(sum(y), x);
  ASSERT_FALSE(grads.ok());
  EXPECT_EQ(grads.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(grads.status().message()), HasSubstr("output 0 of SigmoidBackward0"));
  EXPECT_THAT(std::string(grads.status().message()),
              HasSubstr("is at version 2; expected version 1"));
}

TEST(InPlaceTest, SavedInputThenWrittenFails) {
  // exp saves its result h; writing h afterwards breaks exp's backward.
  Tensor x = Leaf({0.5});
  Tensor h = mul(x, 1.0);
  Tensor y = mul(h, h);  // saves h
  add_(h, 1.0);
  absl::StatusOr<TensorList> grads = GradOf(sum(y), x);
  ASSERT_FALSE(grads.ok());
  EXPECT_EQ(grads.status().code(), absl::StatusCode::kFailedPrecondition);
}

const std::vector<double> kChainGradX = {0.0, 0.252770614420723, -0.16342124532136054};
const std::vector<double> kChainGradW = {0.0, -1.8199484238292056, -0.8715799750472563};

// PyTorch's values (python3-torch): x = [0.5, -1.5, 2.0], w = [1.5, 0.25, -0.75];
// h = x * w; h.add_(x); h.mul_(w); h.clamp_(-1, 1); h.tanh_(); h.sum().backward().
TEST(InPlaceTest, ChainMatchesPyTorch) {
  Tensor x = Leaf({0.5, -1.5, 2.0});
  Tensor w = F64({1.5, 0.25, -0.75}, {3});
  w.set_requires_grad(true);
  Tensor h = mul(x, w);
  add_(h, x);
  mul_(h, w);
  clamp_(h, -1.0, 1.0);
  tanh_(h);
  absl::StatusOr<TensorList> grads = autograd::Grad({sum(h)}, {Tensor()}, {x, w}, {});
  ASSERT_TRUE(grads.ok()) << grads.status();
  ExpectNear((*grads)[0], kChainGradX, 1e-12);
  ExpectNear((*grads)[1], kChainGradW, 1e-12);
}

TEST(InPlaceTest, GradCheckThroughInPlaceChains) {
  auto chain = [](const TensorList& in) {
    Tensor h = mul(in[0], in[1]);
    add_(h, in[0], 0.5);
    mul_(h, in[1]);
    div_(h, add(in[1], 3.0));
    sub_(h, 0.25);
    sigmoid_(h);
    Tensor k = mul(h, 1.0);
    tanh_(k);
    return TensorList{k};
  };
  const TensorList inputs = {RandomInput({2, 3}, 1), RandomInput({3}, 2, 0.5, 1.5)};
  EXPECT_TRUE(GradCheck(chain, inputs));
  EXPECT_TRUE(GradGradCheck(chain, inputs));
  auto fills = [](const TensorList& in) {
    Tensor h = mul(in[0], 2.0);
    masked_fill_(h, Tensor::FromVector<bool>({true, false, false}, {3}), 0.5);
    Tensor k = mul(in[0], 1.0);
    copy_(k, in[1]);
    relu_(k);
    return TensorList{mul(h, k)};
  };
  const TensorList fill_inputs = {RandomInput({2, 3}, 3), RandomInput({3}, 4, 0.1, 1)};
  EXPECT_TRUE(GradCheck(fills, fill_inputs));
  EXPECT_TRUE(GradGradCheck(fills, fill_inputs));
}

TEST(InPlaceTest, SelfAsOperandGivesTheMathematicalGradient) {
  // h.add_(h) is 2h: the operand is read as it was before the write.
  Tensor x = Leaf({1, 2});
  Tensor h = mul(x, 2.0);
  add_(h, h);
  absl::StatusOr<TensorList> grads = GradOf(sum(h), x);
  ASSERT_TRUE(grads.ok()) << grads.status();
  ExpectNear((*grads)[0], {4, 4});
}

TEST(InPlaceTest, DoubleBackwardThroughInPlace) {
  // h = x * x; h.mul_(x): d/dx = 3x^2, d2/dx2 = 6x.
  Tensor x = Leaf({1.5, -2});
  Tensor h = mul(x, x);
  mul_(h, x);
  autograd::BackwardOptions options;
  options.create_graph = true;
  options.retain_graph = true;
  absl::StatusOr<TensorList> g = autograd::Grad({sum(h)}, {Tensor()}, {x}, options);
  ASSERT_TRUE(g.ok()) << g.status();
  ExpectNear((*g)[0], {6.75, 12});
  absl::StatusOr<TensorList> gg = GradOf(sum((*g)[0]), x);
  ASSERT_TRUE(gg.ok()) << gg.status();
  ExpectNear((*gg)[0], {9, -12});
}

}  // namespace
}  // namespace gradserve::ops
