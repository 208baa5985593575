// CancellationToken, the thread's current token, and the kernels that check it between blocks
// of their work (Note [Stopping a running op] in engine/util/cancellation.h).

#include "engine/util/cancellation.h"

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/kernels/basic_kernels.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/linalg.h"
#include "engine/ops/nn.h"
#include "engine/ops/reductions.h"
#include "engine/ops/shape.h"
#include "engine/tensor/tensor.h"
#include "engine/util/status_error.h"
#include "gtest/gtest.h"

namespace gradserve {
namespace {

// A token whose deadline has passed: the first check inside a kernel stops it.
CancellationToken Expired() { return CancellationToken(absl::Now() - absl::Seconds(1)); }

// The status fn throws, or OK if it returns.
absl::Status StatusOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const StatusError& e) {
    return e.status();
  }
  return absl::OkStatus();
}

TEST(CancellationTest, NoCurrentTokenByDefault) {
  EXPECT_EQ(CurrentCancellationToken(), nullptr);
  EXPECT_TRUE(StatusOf(ThrowIfCancelled).ok());
}

TEST(CancellationTest, ScopesNestAndRestore) {
  CancellationToken outer, inner;
  {
    CancellationScope a(&outer);
    EXPECT_EQ(CurrentCancellationToken(), &outer);
    {
      CancellationScope b(&inner);
      EXPECT_EQ(CurrentCancellationToken(), &inner);
      CancellationScope none(nullptr);
      EXPECT_EQ(CurrentCancellationToken(), nullptr);
    }
    EXPECT_EQ(CurrentCancellationToken(), &outer);
  }
  EXPECT_EQ(CurrentCancellationToken(), nullptr);
}

TEST(CancellationTest, ThrowIfCancelledThrowsTheTokensStatus) {
  CancellationToken token;
  CancellationScope scope(&token);
  EXPECT_TRUE(StatusOf(ThrowIfCancelled).ok());
  token.Cancel(absl::CancelledError("the client cancelled the call"));
  EXPECT_EQ(StatusOf(ThrowIfCancelled), absl::CancelledError("the client cancelled the call"));

  CancellationToken expired = Expired();
  CancellationScope expired_scope(&expired);
  EXPECT_EQ(StatusOf(ThrowIfCancelled).code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(CancellationTest, TheScopeIsPerThread) {
  CancellationToken token = Expired();
  CancellationScope scope(&token);
  const CancellationToken* seen = &token;
  std::thread([&] { seen = CurrentCancellationToken(); }).join();
  EXPECT_EQ(seen, nullptr);
}

// Note [A coarse clock far from the deadline]: the inline check reads a coarse clock, yet the
// deadline comes exactly: never before absl::Now() reaches it, and at the first check after.
TEST(CancellationTest, DeadlinesComeExactlyDespiteTheCoarseClock) {
  for (absl::Duration ahead : {absl::Milliseconds(1), absl::Milliseconds(30)}) {
    const absl::Time deadline = absl::Now() + ahead;
    CancellationToken token(deadline);
    absl::Status status;
    while ((status = token.Check()).ok()) {
      ASSERT_LT(absl::Now() - deadline, absl::Seconds(5)) << "the deadline never came";
    }
    EXPECT_GE(absl::Now(), deadline);
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
    EXPECT_EQ(token.Check().code(), absl::StatusCode::kDeadlineExceeded);
  }
  // Far deadlines and none say OK; a cancel wins over both.
  CancellationToken far(absl::Now() + absl::Hours(1));
  CancellationToken none;
  EXPECT_TRUE(far.Check().ok());
  EXPECT_TRUE(none.Check().ok());
  far.Cancel(absl::CancelledError("client went away"));
  EXPECT_EQ(far.Check().code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(CancellationToken(absl::InfinitePast()).Check().code() ==
              absl::StatusCode::kDeadlineExceeded);
}

// Note [A deadline set by a timer]: nobody checks these tokens; the timer cancels each at its
// deadline, never before, and CheckCancelled (no clock) then sees it.
TEST(DeadlineTimerTest, CancelsATokenAtItsDeadlineWithoutACheck) {
  const absl::Time deadline = absl::Now() + absl::Milliseconds(20);
  CancellationToken token(deadline);
  std::atomic<bool> ran{false};
  absl::Time ran_at;
  token.AddCallback([&] {
    ran_at = absl::Now();
    ran = true;
  });
  EXPECT_TRUE(token.CheckCancelled().ok());
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (!token.cancelled() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_TRUE(token.cancelled()) << "the timer never cancelled the token";
  while (!ran) absl::SleepFor(absl::Milliseconds(1));  // the callback ends after the flag is set
  EXPECT_GE(ran_at, deadline);
  EXPECT_EQ(token.CheckCancelled().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(token.Check().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(DeadlineTimerTest, AnExpiredTokenIsCancelledWhenMade) {
  CancellationToken token(absl::Now() - absl::Milliseconds(1));
  EXPECT_TRUE(token.cancelled());
  EXPECT_EQ(token.CheckCancelled().code(), absl::StatusCode::kDeadlineExceeded);
  CancellationToken none;
  EXPECT_TRUE(none.CheckCancelled().ok());
  none.Cancel(absl::CancelledError("client went away"));
  EXPECT_EQ(none.CheckCancelled().code(), absl::StatusCode::kCancelled);
}

// Tokens made and destroyed on several threads while the timer fires others, some destroyed
// by their own callbacks on the timer's thread: under ASan and TSan, a token destroyed while
// the timer cancels it would be a use after free or a race. A sooner deadline added after a
// later one still fires first.
TEST(DeadlineTimerTest, TokensComeAndGoWhileTheTimerFires) {
  auto late = std::make_unique<CancellationToken>(absl::Now() + absl::Hours(1));
  std::vector<std::thread> threads;
  std::atomic<int> fired{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        auto token =
            std::make_shared<CancellationToken>(absl::Now() + absl::Microseconds((i * 7 + t) % 50));
        if (i % 3 == 0) {
          // Held only by its own callback: destroyed on the timer thread, inside the cancel.
          auto* self = new std::shared_ptr<CancellationToken>(token);
          token->AddCallback([self, &fired] {
            ++fired;
            delete self;
          });
          token.reset();
        } else if (i % 3 == 1) {
          absl::SleepFor(absl::Microseconds(i % 60));
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (fired < 4 * 67 && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(fired, 4 * 67);
  EXPECT_FALSE(late->cancelled());
}

TEST(CancellationTest, WorkMeterChecksOncePerBlockOfWork) {
  CancellationToken token = Expired();
  CancellationScope scope(&token);
  WorkMeter meter;
  // Up to one block of work is never checked: tiny tensors pay no clock read.
  EXPECT_TRUE(StatusOf([&] { meter.Add(kWorkPerCheck); }).ok());
  EXPECT_EQ(StatusOf([&] { meter.Add(1); }).code(), absl::StatusCode::kDeadlineExceeded);
  // After a check the count starts again.
  EXPECT_TRUE(StatusOf([&] { meter.Add(kWorkPerCheck); }).ok());
}

TEST(CancellationTest, ForEachBlockCoversTheRangeInOrder) {
  WorkMeter meter;
  std::vector<std::pair<int64_t, int64_t>> blocks;
  ForEachBlock(
      10, meter, [&](int64_t b, int64_t e) { blocks.emplace_back(b, e); }, 4);
  EXPECT_EQ(blocks, (std::vector<std::pair<int64_t, int64_t>>{{0, 4}, {4, 8}, {8, 10}}));
  blocks.clear();
  ForEachBlock(0, meter, [&](int64_t b, int64_t e) { blocks.emplace_back(b, e); });
  EXPECT_TRUE(blocks.empty());
}

// Each kernel that one call of an op can keep busy for long stops at its first check under an
// expired token, with the token's status, instead of running to its end. The tensors are a few
// blocks big; the ones of a tiny op (below) are never checked.
struct KernelCase {
  std::string name;
  std::function<void()> run;
};

std::vector<KernelCase> KernelCases() {
  constexpr int64_t kN = 1 << 18;  // four blocks of elements
  const Tensor x = Tensor::Full({kN}, 0.5, DType::kFloat32);
  const Tensor rows = Tensor::Full({512, 512}, 0.5, DType::kFloat64);
  const Tensor column = Tensor::Full({512, 1}, 0.5, DType::kFloat64);
  const Tensor one_row = Tensor::Full({1, kN}, 0.5, DType::kFloat64);
  const Tensor index = Tensor::Zeros({kN}, DType::kInt64);
  const Tensor targets = Tensor::Zeros({kN}, DType::kInt64);
  const Tensor sum_into = x.Clone();
  std::vector<KernelCase> cases = {
      {"Fill", [=] { Tensor::Zeros({kN}, DType::kFloat32); }},
      {"Copy", [=] { x.To(DType::kFloat64); }},
      {"ContiguousCopy", [=] { x.Clone(); }},
      {"StridedCopy", [=] { ops::transpose(rows, 0, 1).contiguous(); }},
      {"Accumulate", [=] { AccumulateInto(sum_into, x); }},
      {"MapContiguous", [=] { ops::exp(x); }},
      {"MapBroadcast", [=] { ops::add(rows, column); }},
      {"ReduceAll", [=] { ops::sum(x); }},
      {"ReduceRows", [=] { ops::sum(rows, {0}); }},
      {"SoftmaxOneRow", [=] { ops::softmax(one_row, 1); }},
      {"LogSoftmaxRows", [=] { ops::log_softmax(rows, 0); }},
      {"LayerNormOneRow", [=] { ops::layer_norm(one_row, {kN}); }},
      {"MatmulFloat",
       [] {
         ops::matmul(Tensor::Full({2048, 2048}, 1, DType::kFloat32),
                     Tensor::Full({2048, 2048}, 1, DType::kFloat32));
       }},
      {"MatmulDoubleManySmall",  // one call per product: counted per call
       [] {
         ops::matmul(Tensor::Full({1 << 17, 4, 4}, 1, DType::kFloat64),
                     Tensor::Full({1 << 17, 4, 4}, 1, DType::kFloat64));
       }},
      {"MatmulInt64",
       [] {
         ops::matmul(Tensor::Full({256, 256}, 1, DType::kInt64),
                     Tensor::Full({256, 256}, 1, DType::kInt64));
       }},
      {"Conv2d",
       [] {
         ops::conv2d(Tensor::Full({1, 4, 128, 128}, 1, DType::kFloat32),
                     Tensor::Full({4, 4, 3, 3}, 1, DType::kFloat32));
       }},
      {"Cat",
       [=] {
         ops::cat({x, x});
       }},
      {"IndexSelect", [=] { ops::index_select(x, 0, index); }},
      {"Gather", [=] { ops::gather(x, 0, index); }},
      {"MseLoss", [=] { ops::mse_loss(x, x); }},
      {"NllLoss",
       [=] {
         ops::nll_loss(Tensor::Full({kN, 1}, -0.5, DType::kFloat32), targets);
       }},
  };
  return cases;
}

TEST(CancellationTest, LongKernelsStopAtTheirFirstCheck) {
  for (const KernelCase& c : KernelCases()) {
    SCOPED_TRACE(c.name);
    {
      // Without a token the kernel runs to its end.
      EXPECT_TRUE(StatusOf(c.run).ok());
    }
    CancellationToken token = Expired();
    CancellationScope scope(&token);
    EXPECT_EQ(StatusOf(c.run).code(), absl::StatusCode::kDeadlineExceeded);
    CancellationToken cancelled;
    cancelled.Cancel(absl::CancelledError("the client cancelled the call"));
    CancellationScope cancelled_scope(&cancelled);
    EXPECT_EQ(StatusOf(c.run), absl::CancelledError("the client cancelled the call"));
  }
}

TEST(CancellationTest, TinyOpsAreNeverChecked) {
  CancellationToken token = Expired();
  CancellationScope scope(&token);
  const Tensor x = Tensor::Full({1024}, 0.5, DType::kFloat32);
  EXPECT_TRUE(StatusOf([&] {
                ops::sum(ops::softmax(ops::exp(x), 0));
                ops::matmul(Tensor::Full({16, 16}, 1, DType::kFloat64),
                            Tensor::Full({16, 16}, 1, DType::kFloat64));
              }).ok());
}

}  // namespace
}  // namespace gradserve
