#include "server/shared_memory/region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/util/quote.h"
#include "server/shared_memory/guarded_copy.h"

namespace gradserve::server {
namespace {

constexpr size_t kMaxKeyBytes = 255;  // NAME_MAX, with the leading '/'

std::string ErrnoText(int err) { return std::strerror(err); }

}  // namespace

absl::Status CheckSharedMemoryKey(absl::string_view key, absl::string_view prefix) {
  if (prefix.empty()) {
    return absl::FailedPreconditionError(
        "shared memory is off on this server (--shared_memory_prefix is empty)");
  }
  if (key.size() < 2 || key.front() != '/' || key.size() > kMaxKeyBytes ||
      key.find('/', 1) != absl::string_view::npos || key.find('\0') != absl::string_view::npos ||
      key == "/." || key == "/..") {
    return absl::InvalidArgumentError(absl::StrCat(
        "shared-memory key ", Quote(key),
        " is not a POSIX shared-memory name: '/' then 1 to 254 bytes without '/' (shm_open(3))"));
  }
  if (!absl::StartsWith(key, prefix)) {
    return absl::InvalidArgumentError(absl::StrCat("shared-memory key ", Quote(key),
                                                   " does not start with this server's prefix ",
                                                   Quote(prefix), " (--shared_memory_prefix)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SharedMemoryRegion>> SharedMemoryRegion::Open(
    absl::string_view name, absl::string_view key, absl::string_view prefix, int64_t byte_size,
    bool writable) {
  if (absl::Status s = CheckSharedMemoryKey(key, prefix); !s.ok()) return s;
  if (byte_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("shared-memory region ", Quote(name),
                                                   ": byte_size is ", byte_size,
                                                   "; it must be positive"));
  }
  const std::string key_string(key);
  const int fd = shm_open(key_string.c_str(), writable ? O_RDWR : O_RDONLY, 0);
  if (fd < 0) {
    const int err = errno;
    return absl::InvalidArgumentError(absl::StrCat(
        "shared-memory region ", Quote(name), ": cannot open the object ", Quote(key), " ",
        writable ? "for reading and writing" : "for reading", ": ", ErrnoText(err),
        err == ENOENT ? " (the client creates it with shm_open(O_CREAT) before registering)" : ""));
  }
  struct stat st = {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("shared-memory region ", Quote(name),
                                                   ": the object ", Quote(key),
                                                   " is not a regular shared-memory file"));
  }
  if (st.st_size < byte_size) {
    close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("shared-memory region ", Quote(name), ": the object ", Quote(key), " has ",
                     st.st_size, " bytes, fewer than the ", byte_size, " to map (byte_size)"));
  }
  void* base = mmap(nullptr, static_cast<size_t>(byte_size),
                    writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    const int err = errno;
    close(fd);
    return absl::ResourceExhaustedError(absl::StrCat("shared-memory region ", Quote(name),
                                                     ": cannot map ", byte_size, " bytes of ",
                                                     Quote(key), ": ", ErrnoText(err)));
  }
  return std::unique_ptr<SharedMemoryRegion>(new SharedMemoryRegion(
      std::string(name), key_string, fd, static_cast<char*>(base), byte_size, writable));
}

SharedMemoryRegion::SharedMemoryRegion(std::string name, std::string key, int fd, char* base,
                                       int64_t byte_size, bool writable)
    : name_(std::move(name)),
      key_(std::move(key)),
      fd_(fd),
      base_(base),
      byte_size_(byte_size),
      writable_(writable) {}

SharedMemoryRegion::~SharedMemoryRegion() {
  munmap(base_, static_cast<size_t>(byte_size_));
  close(fd_);
}

absl::Status SharedMemoryRegion::CheckRange(int64_t offset, int64_t size,
                                            absl::string_view what) const {
  if (offset < 0 || size < 0 || offset > byte_size_ || size > byte_size_ - offset) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": range [", offset, ", ", offset, " + ",
                                                   size, ") is not within shared-memory region ",
                                                   Quote(name_), " of ", byte_size_, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status SharedMemoryRegion::CheckNotShrunk(int64_t offset, int64_t size,
                                                absl::string_view what) const {
  struct stat st = {};
  if (fstat(fd_, &st) != 0) {
    return absl::InternalError(
        absl::StrCat("fstat of shared-memory object ", Quote(key_), " failed: ", ErrnoText(errno)));
  }
  if (st.st_size < offset + size) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": shared-memory region ", Quote(name_), " was registered with ",
                     byte_size_, " bytes but its object ", Quote(key_), " now has ", st.st_size,
                     ", too few for the range ending at byte ", offset + size,
                     "; the client shrank it: register it again"));
  }
  return absl::OkStatus();
}

absl::Status SharedMemoryRegion::Read(int64_t offset, int64_t size, void* dst,
                                      absl::string_view what) const {
  if (absl::Status s = CheckNotShrunk(offset, size, what); !s.ok()) return s;
  if (absl::Status s = SplitGuardedCopy(dst, base_ + offset, static_cast<size_t>(size)); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": reading shared-memory region ", Quote(name_), ": ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status SharedMemoryRegion::Write(int64_t offset, const void* src, int64_t size,
                                       absl::string_view what) const {
  return WriteWith(offset, size, what, [&](char* dst) {
    return SplitGuardedCopy(dst, src, static_cast<size_t>(size));
  });
}

absl::Status SharedMemoryRegion::Fill(int64_t offset, const void* element, size_t element_size,
                                      int64_t size, absl::string_view what) const {
  return WriteWith(offset, size, what, [&](char* dst) {
    return SplitGuardedFill(dst, element, element_size, static_cast<size_t>(size));
  });
}

absl::Status SharedMemoryRegion::WriteWith(int64_t offset, int64_t size, absl::string_view what,
                                           absl::FunctionRef<absl::Status(char* dst)> write) const {
  if (!writable_) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": shared-memory region ", Quote(name_), " was registered read-only"));
  }
  if (absl::Status s = CheckNotShrunk(offset, size, what); !s.ok()) return s;
  if (absl::Status s = write(base_ + offset); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": writing shared-memory region ", Quote(name_), ": ", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace gradserve::server
