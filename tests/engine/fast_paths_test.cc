// Tests of the backward pass's fast paths: they must not change what a pass computes or the
// order it runs Nodes in.
//  - Note [Handing the next task over] (engine.cc): the next ready Node runs without a trip
//    through the ReadyQueue.
//  - Note [Reusing the gradient's buffer] (ops/elementwise.cc): fused backward formulas write
//    over a gradient nobody else holds.
//  - Note [Small storage inline] (tensor/storage.h): small host tensors keep their bytes in the
//    Storage object.
//  - SumOverBackward copies a small expanded gradient out (ops/broadcast.cc).
//  - Note [A gradient of one value] (ops/broadcast.cc): a gradient of one value stays one value.

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
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

TEST(OneValueGradientTest, FormulasOfOneValueKeepItExpandedWithTheSameValues) {
  // Note [A gradient of one value]: sum's gradient, scaled twice, is still one value.
  std::vector<float> values(8192);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.001f * static_cast<float>(i);
  Tensor x = FloatLeaf(values);
  absl::StatusOr<TensorList> g =
      autograd::Grad({ops::sum(ops::mul(ops::mul(x, 3.0), 0.5))}, {Tensor()}, {x}, {});
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE((*g)[0].repeats_one_value());
  EXPECT_EQ((*g)[0].storage()->nbytes(), sizeof(float));
  EXPECT_THAT(Floats((*g)[0]), ::testing::Each(1.5f));
  // A formula that reads a full tensor writes a full one.
  g = autograd::Grad({ops::sum(ops::mul(x, x))}, {Tensor()}, {x}, {});
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE((*g)[0].is_contiguous());
  std::vector<float> expected;
  for (float v : values) expected.push_back(2 * v);
  EXPECT_THAT(Floats((*g)[0]), Pointwise(DoubleNear(1e-6), expected));
  // backward() into x.grad packs the one value (a fill), as PyTorch's layout contract asks.
  ASSERT_TRUE(autograd::Backward({ops::sum(ops::mul(x, -2.0))}, {Tensor()}, {}, {}).ok());
  EXPECT_TRUE(x.grad().is_contiguous());
  EXPECT_THAT(Floats(x.grad()), ::testing::Each(-2.0f));
}

TEST(OneValueGradientTest, MapsAndCopiesOfRowsOfOneValueFillThem) {
  // [3, 5000] from [3, 1]: each row one value, the rows different.
  const Tensor column = Tensor::FromVector<float>({1, 2, 3}, {3, 1});
  const Tensor rows = column.AsStrided({3, 5000}, {1, 0}, 0);
  const Tensor halves = Tensor::Full({3, 5000}, 0.5, DType::kFloat32);
  // (tensor, what row r's elements must be)
  const std::vector<std::pair<Tensor, std::function<float(int)>>> cases = {
      {rows.contiguous(), [](int r) { return r + 1.0f; }},
      {ops::mul(rows, 2.0), [](int r) { return 2 * (r + 1.0f); }},
      {ops::add(rows, rows), [](int r) { return 2 * (r + 1.0f); }},
      {ops::add(rows, halves), [](int r) { return r + 1.5f; }},
  };
  for (size_t k = 0; k < cases.size(); ++k) {
    const Tensor& y = cases[k].first;
    ASSERT_TRUE(y.is_contiguous()) << k;
    ASSERT_EQ(y.numel(), 15000) << k;
    for (int r = 0; r < 3; ++r) {
      const float* row = y.data<float>() + r * 5000;
      EXPECT_THAT(std::vector<float>(row, row + 5000), ::testing::Each(cases[k].second(r)))
          << "case " << k << " row " << r;
    }
  }
  // Packing converts the one value exactly: an int64 past float64's 53 bits, and to float64.
  const int64_t big = (int64_t{1} << 53) + 1;
  const Tensor ints = Tensor::FromVector<int64_t>({big}, {1}).AsStrided({10000}, {0}, 0);
  ASSERT_TRUE(ints.repeats_one_value());
  const Tensor packed = ints.contiguous();
  EXPECT_THAT(std::vector<int64_t>(packed.data<int64_t>(), packed.data<int64_t>() + 10000),
              ::testing::Each(big));
  const Tensor doubles =
      Tensor::FromVector<float>({0.1f}, {1}).AsStrided({10000}, {0}, 0).To(DType::kFloat64);
  EXPECT_THAT(std::vector<double>(doubles.data<double>(), doubles.data<double>() + 10000),
              ::testing::Each(static_cast<double>(0.1f)));
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
