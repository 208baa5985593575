#include "client/library/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace gradserve::client {

absl::StatusOr<std::unique_ptr<SharedMemory>> SharedMemory::Create(const std::string& key,
                                                                   int64_t byte_size, mode_t mode) {
  if (byte_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared memory ", key, ": byte_size must be positive, got ", byte_size));
  }
  const int fd = shm_open(key.c_str(), O_RDWR | O_CREAT | O_EXCL, mode);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot create shared memory ", key, ": ", std::strerror(errno)));
  }
  // fchmod: the umask may have taken bits of mode away.
  if (fchmod(fd, mode) != 0 || ftruncate(fd, byte_size) != 0) {
    const int err = errno;
    close(fd);
    shm_unlink(key.c_str());
    return absl::InvalidArgumentError(
        absl::StrCat("cannot size shared memory ", key, ": ", std::strerror(err)));
  }
  void* base =
      mmap(nullptr, static_cast<size_t>(byte_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);  // the mapping keeps the object
  if (base == MAP_FAILED) {
    shm_unlink(key.c_str());
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map shared memory ", key, ": ", std::strerror(err)));
  }
  return std::unique_ptr<SharedMemory>(new SharedMemory(key, static_cast<char*>(base), byte_size));
}

SharedMemory::~SharedMemory() {
  munmap(base_, static_cast<size_t>(byte_size_));
  shm_unlink(key_.c_str());
}

absl::StatusOr<v1::Tensor> SharedMemory::Put(const std::string& region, int64_t offset,
                                             const HostTensor& tensor) {
  const auto size = static_cast<int64_t>(tensor.data.size());
  if (offset < 0 || offset > byte_size_ || size > byte_size_ - offset) {
    return absl::InvalidArgumentError(absl::StrCat("a tensor of ", size, " bytes at offset ",
                                                   offset, " does not fit in shared memory ", key_,
                                                   " of ", byte_size_, " bytes"));
  }
  if (size > 0) std::memcpy(base_ + offset, tensor.data.data(), static_cast<size_t>(size));
  v1::Tensor out;
  out.set_dtype(tensor.dtype);
  out.mutable_shape()->Assign(tensor.shape.begin(), tensor.shape.end());
  out.set_device(tensor.device);
  *out.mutable_shared_memory() = Range(region, offset, size);
  return out;
}

v1::SharedMemoryRange SharedMemory::Range(const std::string& region, int64_t offset,
                                          int64_t byte_size) {
  v1::SharedMemoryRange range;
  range.set_region(region);
  range.set_offset(offset);
  range.set_byte_size(byte_size);
  return range;
}

absl::StatusOr<HostTensor> SharedMemory::Get(const v1::Tensor& described) const {
  if (!described.has_shared_memory()) {
    return absl::InvalidArgumentError("the tensor's contents are not in shared memory");
  }
  const v1::SharedMemoryRange& range = described.shared_memory();
  if (range.offset() < 0 || range.byte_size() < 0 || range.offset() > byte_size_ ||
      range.byte_size() > byte_size_ - range.offset()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "range [", range.offset(), ", +", range.byte_size(), ") of region '", range.region(),
        "' is not within shared memory ", key_, " of ", byte_size_, " bytes"));
  }
  v1::Tensor copy;
  copy.set_dtype(described.dtype());
  *copy.mutable_shape() = described.shape();
  copy.set_device(described.device());
  copy.set_data(base_ + range.offset(), static_cast<size_t>(range.byte_size()));
  return HostTensor::FromProto(copy);
}

}  // namespace gradserve::client
