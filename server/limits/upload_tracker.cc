#include "server/limits/upload_tracker.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace gradserve::server {

UploadTracker::UploadTracker(int64_t max_uploads, absl::Duration idle_timeout)
    : max_uploads_(max_uploads), idle_timeout_(idle_timeout), reaper_([this] { Reap(); }) {}

UploadTracker::~UploadTracker() {
  {
    MutexLock lock(&mutex_);
    stopping_ = true;
    wake_.SignalAll();
  }
  reaper_.join();
}

absl::Status UploadTracker::Begin(Upload* upload) {
  Progress(upload);
  MutexLock lock(&mutex_);
  if (static_cast<int64_t>(uploads_.size()) >= max_uploads_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the server is receiving ", uploads_.size(), " streamed requests, the limit is ",
        max_uploads_, " (--max_uploads); retry later"));
  }
  uploads_.insert(upload);
  return absl::OkStatus();
}

void UploadTracker::Progress(Upload* upload) {
  upload->last_progress_ns_.store(absl::GetCurrentTimeNanos(), std::memory_order_relaxed);
}

void UploadTracker::End(Upload* upload) {
  MutexLock lock(&mutex_);
  uploads_.erase(upload);
}

int64_t UploadTracker::open() const {
  MutexLock lock(&mutex_);
  return static_cast<int64_t>(uploads_.size());
}

void UploadTracker::Reap() {
  const absl::Duration period =
      std::clamp(idle_timeout_ / 4, absl::Milliseconds(10), absl::Seconds(1));
  const int64_t timeout_ns = absl::ToInt64Nanoseconds(idle_timeout_);
  MutexLock lock(&mutex_);
  // The predicate runs with mutex_ held (CondVar::WaitWithDeadline).
  while (!wake_.WaitWithDeadline(&mutex_, absl::Now() + period,
                                 [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stopping_; })) {
    const int64_t now = absl::GetCurrentTimeNanos();
    std::vector<Upload*> ended;
    for (Upload* upload : uploads_) {
      if (now - upload->last_progress_ns_.load(std::memory_order_relaxed) < timeout_ns) continue;
      if (upload->ExpireIfWaiting()) ended.push_back(upload);
    }
    for (Upload* upload : ended) uploads_.erase(upload);
    expired_.fetch_add(static_cast<int64_t>(ended.size()), std::memory_order_relaxed);
  }
}

}  // namespace gradserve::server
