// Note [Nodes on the budget] and Note [GraphTask node table]: a recorded graph's Nodes and the
// Engine's table of a pass's Nodes are charged to the request's memory budget.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "engine/autograd/autograd.h"
#include "engine/autograd/node.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/reductions.h"
#include "engine/ops/shape.h"
#include "engine/tensor/memory_budget.h"
#include "engine/util/status_error.h"
#include "gtest/gtest.h"

namespace gradserve {
namespace {

Tensor LeafOf(std::vector<double> values) {
  Tensor t = Tensor::FromVector<double>(values, {static_cast<int64_t>(values.size())});
  t.set_requires_grad(true);
  return t;
}

TEST(NodeBudgetTest, NodesAreChargedWhileTheyLive) {
  auto budget = MemoryBudget::Make();
  {
    MemoryBudgetScope scope(budget);
    Tensor x = LeafOf({1, 2});
    Tensor y = ops::mul(x, 3.0);
    const std::shared_ptr<autograd::Node>& fn = y.grad_fn();
    ASSERT_NE(fn, nullptr);
    EXPECT_GE(fn->charged_bytes(), autograd::kNodeOverheadBytes);
    // The Node and the leaf's AccumulateGrad, besides the tensors' bytes.
    const std::shared_ptr<autograd::Node>& leaf_fn = fn->next_edge(0).function;
    EXPECT_GE(leaf_fn->charged_bytes(), autograd::kNodeOverheadBytes);
    EXPECT_GE(budget->used(), fn->charged_bytes() + leaf_fn->charged_bytes() + 2 * 16);
  }
  EXPECT_EQ(budget->used(), 0);
}

TEST(NodeBudgetTest, EdgesPastTheCoveredOnesAreCharged) {
  auto budget = MemoryBudget::Make();
  MemoryBudgetScope scope(budget);
  std::vector<Tensor> parts;
  for (int i = 0; i < 10; ++i) parts.push_back(LeafOf({1.0 * i}));
  const Tensor two = ops::cat({parts[0], parts[1]});
  const Tensor ten = ops::cat(parts);
  EXPECT_EQ(ten.grad_fn()->charged_bytes() - two.grad_fn()->charged_bytes(),
            8 * autograd::kEdgeBytes);
}

TEST(NodeBudgetTest, NodesNoneMadeWithoutABudget) {
  Tensor y = ops::mul(LeafOf({1}), 2.0);
  EXPECT_EQ(y.grad_fn()->charged_bytes(), 0);
}

TEST(NodeBudgetTest, RecordingOverTheBudgetIsRefused) {
  // 16 KiB holds a few dozen Nodes of one-element tensors, not a thousand.
  auto budget = MemoryBudget::Make(16 << 10);
  MemoryBudgetScope scope(budget);
  Tensor y = LeafOf({0.5});
  absl::Status status;
  try {
    for (int i = 0; i < 1000; ++i) y = ops::sin(y);
  } catch (const StatusError& e) {
    status = e.status();
  }
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_LE(budget->peak(), 16 << 10);
  y = Tensor();
  EXPECT_EQ(budget->used(), 0);
}

// A backward with create_graph records Nodes (charged on the Engine's thread, to the pass's
// budget); every pass charges its node table while it runs, and gives it back.
TEST(NodeBudgetTest, BackwardChargesItsNodesAndItsNodeTable) {
  auto budget = MemoryBudget::Make();
  int64_t graph_bytes = 0;
  Tensor x, loss;
  {
    MemoryBudgetScope scope(budget);
    x = LeafOf({0.5, 0.25});
    Tensor y = x;
    for (int i = 0; i < 100; ++i) y = ops::sin(y);
    loss = ops::sum(y);
  }
  graph_bytes = budget->used();
  autograd::BackwardOptions options;
  options.budget = budget;
  options.create_graph = true;
  options.retain_graph = true;
  absl::StatusOr<TensorList> grads = autograd::Grad({loss}, {Tensor()}, {x}, options);
  ASSERT_TRUE(grads.ok()) << grads.status();
  // The gradient's own graph: about three Nodes per sin.
  const int64_t with_gradient_graph = budget->used();
  EXPECT_GT(with_gradient_graph - graph_bytes, 200 * autograd::kNodeOverheadBytes);
  // The table of the pass's 102 Nodes was charged (the peak) and given back.
  EXPECT_GT(budget->peak(), with_gradient_graph);
  grads = TensorList();
  EXPECT_EQ(budget->used(), graph_bytes);

  // A budget too small for the gradient's graph stops the backward.
  auto small = MemoryBudget::Make(64 * autograd::kNodeOverheadBytes);
  options.budget = small;
  grads = autograd::Grad({loss}, {Tensor()}, {x}, options);
  EXPECT_EQ(grads.status().code(), absl::StatusCode::kResourceExhausted) << grads.status();
  EXPECT_EQ(small->used(), 0);
}

}  // namespace
}  // namespace gradserve
