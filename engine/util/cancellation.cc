#include "engine/util/cancellation.h"

#include <time.h>

#include <cstdint>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "engine/util/status_error.h"

namespace gradserve {

void CancellationToken::Cancel(absl::Status reason) {
  std::map<int64_t, std::function<void()>> to_run;
  {
    MutexLock lock(&mutex_);
    if (cancelled_.load(std::memory_order_relaxed)) return;
    reason_ = std::move(reason);
    cancelled_.store(true, std::memory_order_release);
    to_run.swap(callbacks_);
  }
  for (auto& [id, fn] : to_run) fn();
}

namespace {

// The coarse time below which a deadline has surely not come (Note [A coarse clock far from the
// deadline]).
int64_t CoarseSafeUntil(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return INT64_MAX;
  timespec resolution;
  clock_getres(CLOCK_MONOTONIC_COARSE, &resolution);
  const int64_t margin = 2 * (int64_t{resolution.tv_sec} * 1000000000 + resolution.tv_nsec);
  const int64_t left = absl::ToInt64Nanoseconds(deadline - absl::Now());  // saturates
  if (left <= margin) return INT64_MIN;  // near or past: always the exact check
  const int64_t now = internal::CoarseMonotonicNanos();
  return left - margin > INT64_MAX - now ? INT64_MAX : now + (left - margin);
}

absl::Status DeadlinePassed() {
  return absl::DeadlineExceededError("the call's deadline passed while the work was running");
}

// Cancels tokens at their deadlines (Note [A deadline set by a timer]).
//
// Thread safety: Add and Remove may be called from any thread at once; Run is the timer's own
// thread, which calls a token's Cancel without holding mutex_ (the token's callbacks may make
// or destroy tokens).
class DeadlineTimer {
 public:
  // The process's timer, its thread started on first use; never destroyed.
  static DeadlineTimer& Get() {
    static DeadlineTimer* const timer = new DeadlineTimer;
    return *timer;
  }

  // Cancels token at deadline unless Remove comes first. Returns the id for Remove.
  int64_t Add(absl::Time deadline, CancellationToken* token) {
    MutexLock lock(&mutex_);
    const int64_t id = next_id_++;
    due_.emplace(std::make_pair(deadline, id), token);
    if (deadline < wake_at_) {  // sooner than the timer would look: wake it to sleep less
      wake_at_ = deadline;
      ++generation_;
      changed_.Signal();
    }
    return id;
  }

  // Forgets the entry (deadline, id) of token. If the timer is cancelling token right now on
  // another thread, waits until it is done, so that the token may be destroyed.
  void Remove(absl::Time deadline, int64_t id, const CancellationToken* token) {
    MutexLock lock(&mutex_);
    due_.erase(std::make_pair(deadline, id));
    // On the timer's own thread the token is being destroyed by its own cancel's callbacks,
    // after Cancel last touched it: nothing to wait for.
    if (std::this_thread::get_id() == thread_id_) return;
    fired_.Wait(&mutex_, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return firing_ != token; });
  }

 private:
  DeadlineTimer() {
    std::thread thread([this] { Run(); });
    thread_id_ = thread.get_id();
    thread.detach();
  }

  void Run() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    MutexLock lock(&mutex_);
    for (;;) {
      const absl::Time now = absl::Now();
      while (!due_.empty() && due_.begin()->first.first <= now) {
        CancellationToken* const token = due_.begin()->second;
        due_.erase(due_.begin());
        firing_ = token;
        mutex_.Unlock();
        token->Cancel(DeadlinePassed());
        mutex_.Lock();
        firing_ = nullptr;
        fired_.SignalAll();
      }
      wake_at_ = due_.empty() ? absl::InfiniteFuture() : due_.begin()->first.first;
      const int64_t seen = generation_;
      const auto changed = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return generation_ != seen; };
      if (wake_at_ == absl::InfiniteFuture()) {
        changed_.Wait(&mutex_, changed);
      } else {
        changed_.WaitWithDeadline(&mutex_, wake_at_, changed);
      }
    }
  }

  Mutex mutex_;
  CondVar changed_;  // Add brought a deadline sooner than wake_at_
  CondVar fired_;    // firing_ went back to null
  // Tokens by (deadline, id): ids keep equal deadlines apart.
  std::map<std::pair<absl::Time, int64_t>, CancellationToken*> due_ ABSL_GUARDED_BY(mutex_);
  int64_t next_id_ ABSL_GUARDED_BY(mutex_) = 0;
  // When the timer thread looks next; InfiniteFuture while it holds no deadline.
  absl::Time wake_at_ ABSL_GUARDED_BY(mutex_) = absl::InfiniteFuture();
  int64_t generation_ ABSL_GUARDED_BY(mutex_) = 0;  // counts the wake-ups Add asked for
  // The token whose Cancel the timer thread is running, outside mutex_; null if none.
  const CancellationToken* firing_ ABSL_GUARDED_BY(mutex_) = nullptr;
  std::thread::id thread_id_;  // set before the thread can call back into Remove
};

}  // namespace

CancellationToken::CancellationToken(absl::Time deadline)
    : deadline_(deadline), coarse_safe_until_(CoarseSafeUntil(deadline)) {
  if (deadline == absl::InfiniteFuture()) return;
  if (absl::Now() >= deadline) {
    MutexLock lock(&mutex_);
    reason_ = DeadlinePassed();
    cancelled_.store(true, std::memory_order_release);
    return;
  }
  timer_id_ = DeadlineTimer::Get().Add(deadline, this);
}

CancellationToken::~CancellationToken() {
  if (timer_id_ >= 0) DeadlineTimer::Get().Remove(deadline_, timer_id_, this);
}

absl::Status CancellationToken::CheckSlow() const {
  if (cancelled_.load(std::memory_order_acquire)) {
    MutexLock lock(&mutex_);
    return reason_;
  }
  if (deadline_ != absl::InfiniteFuture() && absl::Now() >= deadline_) return DeadlinePassed();
  return absl::OkStatus();
}

int64_t CancellationToken::AddCallback(std::function<void()> fn) {
  {
    MutexLock lock(&mutex_);
    if (!cancelled_.load(std::memory_order_relaxed)) {
      callbacks_.emplace(next_id_, std::move(fn));
      return next_id_++;
    }
  }
  fn();
  return -1;
}

void CancellationToken::RemoveCallback(int64_t id) {
  MutexLock lock(&mutex_);
  callbacks_.erase(id);
}

void ThrowIfCancelled() {
  const CancellationToken* token = CurrentCancellationToken();
  if (token == nullptr) return;
  if (absl::Status status = token->Check(); !status.ok()) ThrowStatus(std::move(status));
}

}  // namespace gradserve
