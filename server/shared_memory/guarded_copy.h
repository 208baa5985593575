// Copies to and from memory that may vanish under the copy: a shared-memory object mapped from
// another process, which that process can shrink at any time.
//
// Note [A region shrunk under the server]
// The server maps a client's POSIX shared-memory object at registration and keeps the mapping.
// The client still owns the object and may ftruncate it smaller whenever it likes; the pages
// past the new end are then gone, and touching them raises SIGBUS, which would kill the server
// and every other client's call with it. Two defences, in this order:
//   1. before each copy, SharedMemoryRegion checks the object's current size (fstat) against
//      the range, and an object already shrunk fails the request with INVALID_ARGUMENT naming
//      the region and both sizes;
//   2. the copy itself runs under GuardedCopy, for an object shrunk between that check and the
//      copy: a SIGBUS handler, installed once, sees that the faulting thread is inside a
//      guarded copy and jumps back out of it (siglongjmp), and the copy returns an error
//      instead. A SIGBUS anywhere else goes on to the handler that was there before (the
//      sanitizers', or the default action: the process dies, as it would have).
// The engine never reads a region's memory directly: tensors' values are copied out of it
// into the request's own (budgeted) memory, and gradients are copied into it, each through
// GuardedCopy, so no op can fault on a region. The JVM does the same for MappedByteBuffer.
//
// Note [Copies split over threads]
// A region's copies are most of a big call's time: a 64 MiB leaf out and its 64 MiB gradient in
// take 28 ms of 63 on the 2-CPU VM, one thread copying at 4.8 GB/s, below what the memory
// moves. So a copy of kSplitBytes or more is cut into one piece per CPU (at most
// kMaxCopyThreads, each at least kSplitBytes / 2), each piece guarded on its own thread and
// the last on the caller's. A new thread per piece costs tens of microseconds, nothing beside
// a copy of megabytes; on a busy server the pieces share the CPUs with the other calls. When
// no thread can be started (the process at its limit), the caller copies the pieces left.
//
// Thread safety: GuardedCopy may run on any number of threads at once; each guards its own copy.

#ifndef GRADSERVE_SERVER_SHARED_MEMORY_GUARDED_COPY_H_
#define GRADSERVE_SERVER_SHARED_MEMORY_GUARDED_COPY_H_

#include <cstddef>

#include "absl/status/status.h"

namespace gradserve::server {

// Copies n bytes from src to dst, either of which may be a mapping that shrinks meanwhile
// (Note [A region shrunk under the server]). Returns OK, or DATA_LOSS when a page of either
// was gone: dst then holds an unspecified part of the bytes. The ranges must not overlap.
absl::Status GuardedCopy(void* dst, const void* src, size_t n);

// GuardedCopy, with a big copy split over threads (Note [Copies split over threads]).
absl::Status SplitGuardedCopy(void* dst, const void* src, size_t n);

// Writes the element_size bytes at element over the n bytes at dst, repeated, split over
// threads as SplitGuardedCopy is: the bytes of a tensor that holds one value (a sum's gradient,
// expanded) written out without a packed copy of it first. element_size must divide 4096 (1, 2,
// 4 or 8) and n; INTERNAL otherwise. DATA_LOSS as GuardedCopy.
absl::Status SplitGuardedFill(void* dst, const void* element, size_t element_size, size_t n);

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_SHARED_MEMORY_GUARDED_COPY_H_
