#include "engine/util/mutex.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace gradserve {

// Note [Node locks without a call].
static_assert(sizeof(std::atomic<int>) == sizeof(int) && std::atomic<int>::is_always_lock_free,
              "the futex calls take the state as an int");

void FastMutex::LockSlow() {
  // Mark the mutex as having a waiter, and sleep while someone else holds it. An exchange that
  // finds it free (0) takes it; it is then left at 2, which costs the next Unlock a wake-up
  // call that may find no one, but never loses one.
  while (state_.exchange(2, std::memory_order_acquire) != 0) {
    syscall(SYS_futex, reinterpret_cast<int*>(&state_), FUTEX_WAIT_PRIVATE, 2, nullptr, nullptr, 0);
  }
}

void FastMutex::WakeOne() {
  syscall(SYS_futex, reinterpret_cast<int*>(&state_), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
}

}  // namespace gradserve
