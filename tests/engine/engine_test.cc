// Tests of the Engine's semantics (DESIGN.md section 2), on the small functions of
// test_nodes.h so they do not depend on the op set.

#include "engine/autograd/engine.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "engine/autograd/autograd.h"
#include "engine/autograd/busy_time.h"
#include "engine/autograd/grad_mode.h"
#include "engine/autograd/variable.h"
#include "engine/device/device_registry.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/test_nodes.h"

namespace gradserve::autograd {
namespace {

using ::gradserve::testing::Add;
using ::gradserve::testing::LambdaBackward;
using ::gradserve::testing::Leaf;
using ::gradserve::testing::Record;
using ::gradserve::testing::ScalarLeaf;
using ::gradserve::testing::Scale;
using ::gradserve::testing::Square;
using ::gradserve::testing::Sum;
using ::gradserve::testing::Values;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class NamedNode : public Node {
 public:
  TensorList apply(TensorList&&) override { return {}; }
  std::string name() const override { return "NamedNode"; }
};

TEST(ReadyQueueTest, OrderShutdownThenWakeupThenDepthThenSequence) {
  ReadyQueue queue;
  auto old_node = MakeNode<NamedNode>();
  auto new_node = MakeNode<NamedNode>();
  queue.push(NodeTask({}, old_node, InputBuffer(0), 0), false);
  queue.push(NodeTask({}, new_node, InputBuffer(0), 0), false);
  queue.push(NodeTask({}, old_node, InputBuffer(0), 3), false);
  queue.push(NodeTask({}, nullptr, InputBuffer(0), 0), false);
  queue.push_shutdown_task();
  EXPECT_TRUE(queue.pop().is_shutdown_task);
  EXPECT_EQ(queue.pop().fn, nullptr);
  NodeTask deep = queue.pop();
  EXPECT_EQ(deep.reentrant_depth, 3);
  EXPECT_EQ(queue.pop().fn, new_node);
  EXPECT_EQ(queue.pop().fn, old_node);
  EXPECT_FALSE(queue.pop(absl::Now() + absl::Milliseconds(5)).has_value());
}

TEST(EngineTest, FanInAccumulates) {
  Tensor x = Leaf({1, 2});
  Tensor y = Sum(Add(Scale(x, 2), Scale(x, 3)));
  ASSERT_TRUE(Backward({y}, {}, {}, {}).ok());
  EXPECT_THAT(Values(x.grad()), ElementsAre(5, 5));
  // A second backward (graph retained by nothing here: these nodes save nothing) sums again.
  ASSERT_TRUE(Backward({y}, {}, {}, {}).ok());
  EXPECT_THAT(Values(x.grad()), ElementsAre(10, 10));
}

TEST(EngineTest, SeveralRootsWithSeedsGoThroughGraphRoot) {
  Tensor x = Leaf({1});
  Tensor y1 = Scale(x, 2);
  Tensor y2 = Scale(x, 3);
  auto grads =
      Grad({y1, y2}, {gradserve::testing::Vec({1}), gradserve::testing::Vec({10})}, {x}, {});
  ASSERT_TRUE(grads.ok()) << grads.status();
  EXPECT_THAT(Values((*grads)[0]), ElementsAre(32));
}

TEST(EngineTest, NodesOffThePathToOutputsNeverRun) {
  Tensor x = Leaf({1});
  Tensor w = Leaf({1});
  std::shared_ptr<LambdaBackward> x_branch, w_branch;
  Tensor a = Scale(x, 2, &x_branch);
  Tensor b = Scale(w, 3, &w_branch);
  Tensor loss = Add(a, b);
  ExecuteStats stats;
  BackwardOptions options;
  options.stats = &stats;
  auto grads = Grad({loss}, {}, {x}, options);
  ASSERT_TRUE(grads.ok()) << grads.status();
  EXPECT_THAT(Values((*grads)[0]), ElementsAre(2));
  EXPECT_EQ(x_branch->calls, 1);
  EXPECT_EQ(w_branch->calls, 0);
  EXPECT_FALSE(w.grad().defined());
  EXPECT_FALSE(x.grad().defined());  // grad() captures, never accumulates
}

TEST(EngineTest, MinTopoNrPrunesSubgraphsThatCannotReachTheOutputs) {
  // c sits 50 nodes above x; a 10-node chain from w joins at the loss. Asking for the gradient
  // of c (topological_nr 50) must not walk below it, nor into w's chain, whose head has
  // topological_nr 10.
  Tensor x = Leaf({1});
  Tensor w = Leaf({1});
  Tensor c = x;
  for (int i = 0; i < 50; ++i) c = Scale(c, 1.0);
  Tensor deep = w;
  for (int i = 0; i < 10; ++i) deep = Scale(deep, 1.0);
  Tensor e = Scale(c, 2);
  Tensor loss = Add(e, deep);
  ExecuteStats stats;
  BackwardOptions options;
  options.stats = &stats;
  auto grads = Grad({loss}, {}, {c}, options);
  ASSERT_TRUE(grads.ok()) << grads.status();
  EXPECT_THAT(Values((*grads)[0]), ElementsAre(2));
  // Reached: loss's node, e's, deep's head (not expanded), c's node (expanded: it may lead to
  // another output) and its child (not expanded).
  EXPECT_EQ(stats.nodes_in_graph, 5);
  EXPECT_EQ(stats.nodes_executed, 2);  // loss's and e's; c's node only captures
  ExecuteStats unpruned;
  options.stats = &unpruned;
  ASSERT_TRUE(Grad({loss}, {}, {x}, options).ok());
  EXPECT_EQ(unpruned.nodes_in_graph, 1 + 1 + 50 + 1 + 10 + 1);  // + both AccumulateGrads
}

// 600 roots under one GraphRoot, whose topological_nr (the node table's first size) is 3, so
// the table grows as compute_dependencies walks; init_to_execute's verdicts are whole, and w's
// half, off every path to x, never runs.
TEST(EngineTest, AWideGraphGrowsTheNodeTableAndRunsOnlyWhatLeadsToTheOutputs) {
  Tensor x = Leaf({1, 2});
  Tensor w = Leaf({3, 4});
  TensorList roots;
  for (int i = 0; i < 300; ++i) {
    roots.push_back(Sum(Scale(x, i)));
    roots.push_back(Sum(Scale(w, i)));
  }
  ExecuteStats stats;
  BackwardOptions options;
  options.stats = &stats;
  auto grads = Grad(roots, {}, {x}, options);
  ASSERT_TRUE(grads.ok()) << grads.status();
  EXPECT_THAT(Values((*grads)[0]), ElementsAre(44850, 44850));  // 0 + 1 + ... + 299
  EXPECT_EQ(stats.nodes_in_graph, 1 + 600 + 600 + 2);           // GraphRoot, sums, scales, leaves
  EXPECT_EQ(stats.nodes_executed, 1 + 300 + 300);               // GraphRoot and x's half
}

TEST(EngineTest, CapturesIntermediatesAndLeavesOnOnePath) {
  Tensor x = Leaf({3});
  Tensor h = Square(x);    // 9
  Tensor y = Scale(h, 2);  // 18
  auto grads = Grad({y}, {}, {h, x}, {});
  ASSERT_TRUE(grads.ok()) << grads.status();
  EXPECT_THAT(Values((*grads)[0]), ElementsAre(2));
  EXPECT_THAT(Values((*grads)[1]), ElementsAre(12));
}

TEST(EngineTest, UnusedInputsNeedAllowUnusedOrMaterialize) {
  Tensor x = Leaf({1, 2});
  Tensor unused = Leaf({5, 6});
  unused.set_name("u");
  Tensor y = Sum(Scale(x, 2));
  auto failed = Grad({y}, {}, {x, unused}, {});
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(failed.status().message()), HasSubstr("input 'u'"));

  BackwardOptions allow;
  allow.allow_unused = true;
  auto grads = Grad({y}, {}, {x, unused}, allow);
  ASSERT_TRUE(grads.ok());
  EXPECT_FALSE((*grads)[1].defined());

  BackwardOptions materialize;
  materialize.materialize_grads = true;
  grads = Grad({y}, {}, {x, unused}, materialize);
  ASSERT_TRUE(grads.ok());
  EXPECT_THAT(Values((*grads)[1]), ElementsAre(0, 0));
}

TEST(EngineTest, SecondBackwardWithoutKeepGraphFailsClearly) {
  Tensor x = Leaf({3});
  Tensor y = Sum(Square(x));
  BackwardOptions retain;
  retain.retain_graph = true;
  ASSERT_TRUE(Backward({y}, {}, {}, retain).ok());
  ASSERT_TRUE(Backward({y}, {}, {}, {}).ok());
  EXPECT_THAT(Values(x.grad()), ElementsAre(12));
  absl::Status again = Backward({y}, {}, {}, {});
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(again.message()), HasSubstr("second time"));
  EXPECT_THAT(std::string(again.message()), HasSubstr("SquareBackward"));
}

TEST(EngineTest, FirstErrorResolvesTheFutureAndStopsTheRest) {
  Tensor x = Leaf({1});
  std::shared_ptr<LambdaBackward> after;
  Tensor other = Scale(x, 5, &after);
  // failing's node runs first (the highest sequence_nr among the ready nodes after the add),
  // and x's other branch must not run once it failed.
  Tensor failing =
      Record(x.detach().Clone(), {x}, "FailingBackward",
             [](TensorList&&) -> TensorList { ThrowStatus(absl::InvalidArgumentError("boom")); });
  Tensor loss = Add(other, failing);
  auto grads = Grad({loss}, {}, {x}, {});
  ASSERT_FALSE(grads.ok());
  EXPECT_EQ(grads.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(grads.status().message()), HasSubstr("FailingBackward"));
  EXPECT_THAT(std::string(grads.status().message()), HasSubstr("boom"));
  EXPECT_EQ(after->calls, 0);
}

TEST(EngineTest, AnomalyModeNamesTheNodeThatMadeNaN) {
  Tensor x = Leaf({1});
  Tensor y = Record(x.detach().Clone(), {x}, "NaNBackward", [](TensorList&& g) {
    return TensorList{Tensor::Full({1}, std::nan(""), DType::kFloat64)};
  });
  y.grad_fn()->set_label("op #0 'y' = weird");
  Tensor loss = Sum(Scale(y, 2));
  BackwardOptions options;
  options.anomaly_mode = true;
  auto grads = Grad({loss}, {}, {x}, options);
  ASSERT_FALSE(grads.ok());
  EXPECT_EQ(grads.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(grads.status().message()), HasSubstr("NaNBackward"));
  EXPECT_THAT(std::string(grads.status().message()), HasSubstr("'y' = weird"));
  // Without anomaly mode the NaN is just a value.
  auto plain = Grad({loss}, {}, {x}, {});
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(std::isnan(Values((*plain)[0])[0]));
}

class RecordingHook : public TensorHook {
 public:
  RecordingHook(std::vector<std::string>* log, double factor) : log_(log), factor_(factor) {}
  Tensor operator()(const Tensor& grad) override {
    log_->push_back("tensor");
    return gradserve::testing::ScaleData(grad, factor_);
  }

 private:
  std::vector<std::string>* log_;
  double factor_;
};
class RecordingPreHook : public FunctionPreHook {
 public:
  explicit RecordingPreHook(std::vector<std::string>* log) : log_(log) {}
  TensorList operator()(const TensorList& grads) override {
    log_->push_back("pre");
    return grads;
  }
  std::vector<std::string>* log_;
};
class RecordingPostHook : public FunctionPostHook {
 public:
  explicit RecordingPostHook(std::vector<std::string>* log) : log_(log) {}
  TensorList operator()(const TensorList& outputs, const TensorList&) override {
    log_->push_back("post");
    return {gradserve::testing::ScaleData(outputs[0], 10)};
  }
  std::vector<std::string>* log_;
};

TEST(EngineTest, HooksRunInOrderAndChangeGradients) {
  std::vector<std::string> log;
  Tensor x = Leaf({1});
  Tensor h = Scale(x, 2);
  RegisterHook(h, std::make_shared<RecordingHook>(&log, 3));  // tensor pre-hook on h's node
  h.grad_fn()->add_pre_hook(std::make_unique<RecordingPreHook>(&log));
  h.grad_fn()->add_post_hook(std::make_unique<RecordingPostHook>(&log));
  RegisterHook(x, std::make_shared<RecordingHook>(&log, 0.5));  // on x's AccumulateGrad
  Tensor loss = Sum(h);
  ASSERT_TRUE(Backward({loss}, {}, {}, {}).ok());
  EXPECT_THAT(log, ElementsAre("tensor", "pre", "post", "tensor"));
  // 1 * 3 (hook) * 2 (scale) * 10 (post) * 0.5 (leaf hook)
  EXPECT_THAT(Values(x.grad()), ElementsAre(30));
}

// A Node whose backward runs a nested backward through a fresh graph `depth` levels deep.
Tensor Reentrant(const Tensor& x, int depth);

class ReentrantBackward : public Node {
 public:
  explicit ReentrantBackward(int depth) : depth_(depth) {}
  TensorList apply(TensorList&& grads) override {
    GradModeGuard enable_grad(true);  // the nested graph is recorded, as checkpoint does
    Tensor inner = ScalarLeaf(1.0);
    Tensor out = depth_ > 0 ? Reentrant(inner, depth_ - 1) : Scale(inner, 2);
    auto nested = Grad({out}, {}, {inner}, {});
    ThrowIfError(nested.status());
    // d/dx = grads * 2 at the bottom; each level passes it on.
    return {gradserve::testing::ScaleData(grads[0], Values((*nested)[0])[0])};
  }
  std::string name() const override { return "ReentrantBackward"; }

 private:
  int depth_;
};

Tensor Reentrant(const Tensor& x, int depth) {
  Tensor out = x.detach().Clone();
  auto fn = MakeNode<ReentrantBackward>(depth);
  fn->set_next_edges(CollectNextEdges({x}));
  SetHistory(out, fn);
  return out;
}

TEST(EngineTest, ReentrantDepth200FinishesAndUsesThePool) {
  const int64_t pool_busy = EngineBusyNanos(EngineThread::kReentrant);
  const int64_t owner_busy = EngineBusyNanos(EngineThread::kOwner);
  Tensor x = ScalarLeaf(1.0);
  auto grads = Grad({Reentrant(x, 200)}, {}, {x}, {});
  ASSERT_TRUE(grads.ok()) << grads.status();
  EXPECT_THAT(Values((*grads)[0]), ElementsAre(2));
  // The pool's threads outlive the pass and are reused by the next deep one (a repeat of this
  // test starts none): that the pool ran this pass is its busy time growing, below.
  EXPECT_GT(Engine::Get().reentrant_pool_threads_started(), 0);
  // Note [Engine busy time]: a pool thread's stretch is added when its thread_main ends, which
  // may be just after the pass it ran woke the caller (CI saw 0 once, under ASan).
  for (const absl::Time give_up = absl::Now() + absl::Seconds(10);
       EngineBusyNanos(EngineThread::kReentrant) <= pool_busy && absl::Now() < give_up;) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_GT(EngineBusyNanos(EngineThread::kReentrant), pool_busy);
  EXPECT_GT(EngineBusyNanos(EngineThread::kOwner), owner_busy);
}

TEST(EngineTest, ManyGraphTasksFromManyThreads) {
  // 64 passes from 8 threads: half over private graphs, half over one retained shared graph.
  Tensor shared_x = Leaf({2});
  Tensor shared_y = Sum(Square(Scale(shared_x, 3)));  // 9 x^2 -> 18 x = 36
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 8; ++i) {
        if (i % 2 == 0) {
          Tensor x = Leaf({double(t), double(i)});
          auto g = Grad({Sum(Square(x))}, {}, {x}, {});
          if (!g.ok() || Values((*g)[0]) != std::vector<double>{2.0 * t, 2.0 * i}) ++failures;
        } else {
          BackwardOptions retain;
          retain.retain_graph = true;
          auto g = Grad({shared_y}, {}, {shared_x}, retain);
          if (!g.ok() || Values((*g)[0])[0] != 36) ++failures;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures, 0);
}

// Note [Fewer atomics per Node]: a pass promised to be the only one over its Nodes, and a pass
// on one thread, run the same Nodes to the same gradients and count them all.
TEST(EngineTest, ASolePassGivesTheSameGradientsAndCountsEveryNode) {
  // A fan-in (queued tasks) over a chain (handed-over tasks), and a branch that only captures.
  Tensor x = Leaf({0.5, -1.5});
  Tensor chain = x;
  for (int i = 0; i < 20; ++i) chain = Scale(chain, 1.0 + i * 0.01);
  Tensor acc = Scale(x, 0.0);
  for (int i = 0; i < 10; ++i) acc = Add(acc, Square(Scale(chain, 1.0 + i)));
  Tensor loss = Sum(acc);
  for (const bool sole : {false, true}) {
    SCOPED_TRACE(sole ? "sole pass" : "shared");
    ExecuteStats stats;
    BackwardOptions options;
    options.retain_graph = true;
    options.sole_pass = sole;
    options.stats = &stats;
    auto grads = Grad({loss}, {}, {x}, options);
    ASSERT_TRUE(grads.ok()) << grads.status();
    // loss, the 10 adds, 10 squares, 10 scales, the 20 scales of the chain and x's scale by 0.
    EXPECT_EQ(stats.nodes_executed, 1 + 10 + 10 + 10 + 20 + 1);
    BackwardOptions reference;
    reference.retain_graph = true;
    auto expected = Grad({loss}, {}, {x}, reference);
    ASSERT_TRUE(expected.ok()) << expected.status();
    EXPECT_EQ(Values((*grads)[0]), Values((*expected)[0]));
  }
  // A sole pass that fails counts the Nodes that ran before the error, as any pass does.
  BackwardOptions sole;
  sole.sole_pass = true;
  ASSERT_TRUE(Grad({loss}, {}, {x}, sole).ok());  // frees the saved tensors
  ExecuteStats stats;
  sole.stats = &stats;
  EXPECT_EQ(Grad({loss}, {}, {x}, sole).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_GE(stats.nodes_executed, 1);
}

// A sole pass nested in Nodes 200 deep runs partly on the reentrant pool; its nested passes take
// their Nodes' locks as usual, and the gradient is whole.
TEST(EngineTest, ASolePassWithReentrantNodesFinishes) {
  Tensor x = ScalarLeaf(1.0);
  BackwardOptions sole;
  sole.sole_pass = true;
  auto grads = Grad({Reentrant(x, 200)}, {}, {x}, sole);
  ASSERT_TRUE(grads.ok()) << grads.status();
  EXPECT_THAT(Values((*grads)[0]), ElementsAre(2));
}

TEST(EngineTest, GradModeIsPerThread) {
  NoGradGuard no_grad;
  EXPECT_FALSE(GradMode::is_enabled());
  bool other_thread_enabled = false;
  std::thread([&] { other_thread_enabled = GradMode::is_enabled(); }).join();
  EXPECT_TRUE(other_thread_enabled);
  Tensor x = Leaf({1});
  EXPECT_FALSE(Scale(x, 2).requires_grad());
}

TEST(EngineTest, CreateGraphGivesDifferentiableGradients) {
  Tensor x = Leaf({3});
  Tensor y = Sum(gradserve::testing::Mul(x, x));
  BackwardOptions create;
  create.create_graph = true;
  auto first = Grad({y}, {}, {x}, create);  // 2x, recorded
  ASSERT_TRUE(first.ok());
  EXPECT_TRUE((*first)[0].requires_grad());
  auto second = Grad({Sum((*first)[0])}, {}, {x}, {});
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_THAT(Values((*second)[0]), ElementsAre(2));
}

class SimulatedDeviceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { (void)RegisterSimulatedDevices(2); }
};

TEST_F(SimulatedDeviceTest, NodesRunOnTheirDeviceThreadAndWakeTheOwner) {
  const int64_t device_busy = EngineBusyNanos(EngineThread::kDevice);
  const Device sim0{DeviceType::kSimulated, 0};
  const Device sim1{DeviceType::kSimulated, 1};
  Tensor x = Leaf({1, 2});
  std::shared_ptr<LambdaBackward> on_sim0, on_sim1, on_cpu;
  Tensor a = Scale(gradserve::testing::ToDevice(x, sim0), 2, &on_sim0);
  Tensor b = Scale(gradserve::testing::ToDevice(x, sim1), 3, &on_sim1);
  Tensor c = Scale(x, 4, &on_cpu);
  Tensor loss = Sum(
      Add(Add(gradserve::testing::ToDevice(a, kCPU), gradserve::testing::ToDevice(b, kCPU)), c));
  auto grads = Grad({loss}, {}, {x}, {});
  ASSERT_TRUE(grads.ok()) << grads.status();
  EXPECT_THAT(Values((*grads)[0]), ElementsAre(9, 9));
  EXPECT_EQ((*grads)[0].device(), kCPU);
  const auto self = std::this_thread::get_id();
  MutexLock l0(&on_sim0->thread_mutex), l1(&on_sim1->thread_mutex), l2(&on_cpu->thread_mutex);
  EXPECT_NE(on_sim0->last_thread, self);
  EXPECT_NE(on_sim1->last_thread, self);
  EXPECT_NE(on_sim0->last_thread, on_sim1->last_thread);
  EXPECT_EQ(on_cpu->last_thread, self);
  EXPECT_GE(Engine::Get().device_threads_started(), 2);
  // Note [Engine busy time]: a device thread adds its stretch when it next waits, just after
  // it hands the pass back.
  const absl::Time end = absl::Now() + absl::Seconds(10);
  while (EngineBusyNanos(EngineThread::kDevice) == device_busy && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_GT(EngineBusyNanos(EngineThread::kDevice), device_busy);
}

// Note [Fewer atomics per Node]: a pass with Nodes on devices runs them on the device threads
// at the same time as its host Nodes, so it hands gradients on under the pass's lock, sole or
// not (ThreadSanitizer checks this test).
TEST_F(SimulatedDeviceTest, APassWithDeviceNodesStaysCorrectWhenSole) {
  const Device sim0{DeviceType::kSimulated, 0};
  const Device sim1{DeviceType::kSimulated, 1};
  for (int round = 0; round < 20; ++round) {
    Tensor x = Leaf({1, 2});
    Tensor acc = Scale(x, 1);
    for (int i = 0; i < 8; ++i) {
      const Device device = i % 2 == 0 ? sim0 : sim1;
      Tensor on_device = Scale(gradserve::testing::ToDevice(x, device), 1.0 + i);
      acc = Add(acc, Add(gradserve::testing::ToDevice(on_device, kCPU), Scale(x, 1)));
    }
    BackwardOptions sole;
    sole.sole_pass = true;
    auto grads = Grad({Sum(acc)}, {}, {x}, sole);
    ASSERT_TRUE(grads.ok()) << grads.status();
    // 1 + sum over i of (1 + i) + 8.
    EXPECT_THAT(Values((*grads)[0]), ElementsAre(45, 45));
  }
}

TEST_F(SimulatedDeviceTest, InputBufferPicksTheFirstAcceleratorInput) {
  const Device sim1{DeviceType::kSimulated, 1};
  InputBuffer buffer(2);
  buffer.add(0, gradserve::testing::Vec({1}));
  EXPECT_EQ(buffer.device(), kCPU);
  buffer.add(1, gradserve::testing::Vec({1}).To(sim1));
  EXPECT_EQ(buffer.device(), sim1);
}

TEST_F(SimulatedDeviceTest, ErrorOnADeviceThreadReachesTheOwner) {
  const Device sim0{DeviceType::kSimulated, 0};
  Tensor x = Leaf({1});
  Tensor on_device = gradserve::testing::ToDevice(x, sim0);
  Tensor bad = Record(
      on_device.detach().Clone(), {on_device}, "DeviceFailBackward",
      [](TensorList&&) -> TensorList { ThrowStatus(absl::InvalidArgumentError("device boom")); });
  auto grads = Grad({Sum(gradserve::testing::ToDevice(bad, kCPU))}, {}, {x}, {});
  ASSERT_FALSE(grads.ok());
  EXPECT_THAT(std::string(grads.status().message()), HasSubstr("device boom"));
}

TEST(EngineTest, CancellationStopsThePassAndFreesItsBuffers) {
  Tensor x = Leaf({1});
  auto token = std::make_shared<CancellationToken>();
  std::atomic<bool> started{false};
  Tensor slow = Record(x.detach().Clone(), {x}, "SlowBackward", [&](TensorList&& g) {
    started = true;
    while (!token->cancelled()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return TensorList{g[0]};
  });
  std::shared_ptr<LambdaBackward> after;
  Tensor loss = Sum(Scale(slow, 2, &after));
  auto budget = MemoryBudget::Make();
  std::thread canceller([&] {
    while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    token->Cancel(absl::CancelledError("client cancelled"));
  });
  BackwardOptions options;
  options.cancel = token;
  options.budget = budget;
  absl::Status status = Backward({loss}, {}, {}, options);
  canceller.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled);
  EXPECT_FALSE(x.grad().defined());
  EXPECT_EQ(budget->used(), 0);
}

TEST(EngineTest, DeadlineExceededBetweenNodes) {
  Tensor x = Leaf({1});
  Tensor slow = Record(x.detach().Clone(), {x}, "SlowBackward", [](TensorList&& g) {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    return TensorList{g[0]};
  });
  Tensor loss = Sum(Scale(slow, 2));
  BackwardOptions options;
  options.cancel = std::make_shared<CancellationToken>(absl::Now() + absl::Milliseconds(10));
  absl::Status status = Backward({loss}, {}, {}, options);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(EngineTest, BadSeedsAndRootsAreInvalidArgument) {
  Tensor x = Leaf({1, 2});
  Tensor y = Scale(x, 2);
  EXPECT_EQ(Backward({y}, {}, {}, {}).code(), absl::StatusCode::kInvalidArgument);  // not scalar
  EXPECT_EQ(Backward({y}, {gradserve::testing::Vec({1})}, {}, {}).code(),
            absl::StatusCode::kInvalidArgument);  // shape
  EXPECT_EQ(Backward({gradserve::testing::Vec({1})}, {}, {}, {}).code(),
            absl::StatusCode::kInvalidArgument);  // no grad
  EXPECT_EQ(Grad({Sum(y)}, {}, {gradserve::testing::Vec({1})}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);  // input needs no grad
}

TEST(EngineTest, LongChainsBackwardAndFreeWithoutRecursion) {
  // A backward through 100,000 nodes, then freeing a chain of 1,000,000 nodes.
  Tensor x = ScalarLeaf(1.0);
  Tensor y = x;
  for (int i = 0; i < 100'000; ++i) y = Scale(y, 1.0);
  auto grads = Grad({y}, {}, {x}, {});
  ASSERT_TRUE(grads.ok());
  EXPECT_THAT(Values((*grads)[0]), ElementsAre(1));

  std::shared_ptr<Node> head = MakeNode<NamedNode>();
  for (int i = 0; i < 1'000'000; ++i) {
    auto next = MakeNode<NamedNode>();
    next->set_next_edges({Edge(std::move(head), 0)});
    head = std::move(next);
  }
  EXPECT_EQ(head->topological_nr(), 1'000'000u);
  head.reset();  // would overflow the stack if deletion recursed
}

}  // namespace
}  // namespace gradserve::autograd
