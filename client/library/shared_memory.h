// Shared memory with a gradserve server on the same host (docs/shared_memory.md): big tensors
// and their gradients pass through a POSIX shared-memory object instead of the connection.
//
//   auto shm = gradserve::client::SharedMemory::Create("/gradserve_me_1", 2 * bytes);
//   client->RegisterSharedMemory("buf", **shm, /*writable=*/true);
//   v1::Tensor x = *(*shm)->Put("buf", 0, HostTensor::Float32(values, {n}));
//   // a leaf whose value is x: its bytes stay in the object
//   call.mutable_gradient_destinations()->insert({"x", (*shm)->Range("buf", bytes, bytes)});
//   // after the call: (*shm)->Get(gradient tensor) reads the gradient the server wrote
//
// The server must have shared memory on (--shared_memory_prefix, whose prefix the key must
// start with). A region lives on the one server that registered it: send the calls that name
// it to that server (a target of one address).
//
// Thread safety: a SharedMemory may be read and written from any thread; ranges that two
// threads (or this process and the server) write at once are the caller's race.

#ifndef GRADSERVE_CLIENT_LIBRARY_SHARED_MEMORY_H_
#define GRADSERVE_CLIENT_LIBRARY_SHARED_MEMORY_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "client/library/gradserve_client.h"

namespace gradserve::client {

class SharedMemory {
 public:
  // Creates the POSIX shared-memory object key ("/" and a name without "/"; it must not exist),
  // with permissions mode (the server's user must be able to read and write it), sized
  // byte_size bytes, and maps it. INVALID_ARGUMENT or the errno's meaning when that fails.
  static absl::StatusOr<std::unique_ptr<SharedMemory>> Create(const std::string& key,
                                                              int64_t byte_size,
                                                              mode_t mode = 0600);
  // Unmaps and unlinks the object. The server keeps its own mapping until the region is
  // unregistered or ends idle.
  ~SharedMemory();

  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;

  const std::string& key() const { return key_; }
  int64_t byte_size() const { return byte_size_; }
  char* data() { return base_; }
  const char* data() const { return base_; }

  // Copies tensor's bytes to offset and returns a wire tensor naming them as a range of the
  // region registered as `region` (dtype, shape, device and the range). INVALID_ARGUMENT if
  // they do not fit.
  absl::StatusOr<v1::Tensor> Put(const std::string& region, int64_t offset,
                                 const HostTensor& tensor);
  // A range of the region registered as `region`, for a gradient's destination.
  static v1::SharedMemoryRange Range(const std::string& region, int64_t offset, int64_t byte_size);
  // The tensor a response describes in this object (a gradient written to its destination):
  // its dtype and shape, its bytes read from the range. INVALID_ARGUMENT if the tensor's
  // contents are not a range, or the range is not within this object.
  absl::StatusOr<HostTensor> Get(const v1::Tensor& described) const;

 private:
  SharedMemory(std::string key, char* base, int64_t byte_size)
      : key_(std::move(key)), base_(base), byte_size_(byte_size) {}

  const std::string key_;
  char* const base_;
  const int64_t byte_size_;
};

}  // namespace gradserve::client

#endif  // GRADSERVE_CLIENT_LIBRARY_SHARED_MEMORY_H_
