// The pool of chunk buffers a streamed call's chunks are read into and written from (Note [Chunk
// buffer pool]). Used by the server; depends on Abseil only.

#ifndef GRADSERVE_PROTO_CHUNKING_H_
#define GRADSERVE_PROTO_CHUNKING_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace gradserve::chunking {

// Note [Chunk buffer pool]
// Even with malloc tuned (Note [Malloc tuning] in program/host_malloc.h), glibc unmaps a
// thread arena's whole 64 MiB heaps once they are free, so the chunk strings of one big call
// (allocated on one thread, freed on another) were faulted in afresh by the next. The server keeps
// their buffers instead: a freed chunk string goes to a process-wide pool, bounded to kPoolBytes of
// capacity in all, and the next read takes a buffer from it; a received chunk much smaller than
// its buffer is copied out, so no small chunk pins a big buffer.
//
// Thread safety: all methods may be called from any thread at once.
class BufferPool {
 public:
  // Buffers kept: capacity in [kMinBytes, kMaxBytes], kPoolBytes of them at most.
  static constexpr size_t kMinBytes = size_t{64} << 10;
  static constexpr size_t kMaxBytes = size_t{64} << 20;
  static constexpr size_t kPoolBytes = size_t{128} << 20;

  // The process's pool.
  static BufferPool& Default();

  // An empty string, with a pooled buffer if there is one.
  std::string Take();
  // Keeps s's buffer if it fits the bounds, else frees it.
  void Give(std::string s);
  // Lowers (or raises) the pool's bound from kPoolBytes, for a server in a small container;
  // buffers beyond it are freed as they come back.
  void set_max_bytes(size_t bytes) {
    absl::MutexLock lock(&mutex_);
    max_bytes_ = bytes;
  }

 private:
  absl::Mutex mutex_;
  std::vector<std::string> free_ ABSL_GUARDED_BY(mutex_);
  size_t bytes_ ABSL_GUARDED_BY(mutex_) = 0;  // capacity in free_
  size_t max_bytes_ ABSL_GUARDED_BY(mutex_) = kPoolBytes;
};

}  // namespace gradserve::chunking

#endif  // GRADSERVE_PROTO_CHUNKING_H_
