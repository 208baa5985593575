// In-place ops on views (Note [Views written in place]): CopySlices and view-replay Nodes give
// the gradients PyTorch gives through the base and through every view of it; the ported cases
// of PyTorch's test_autograd.py test_inplace_on_view_*, with values from python3-torch 1.13.

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
using ::testing::HasSubstr;

const std::vector<double> kX = {0.5, -1.5, 2.0, 0.25, 1.0, -0.75, 1.5, -0.5, 0.3, -1.2, 0.7, 0.9};
const std::vector<double> kK = {1.0, 2.0, -1.0, 0.5, -0.5, 3.0, 2.0, 1.5, -2.0, -1.0, 0.25, 0.75};

Tensor Leaf(const std::vector<double>& values, absl::Span<const int64_t> shape,
            const std::string& name) {
  Tensor t = F64(values, shape);
  t.set_requires_grad(true);
  t.set_name(name);
  return t;
}

TensorList GradsOf(const Tensor& root, const TensorList& inputs) {
  absl::StatusOr<TensorList> grads = autograd::Grad({root}, {Tensor()}, inputs, {});
  EXPECT_TRUE(grads.ok()) << grads.status();
  return grads.ok() ? *grads : TensorList(inputs.size());
}

// x: [4, 3], w: [3]; a = x * 2; v = a[1]; v.mul_(w); loss = (a * K).sum() + (v * v).sum().
TEST(InPlaceViewTest, WriteIntoASelectGivesPyTorchsGradients) {
  Tensor x = Leaf(kX, {4, 3}, "x");
  Tensor w = Leaf({1.5, 0.25, -0.75}, {3}, "w");
  Tensor a = mul(x, 2.0);
  Tensor v = select(a, 0, 1);
  mul_(v, w);
  EXPECT_EQ(a.grad_fn()->name(), "CopySlices");
  EXPECT_EQ(v.grad_fn()->name(), "AsStridedBackward0");
  ExpectNear(select(a, 0, 1), {0.75, 0.5, 1.125});
  Tensor loss = add(sum(mul(a, F64(kK, {4, 3}))), sum(mul(v, v)));
  TensorList g = GradsOf(loss, {x, w});
  ExpectNear(g[0], {2.0, 4.0, -2.0, 6.0, 0.25, -7.875, 4.0, 3.0, -4.0, -2.0, 0.5, 1.5});
  ExpectNear(g[1], {1.0, 1.0, -7.875});
}

// Slice assignment into a buffer that requires no grad: buf[:, 0] = y;
// buf[:, 1:3] = z * 2; the buffer takes the history (PyTorch's CopySlices).
TEST(InPlaceViewTest, SliceAssignmentIntoAConstantBuffer) {
  Tensor y = Leaf({1.0, -2.0, 0.5, 3.0}, {4}, "y");
  Tensor z = Leaf({0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8}, {4, 2}, "z");
  Tensor buf = Tensor::Zeros({4, 3}, DType::kFloat64);
  EXPECT_FALSE(buf.requires_grad());
  copy_(select(buf, 1, 0), y);
  copy_(narrow(buf, 1, 1, 2), mul(z, 2.0));
  EXPECT_TRUE(buf.requires_grad());
  EXPECT_EQ(buf.grad_fn()->name(), "CopySlices");
  Tensor loss = sum(mul(mul(buf, buf), F64(kK, {4, 3})));
  TensorList g = GradsOf(loss, {y, z});
  ExpectNear(g[0], {2.0, -2.0, 2.0, -6.0});
  ExpectNear(g[1], {1.6, -1.6, -1.2, 9.6, 6.0, -9.6, 1.4, 4.8}, 1e-12);
}

// Another view of the written base sees the write (its grad_fn is replayed from the base):
// a = x * 1; v1 = a[0]; v2 = a[:, 1]; v1.add_(y); v1.tanh_();
// loss = (v2 * [1, 2, 3, 4]).sum() + (v1 * v1).sum().
TEST(InPlaceViewTest, OtherViewsOfTheBaseSeeTheWrite) {
  Tensor x = Leaf(kX, {4, 3}, "x");
  Tensor y = Leaf({1.0, -2.0, 0.5}, {3}, "y");
  Tensor a = mul(x, 1.0);
  Tensor v1 = select(a, 0, 0);
  Tensor v2 = select(a, 1, 1);
  EXPECT_EQ(v2.grad_fn()->name(), "SelectBackward0");
  add_(v1, y);
  tanh_(v1);
  EXPECT_EQ(v2.grad_fn()->name(), "AsStridedBackward0");
  Tensor loss = add(sum(mul(v2, F64({1, 2, 3, 4}, {4}))), sum(mul(v1, v1)));
  TensorList g = GradsOf(loss, {x, y});
  ExpectNear(g[0], {0.32713259728754795, -0.003627616590994257, 0.052472542130580405, 0, 2, 0, 0, 3,
                    0, 0, 4, 0});
  ExpectNear(g[1], {0.32713259728754795, -0.003627616590994257, 0.052472542130580405});
}

// The base written in place, a transpose view of it made before read after:
// a = x * 1; t = a.t(); a.sigmoid_(); loss = (t * K.t()).sum().
TEST(InPlaceViewTest, AViewMadeBeforeTheBaseIsWrittenReadsTheWrite) {
  Tensor x = Leaf(kX, {4, 3}, "x");
  Tensor a = mul(x, 1.0);
  Tensor t = transpose(a, 0, 1);
  sigmoid_(a);
  Tensor loss = sum(mul(t, transpose(F64(kK, {4, 3}), 0, 1)));
  TensorList g = GradsOf(loss, {x});
  ExpectNear(g[0],
             {0.2350037122015945, 0.2982929041406657, -0.10499358540350662, 0.12306704136879917,
              -0.09830596662074093, 0.6536849812854421, 0.2982929041406657, 0.35250556830239177,
              -0.4889166233814917, -0.1778944406468057, 0.05542821832327726, 0.1541252305066976});
}

TEST(InPlaceViewTest, AWriteFromAPackedCopyLandsOnTheViewsElements) {
  // clamp_ reads a packed copy of its strided self (its backward needs the old values) and
  // writes the view's elements, not the first three of the base.
  Tensor x = Leaf({-0.9, -0.4, 0.1, 0.6, 0.8, -0.2}, {3, 2}, "x");
  Tensor b = mul(x, 1.0);
  clamp_(select(b, 1, 1), -0.5, 0.5);
  ExpectNear(b, {-0.9, -0.4, 0.1, 0.5, 0.8, -0.2});
}

TEST(InPlaceViewTest, AViewWithoutElementsIsWrittenAsAnyView) {
  // PyTorch writes (nothing) into a view of an empty intermediate and differentiates it.
  Tensor x = Leaf({}, {0, 4}, "x");
  Tensor a = mul(x, 1.0);
  Tensor v = narrow(a, 1, 1, 2);
  mul_(v, 2.0);
  EXPECT_EQ(a.grad_fn()->name(), "CopySlices");
  TensorList g = GradsOf(sum(a), {x});
  EXPECT_EQ(g[0].shape(), Shape({0, 4}));
}

TEST(InPlaceViewTest, GradCheckThroughWritesIntoViews) {
  // Writes into views of views (transpose then narrow, slice with a step, select of a
  // reshape), with operands that require grad, the base and a view read after.
  auto views = [](const TensorList& in) {
    Tensor a = mul(in[0], 1.5);                      // [4, 3]
    Tensor t = narrow(transpose(a, 0, 1), 0, 1, 2);  // [2, 4]
    mul_(t, in[1]);                                  // in[1]: [4]
    Tensor r = select(reshape(a, {2, 6}), 0, 1);     // a's last two rows
    copy_(narrow(r, 0, 1, 3), mul(narrow(in[1], 0, 0, 3), narrow(in[1], 0, 1, 3)));
    // Last: tanh_ saves its result, which any later write into a would change.
    Tensor s = slice(a, 0, 0, 4, 2);  // rows 0 and 2
    tanh_(s);
    return TensorList{a, mul(t, 2.0)};
  };
  const TensorList inputs = {RandomInput({4, 3}, 11), RandomInput({4}, 12)};
  EXPECT_TRUE(GradCheck(views, inputs));
  EXPECT_TRUE(GradGradCheck(views, inputs));
  // A buffer that requires no grad, written through views with values that do.
  auto buffer = [](const TensorList& in) {
    Tensor buf = Tensor::Zeros({3, 4}, DType::kFloat64);
    copy_(select(buf, 1, 0), in[0]);
    Tensor rest = narrow(buf, 1, 1, 3);
    copy_(rest, in[1]);
    mul_(transpose(rest, 0, 1), select(buf, 1, 0));
    return TensorList{mul(buf, buf)};
  };
  const TensorList buffer_inputs = {RandomInput({3}, 13), RandomInput({3, 3}, 14)};
  EXPECT_TRUE(GradCheck(buffer, buffer_inputs));
  EXPECT_TRUE(GradGradCheck(buffer, buffer_inputs));
}

TEST(InPlaceViewTest, AViewOfALeafThatRequiresGradIsRefused) {
  Tensor x = Leaf({1, 2, 3, 4}, {4}, "x");
  Tensor v = narrow(x, 0, 1, 2);
  try {
    add_(v, 1.0);
    ADD_FAILURE() << "add_ wrote into a view of a leaf that requires grad";
  } catch (const StatusError& e) {
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(e.status().message(),
                HasSubstr("a view of a leaf Variable that requires grad is being used in an "
                          "in-place operation"));
    EXPECT_THAT(e.status().message(), HasSubstr("'x'"));
  }
  // Under no_grad it is an optimizer's write, and only the data changes.
  {
    autograd::GradModeGuard no_grad(false);
    add_(v, 1.0);
  }
  ExpectNear(x, {1, 3, 4, 4});
  EXPECT_TRUE(x.is_leaf());
}

TEST(InPlaceViewTest, AViewMadeUnderNoGradIsRefusedWhenTheWriteRecords) {
  Tensor x = Leaf({1, 2, 3, 4}, {4}, "x");
  Tensor a = mul(x, 1.0);
  Tensor v;
  {
    autograd::GradModeGuard no_grad(false);
    v = narrow(a, 0, 0, 2);
  }
  // As PyTorch: "A view was created in no_grad mode and is being modified inplace with grad
  // mode enabled", even with a constant operand (the view requires grad through its base).
  try {
    mul_(v, F64({2, 2}, {2}));
    ADD_FAILURE() << "mul_ wrote into a view made under no_grad";
  } catch (const StatusError& e) {
    EXPECT_THAT(e.status().message(), HasSubstr("created in no_grad mode"));
  }
  // Writing a constant into a view of a constant records nothing: allowed.
  Tensor c = F64({1, 2, 3, 4}, {4});
  Tensor cv;
  {
    autograd::GradModeGuard no_grad(false);
    cv = narrow(c, 0, 1, 2);
  }
  add_(cv, 1.0);
  ExpectNear(c, {1, 3, 4, 4});
  EXPECT_THROW(copy_(cv, narrow(a, 0, 0, 2)), StatusError);
}

TEST(InPlaceViewTest, ASavedBaseWrittenThroughAViewFailsTheBackward) {
  // a = x * 1; e = a.exp() saves its result... here: m = a * a saves a; a[0].mul_(2).
  Tensor x = Leaf({1, 2, 3}, {3}, "x");
  Tensor a = mul(x, 1.0);
  a.set_name("a");
  Tensor m = mul(a, a);
  mul_(select(a, 0, 0), 2.0);
  absl::StatusOr<TensorList> g = autograd::Grad({sum(m)}, {Tensor()}, {x}, {});
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(g.status().message(), HasSubstr("modified by an inplace operation"));
  EXPECT_THAT(g.status().message(), HasSubstr("'a'"));
  EXPECT_THAT(g.status().message(), HasSubstr("is at version 1; expected version 0"));
}

TEST(InPlaceViewTest, DoubleBackwardThroughAWriteIntoAView) {
  // a = x * 1; a[0].mul_(a[1]) (operand: another view of the same base, read before the
  // write); loss = (a * a).sum(). With x = [[1.5, -2], [0.5, 3]]:
  // a[0] = x0 * x1, so loss = sum((x0 x1)^2) + sum(x1^2).
  Tensor x = Leaf({1.5, -2, 0.5, 3}, {2, 2}, "x");
  Tensor a = mul(x, 1.0);
  mul_(select(a, 0, 0), select(a, 0, 1));
  autograd::BackwardOptions options;
  options.create_graph = true;
  options.retain_graph = true;
  absl::StatusOr<TensorList> g = autograd::Grad({sum(mul(a, a))}, {Tensor()}, {x}, options);
  ASSERT_TRUE(g.ok()) << g.status();
  // d/dx0 = 2 x0 x1^2; d/dx1 = 2 x0^2 x1 + 2 x1.
  ExpectNear((*g)[0], {2 * 1.5 * 0.25, 2 * -2 * 9.0, 2 * 2.25 * 0.5 + 1.0, 2 * 4.0 * 3 + 6.0});
  absl::StatusOr<TensorList> gg = autograd::Grad({sum((*g)[0])}, {Tensor()}, {x}, {});
  ASSERT_TRUE(gg.ok()) << gg.status();
  // d/dx0 of the sum: 2 x1^2 + 4 x0 x1; d/dx1: 4 x0 x1 + 2 x0^2 + 2.
  ExpectNear((*gg)[0], {2 * 0.25 + 4 * 1.5 * 0.5, 2 * 9.0 + 4 * -2 * 3,
                        4 * 1.5 * 0.5 + 2 * 2.25 + 2, 4 * -2 * 3 + 2 * 4.0 + 2});
}

TEST(InPlaceViewTest, DoubleBackwardThroughASavedResultOfAWriteIntoAView) {
  // a = x * 1; v = a[0:2]; v.tanh_() saves its result, the view; the first backward records
  // through it (create_graph) and the second differentiates that: the saved view's history
  // must be its view-replay Node, never the TanhBackward0 that only CopySlices runs
  // (PyTorch's is_inplace_on_view). loss = sum(a * a); d/dx = 2 t t' on 0:2 and 2x after.
  auto fn = [](const TensorList& in) {
    Tensor a = mul(in[0], 1.0);
    tanh_(narrow(a, 0, 1, 2));
    return TensorList{mul(a, a)};
  };
  const TensorList inputs = {RandomInput({4, 3}, 21)};
  EXPECT_TRUE(GradCheck(fn, inputs));
  EXPECT_TRUE(GradGradCheck(fn, inputs));
  Tensor x = Leaf({0.5, -1, 0.25, 2}, {4}, "x");
  Tensor a = mul(x, 1.0);
  Tensor v = narrow(a, 0, 0, 2);
  tanh_(v);
  autograd::BackwardOptions options;
  options.create_graph = true;
  options.retain_graph = true;  // PyTorch's default with create_graph
  absl::StatusOr<TensorList> g = autograd::Grad({sum(mul(a, a))}, {Tensor()}, {x}, options);
  ASSERT_TRUE(g.ok()) << g.status();
  absl::StatusOr<TensorList> gg = autograd::Grad({sum((*g)[0])}, {Tensor()}, {x}, {});
  ASSERT_TRUE(gg.ok()) << gg.status();
  // d/dx of 2 t (1 - t^2) with t = tanh(x): 2 (1 - t^2)(1 - 3 t^2); 2 after.
  std::vector<double> want;
  for (double xi : {0.5, -1.0}) {
    const double t = std::tanh(xi);
    want.push_back(2 * (1 - t * t) * (1 - 3 * t * t));
  }
  want.push_back(2);
  want.push_back(2);
  ExpectNear((*gg)[0], want, 1e-12);
}

}  // namespace
}  // namespace gradserve::ops
