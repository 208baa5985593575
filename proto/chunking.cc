#include "proto/chunking.h"

#include <string>
#include <utility>

namespace gradserve::chunking {

BufferPool& BufferPool::Default() {
  static BufferPool* const pool = new BufferPool;
  return *pool;
}

std::string BufferPool::Take() {
  absl::MutexLock lock(&mutex_);
  if (free_.empty()) return std::string();
  std::string s = std::move(free_.back());
  free_.pop_back();
  bytes_ -= s.capacity();
  return s;
}

void BufferPool::Give(std::string s) {
  const size_t capacity = s.capacity();
  if (capacity < kMinBytes || capacity > kMaxBytes) return;
  s.clear();
  absl::MutexLock lock(&mutex_);
  if (bytes_ + capacity > max_bytes_) return;
  bytes_ += capacity;
  free_.push_back(std::move(s));
}

}  // namespace gradserve::chunking
