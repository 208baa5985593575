// Tests of the backward pass's fast paths: they must not change what a pass computes or the
// order it runs Nodes in.
//  - Note [Handing the next task over] (engine.cc): the next ready Node runs without a trip
//    through the ReadyQueue.
//  - Note [Reusing the gradient's buffer] (ops/elementwise.cc): fused backward formulas write
//    over a gradient nobody else holds.
//  - Note [Small storage inline] (tensor/storage.h): small host tensors keep their bytes in the
//    Storage object.
//  - SumOverBackward copies a small expanded gradient out (ops/broadcast.cc).

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/autograd/autograd.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/reductions.h"
#include "engine/tensor/memory_budget.h"
#include "engine/tensor/storage.h"
#include "engine/tensor/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/test_nodes.h"

namespace gradserve {
namespace {

using ::gradserve::testing::LambdaBackward;
using ::gradserve::testing::Leaf;
using ::gradserve::testing::Record;
using ::gradserve::testing::Values;
using ::testing::DoubleNear;
using ::testing::ElementsAre;
using ::testing::Pointwise;

// x -> one LambdaBackward per name, each appending its name to *order when it runs, each fed by
// `from` (an index into the Nodes recorded so far, -1 for x); returns the sum of the last ones.
struct OrderGraph {
  Tensor x = Leaf({1.0});
  std::vector<Tensor> values;
  std::shared_ptr<std::vector<std::string>> order = std::make_shared<std::vector<std::string>>();

  Tensor Then(const std::string& name, int from) {
    const Tensor& in = from < 0 ? x : values[from];
    values.push_back(Record(in.Clone(), {in}, name, [name, order = order](TensorList&& g) {
      order->push_back(name);
      return TensorList{g[0]};
    }));
    return values.back();
  }

  // "d", fed by values[a] and values[b], handing its gradient to both.
  Tensor Join(int a, int b) {
    return Record(values[a].Clone(), {values[a], values[b]}, "d",
                  [order = order](TensorList&& grads) {
                    order->push_back("d");
                    return TensorList{grads[0], grads[0]};
                  });
  }
};

TEST(HandoffTest, OneReadyNodeAfterAnotherKeepsTheQueueOrder) {
  // x -> a -> {b, c} -> d(b + c): after d, b and c are ready at once; c is newer and runs first,
  // then b, then a, as the ReadyQueue orders them.
  OrderGraph g;
  g.Then("a", -1);
  g.Then("b", 0);
  g.Then("c", 0);
  Tensor d = g.Join(1, 2);
  ASSERT_TRUE(autograd::Backward({d}, {Tensor::Full({1}, 1.0, DType::kFloat64)}, {}, {}).ok());
  EXPECT_THAT(*g.order, ElementsAre("d", "c", "b", "a"));
  EXPECT_THAT(Values(g.x.grad()), ElementsAre(2.0));
}

TEST(HandoffTest, AQueuedNewerNodeRunsBeforeTheOneJustMadeReady) {
  // x -> a -> b; x -> c (newer than a and b); d(b + c). After d: c and b are ready; c runs
  // first. b makes a ready while nothing is queued, so a is handed over; the order is PyTorch's.
  OrderGraph g;
  g.Then("a", -1);
  g.Then("b", 0);
  g.Then("c", -1);
  Tensor d = g.Join(1, 2);
  ASSERT_TRUE(autograd::Backward({d}, {Tensor::Full({1}, 1.0, DType::kFloat64)}, {}, {}).ok());
  EXPECT_THAT(*g.order, ElementsAre("d", "c", "b", "a"));
}

Tensor FloatLeaf(std::vector<float> values) {
  Tensor t = Tensor::FromVector<float>(values, {static_cast<int64_t>(values.size())});
  t.set_requires_grad(true);
  return t;
}

std::vector<float> Floats(const Tensor& t) {
  Tensor c = t.contiguous();
  return std::vector<float>(c.data<float>(), c.data<float>() + c.numel());
}

TEST(ReuseGradientBufferTest, ACapturedIntermediateGradientIsNotOverwritten) {
  // grad w.r.t. a and x: a's gradient is captured, so a's MulBackward must not write x's
  // gradient over it.
  Tensor x = FloatLeaf({0.1f, -0.2f, 0.3f});
  Tensor a = ops::mul(x, 3.0);
  Tensor b = ops::tanh(a);
  absl::StatusOr<TensorList> grads =
      autograd::Grad({ops::sum(b)}, {Tensor()}, {a, x}, autograd::BackwardOptions{});
  ASSERT_TRUE(grads.ok()) << grads.status();
  std::vector<float> expected_a;
  for (float v : Floats(b)) expected_a.push_back(1 - v * v);
  EXPECT_THAT(Floats((*grads)[0]), Pointwise(DoubleNear(1e-6), expected_a));
  std::vector<float> expected_x;
  for (float v : expected_a) expected_x.push_back(3 * v);
  EXPECT_THAT(Floats((*grads)[1]), Pointwise(DoubleNear(1e-6), expected_x));
}

TEST(ReuseGradientBufferTest, TheCallersSeedIsNotOverwritten) {
  Tensor x = FloatLeaf({0.5f, 1.0f, -1.5f, 2.0f});
  Tensor y = ops::tanh(ops::mul(x, 2.0));
  Tensor seed = Tensor::FromVector<float>({1, 2, 3, 4}, {4});
  absl::StatusOr<TensorList> grads = autograd::Grad({y}, {seed}, {x}, autograd::BackwardOptions{});
  ASSERT_TRUE(grads.ok()) << grads.status();
  EXPECT_THAT(Floats(seed), ElementsAre(1, 2, 3, 4));
  const std::vector<float> ys = Floats(y);
  std::vector<float> expected;
  for (int i = 0; i < 4; ++i) expected.push_back((i + 1) * 2 * (1 - ys[i] * ys[i]));
  EXPECT_THAT(Floats((*grads)[0]), Pointwise(DoubleNear(1e-5), expected));
}

TEST(ReuseGradientBufferTest, ASharedGradientFeedsBothBranchesUnchanged) {
  // loss = sum(sin(x) + cos(x) * 2): AddBackward hands one gradient to both branches; neither
  // may write over it while the other still needs it.
  Tensor x = FloatLeaf({0.25f, -0.75f});
  Tensor loss = ops::sum(ops::add(ops::sin(x), ops::mul(ops::cos(x), 2.0)));
  absl::StatusOr<TensorList> grads = autograd::Grad({loss}, {Tensor()}, {x}, {});
  ASSERT_TRUE(grads.ok()) << grads.status();
  const std::vector<float> xs = Floats(x);
  std::vector<float> expected;
  for (float v : xs) expected.push_back(std::cos(v) - 2 * std::sin(v));
  EXPECT_THAT(Floats((*grads)[0]), Pointwise(DoubleNear(1e-6), expected));
}

TEST(SumBackwardTest, SmallExpandedGradientsAreContiguousLargeOnesStayViews) {
  Tensor small = FloatLeaf(std::vector<float>(16, 1.0f));
  absl::StatusOr<TensorList> g = autograd::Grad({ops::sum(small)}, {Tensor()}, {small}, {});
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE((*g)[0].is_contiguous());
  EXPECT_THAT(Floats((*g)[0]), ::testing::Each(1.0f));

  Tensor large = FloatLeaf(std::vector<float>(8192, 1.0f));
  g = autograd::Grad({ops::sum(large)}, {Tensor()}, {large}, {});
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_FALSE((*g)[0].is_contiguous());  // PyTorch's expanded view
  EXPECT_THAT(Floats((*g)[0]), ::testing::Each(1.0f));
}

TEST(SmallStorageTest, SmallHostBytesLiveInTheStorageAndCountInTheBudget) {
  auto budget = MemoryBudget::Make();
  MemoryBudgetScope scope(budget);
  Tensor small = Tensor::Empty({Storage::kInlineBytes / 4}, DType::kFloat32);
  const auto* object = reinterpret_cast<const char*>(small.storage().get());
  const auto* bytes = static_cast<const char*>(small.storage()->data());
  EXPECT_GE(bytes, object);
  EXPECT_LT(bytes, object + sizeof(Storage));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(bytes) % 16, 0u);
  EXPECT_EQ(budget->used(), static_cast<int64_t>(Storage::kInlineBytes));

  Tensor large = Tensor::Empty({Storage::kInlineBytes / 4 + 1}, DType::kFloat32);
  const auto* large_bytes = static_cast<const char*>(large.storage()->data());
  const auto* large_object = reinterpret_cast<const char*>(large.storage().get());
  EXPECT_FALSE(large_bytes >= large_object && large_bytes < large_object + sizeof(Storage));
  EXPECT_EQ(budget->used(), static_cast<int64_t>(2 * Storage::kInlineBytes + 4));

  Fill(small, 2.5);
  EXPECT_THAT(Floats(small), ::testing::Each(2.5f));
  small = Tensor();
  large = Tensor();
  EXPECT_EQ(budget->used(), 0);
}

}  // namespace
}  // namespace gradserve
