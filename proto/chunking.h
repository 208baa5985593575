// Cutting a serialized message into the Chunks of a streamed call, and putting it back together,
// without an intermediate copy of the whole message (Note [Zero-copy streaming]). Used by the
// server and by the C++ client; depends on protobuf and Abseil only.
//
// Note [Zero-copy streaming]
// ComputeGradientsStream carries a serialized GradRequest (or GradResponse) cut into Chunks. The
// naive way serializes into one string, copies pieces of it into each Chunk, and on the other
// side appends each Chunk to one string and parses that: two extra copies of the whole message
// (64 MiB for a big tensor) and two fresh big allocations, each faulted in page by page.
// Instead, a message is serialized straight into the chunks' buffers (ChunkOutputStream: the
// serializer writes into strings of the chunk size, which become the Chunks' data), and
// received chunks are kept as the list they arrived as (their data moved, never appended) and
// parsed from that list through a ZeroCopyInputStream. The server goes one step further for
// requests: it leaves big tensor bytes in the received chunks altogether (server/
// chunked_request.h, Note [Tensor bytes left in the chunks]).

#ifndef GRADSERVE_PROTO_CHUNKING_H_
#define GRADSERVE_PROTO_CHUNKING_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/io/zero_copy_stream.h"
#include "google/protobuf/message_lite.h"

namespace gradserve::chunking {

// A ZeroCopyOutputStream whose buffers are strings of at most chunk_bytes, appended to *chunks
// (not owned). Each string is sized to what was written once the stream is destroyed or
// BackUp is called.
//
// Thread safety: one thread at a time.
class ChunkOutputStream final : public google::protobuf::io::ZeroCopyOutputStream {
 public:
  // expected_bytes (the message's size, if known) sizes the last chunk to fit, so that no
  // buffer is larger than it has to be; 0 when unknown.
  ChunkOutputStream(std::vector<std::string>* chunks, int64_t chunk_bytes,
                    int64_t expected_bytes = 0);

  bool Next(void** data, int* size) override;
  void BackUp(int count) override;
  int64_t ByteCount() const override { return written_; }

 private:
  std::vector<std::string>* const chunks_;
  const int64_t chunk_bytes_;
  int64_t remaining_;  // of expected_bytes; what the next buffer is sized to, if positive
  int64_t written_ = 0;
};

// A ZeroCopyInputStream over strings read in order, without joining them.
//
// Thread safety: one thread at a time; the strings must outlive the stream, unchanged.
class ChunkListInputStream final : public google::protobuf::io::ZeroCopyInputStream {
 public:
  explicit ChunkListInputStream(const std::vector<std::string>* chunks) : chunks_(chunks) {}

  bool Next(const void** data, int* size) override;
  void BackUp(int count) override;
  bool Skip(int count) override;
  int64_t ByteCount() const override { return position_; }

 private:
  const std::vector<std::string>* const chunks_;
  size_t index_ = 0;   // the chunk the next Next returns from
  size_t offset_ = 0;  // within chunks_[index_]
  int64_t position_ = 0;
};

// Serializes message into *chunks (cleared first), each at most chunk_bytes (> 0); always at
// least one chunk, empty for an empty message. False if the message cannot be serialized
// (larger than 2 GiB, or missing required fields).
bool SerializeToChunks(const google::protobuf::MessageLite& message, int64_t chunk_bytes,
                       std::vector<std::string>* chunks);

// Parses the concatenation of chunks into *message. False if it does not parse.
bool ParseFromChunks(const std::vector<std::string>& chunks,
                     google::protobuf::MessageLite* message);

// Note [Chunk buffer pool]
// Even with malloc tuned (Note [Malloc tuning] in program/host_malloc.h), glibc unmaps a
// thread arena's whole 64 MiB heaps once they are free, so the chunk strings of one big call
// (allocated on one thread, freed on another) were faulted in afresh by the next. The server keeps
// their buffers instead: a freed chunk string goes to a process-wide pool, bounded to kPoolBytes of
// capacity in all, and the next read or serialized chunk takes a buffer from it; a received chunk
// much smaller than its buffer is copied out, so no small chunk pins a big buffer.
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
