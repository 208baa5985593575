// One POSIX shared-memory object of a client's, opened and mapped by the server.
//
// Note [Shared-memory keys]
// A client names its object by the key shm_open(3) takes: "/" then a name without "/", at most
// 255 bytes (NAME_MAX), so the server only ever opens files of the shared-memory file system
// (/dev/shm), never a path. The key must also start with the server's --shared_memory_prefix
// ("/gradserve" by default), which keeps the objects of other programs on the host (a
// database's, a browser's) out of reach of any client. The server opens an existing object
// only (no O_CREAT; glibc adds O_NOFOLLOW and O_CLOEXEC), read-only unless the client asked
// for a writable region, requires a regular file at least byte_size long, maps byte_size bytes
// of it with the same protection, and never changes its size. The client creates the object,
// sizes it and unlinks it; the server's mapping keeps the memory alive until it is unmapped.
//
// Thread safety: a SharedMemoryRegion is immutable after Open; its copies may run on any number
// of threads at once (a range read by two requests, or written by two, is the client's race).

#ifndef GRADSERVE_SERVER_SHARED_MEMORY_REGION_H_
#define GRADSERVE_SERVER_SHARED_MEMORY_REGION_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradserve::server {

class SharedMemoryRegion {
 public:
  // Opens and maps byte_size bytes of the object key (Note [Shared-memory keys]). name is the
  // client's name for it, for messages. INVALID_ARGUMENT for a malformed key, a key outside
  // prefix, a non-positive byte_size, or an object that is missing, not a regular file,
  // smaller than byte_size or not openable (the message says which, naming the key);
  // RESOURCE_EXHAUSTED when the mapping fails for want of memory or address space.
  static absl::StatusOr<std::unique_ptr<SharedMemoryRegion>> Open(absl::string_view name,
                                                                  absl::string_view key,
                                                                  absl::string_view prefix,
                                                                  int64_t byte_size, bool writable);
  // Unmaps and closes.
  ~SharedMemoryRegion();

  SharedMemoryRegion(const SharedMemoryRegion&) = delete;
  SharedMemoryRegion& operator=(const SharedMemoryRegion&) = delete;

  const std::string& name() const { return name_; }
  const std::string& key() const { return key_; }
  int64_t byte_size() const { return byte_size_; }
  bool writable() const { return writable_; }

  // Whether [offset, offset + size) lies within the mapped bytes; INVALID_ARGUMENT naming the
  // region, the range and the region's size if not. `what` starts the message ("leaf 'x'").
  absl::Status CheckRange(int64_t offset, int64_t size, absl::string_view what) const;

  // Copies size bytes at offset into dst, or dst's size bytes from src to offset. The range
  // must pass CheckRange; Write needs a writable region (FAILED_PRECONDITION otherwise, a bug
  // of the caller's checks). INVALID_ARGUMENT, naming the region and both sizes, when the
  // client shrank the object under the range (Note [A region shrunk under the server]).
  absl::Status Read(int64_t offset, int64_t size, void* dst, absl::string_view what) const;
  absl::Status Write(int64_t offset, const void* src, int64_t size, absl::string_view what) const;
  // Write, of the element_size bytes at element repeated over the range (SplitGuardedFill):
  // INTERNAL unless element_size divides both 4096 and size.
  absl::Status Fill(int64_t offset, const void* element, size_t element_size, int64_t size,
                    absl::string_view what) const;

 private:
  SharedMemoryRegion(std::string name, std::string key, int fd, char* base, int64_t byte_size,
                     bool writable);

  // Write's and Fill's checks around write(the range's first byte).
  absl::Status WriteWith(int64_t offset, int64_t size, absl::string_view what,
                         absl::FunctionRef<absl::Status(char* dst)> write) const;

  // INVALID_ARGUMENT when the object is now smaller than offset + size.
  absl::Status CheckNotShrunk(int64_t offset, int64_t size, absl::string_view what) const;

  const std::string name_;
  const std::string key_;
  const int fd_;      // open while mapped, for fstat
  char* const base_;  // the mapping's first byte
  const int64_t byte_size_;
  const bool writable_;
};

// INVALID_ARGUMENT if key is not a shared-memory key within prefix (Note [Shared-memory keys]).
absl::Status CheckSharedMemoryKey(absl::string_view key, absl::string_view prefix);

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_SHARED_MEMORY_REGION_H_
