#include "engine/util/cancellation.h"

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

absl::Status CancellationToken::Check() const {
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
