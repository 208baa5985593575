#include "proto/chunking.h"

#include <algorithm>
#include <limits>

#include "google/protobuf/io/coded_stream.h"

namespace gradserve::chunking {

ChunkOutputStream::ChunkOutputStream(std::vector<std::string>* chunks, int64_t chunk_bytes,
                                     int64_t expected_bytes)
    : chunks_(chunks),
      chunk_bytes_(std::clamp<int64_t>(chunk_bytes, 1, std::numeric_limits<int>::max())),
      remaining_(expected_bytes) {}

bool ChunkOutputStream::Next(void** data, int* size) {
  // A new buffer per call: the serializer calls Next only when the previous one is full.
  const int64_t n = remaining_ > 0 ? std::min(remaining_, chunk_bytes_) : chunk_bytes_;
  std::string& chunk = chunks_->emplace_back();
  chunk.resize(static_cast<size_t>(n));
  remaining_ -= n;
  written_ += n;
  *data = chunk.data();
  *size = static_cast<int>(n);
  return true;
}

void ChunkOutputStream::BackUp(int count) {
  std::string& chunk = chunks_->back();
  chunk.resize(chunk.size() - static_cast<size_t>(count));
  written_ -= count;
  remaining_ += count;
}

bool ChunkListInputStream::Next(const void** data, int* size) {
  while (index_ < chunks_->size() && offset_ >= (*chunks_)[index_].size()) {
    ++index_;
    offset_ = 0;
  }
  if (index_ >= chunks_->size()) return false;
  const std::string& chunk = (*chunks_)[index_];
  const size_t n = std::min<size_t>(chunk.size() - offset_, std::numeric_limits<int>::max());
  *data = chunk.data() + offset_;
  *size = static_cast<int>(n);
  offset_ += n;
  position_ += static_cast<int64_t>(n);
  return true;
}

void ChunkListInputStream::BackUp(int count) {
  // Only within the buffer the last Next returned, as the interface requires.
  offset_ -= static_cast<size_t>(count);
  position_ -= count;
}

bool ChunkListInputStream::Skip(int count) {
  const void* data;
  int size;
  while (count > 0) {
    if (!Next(&data, &size)) return false;
    if (size > count) {
      BackUp(size - count);
      return true;
    }
    count -= size;
  }
  return true;
}

bool SerializeToChunks(const google::protobuf::MessageLite& message, int64_t chunk_bytes,
                       std::vector<std::string>* chunks) {
  chunks->clear();
  const size_t size = message.ByteSizeLong();
  if (size > static_cast<size_t>(std::numeric_limits<int>::max())) return false;
  {
    ChunkOutputStream stream(chunks, chunk_bytes, static_cast<int64_t>(size));
    google::protobuf::io::CodedOutputStream out(&stream);
    message.SerializeWithCachedSizes(&out);
    if (out.HadError()) return false;
  }  // the CodedOutputStream gives back what it did not use here
  if (chunks->empty()) chunks->emplace_back();
  return true;
}

bool ParseFromChunks(const std::vector<std::string>& chunks,
                     google::protobuf::MessageLite* message) {
  ChunkListInputStream stream(&chunks);
  return message->ParseFromZeroCopyStream(&stream);
}

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
