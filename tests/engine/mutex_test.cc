#include "engine/util/mutex.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace gradserve {
namespace {

// Note [Node locks without a call]: under contention every increment is still made under the
// lock (ThreadSanitizer, in CI, checks the plain counter too).
TEST(FastMutexTest, ContendedIncrementsAreNeverLost) {
  FastMutex mu;
  int64_t counter = 0;
  constexpr int kThreads = 4;
  constexpr int kIncrements = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kIncrements; ++i) {
        MutexLock lock(&mu);
        ++counter;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(counter, int64_t{kThreads} * kIncrements);
}

// A thread that finds the mutex held sleeps in the kernel until the holder unlocks it, and is
// woken then.
TEST(FastMutexTest, AWaiterIsWokenWhenTheHolderUnlocks) {
  FastMutex mu;
  std::atomic<bool> waiting{false};
  std::atomic<bool> acquired{false};
  mu.Lock();
  std::thread waiter([&] {
    waiting = true;
    MutexLock lock(&mu);
    acquired = true;
  });
  while (!waiting) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(acquired);
  mu.Unlock();
  waiter.join();
  EXPECT_TRUE(acquired);
  // Free again, and still usable after a wake-up.
  MutexLock lock(&mu);
}

}  // namespace
}  // namespace gradserve
