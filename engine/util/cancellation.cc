#include "engine/util/cancellation.h"

#include <time.h>

#include <cstdint>
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

}  // namespace

CancellationToken::CancellationToken(absl::Time deadline)
    : deadline_(deadline), coarse_safe_until_(CoarseSafeUntil(deadline)) {}

absl::Status CancellationToken::CheckSlow() const {
  if (cancelled_.load(std::memory_order_acquire)) {
    MutexLock lock(&mutex_);
    return reason_;
  }
  if (deadline_ != absl::InfiniteFuture() && absl::Now() >= deadline_) {
    return absl::DeadlineExceededError("the call's deadline passed while the work was running");
  }
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
