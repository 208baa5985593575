// PerThread<T> (server/base/per_thread.h): each thread gets its own T, and a thread's last
// thread_local destructors see a null cache instead of a destroyed one
// (Note [Per-thread caches at thread exit]).

#include "server/base/per_thread.h"

#include <thread>

#include "gtest/gtest.h"

namespace gradserve::server {
namespace {

struct Counter {
  int value = 0;
};

TEST(PerThreadTest, EachThreadHasItsOwnValue) {
  PerThread<Counter>::Get()->value = 7;
  int seen_on_other_thread = -1;
  std::thread([&] {
    seen_on_other_thread = PerThread<Counter>::Get()->value;
    PerThread<Counter>::Get()->value = 3;
  }).join();
  EXPECT_EQ(seen_on_other_thread, 0);
  EXPECT_EQ(PerThread<Counter>::Get()->value, 7);
}

// Constructed before the thread's PerThread<Counter> slot, so destroyed after it.
struct LateGiver {
  bool* saw_null;
  ~LateGiver() { *saw_null = PerThread<Counter>::Get() == nullptr; }
};

TEST(PerThreadTest, NullOnceTheThreadsValueIsDestroyed) {
  bool saw_null = false;
  std::thread([&] {
    thread_local LateGiver giver{&saw_null};
    ASSERT_NE(PerThread<Counter>::Get(), nullptr);
  }).join();
  EXPECT_TRUE(saw_null);
}

}  // namespace
}  // namespace gradserve::server
