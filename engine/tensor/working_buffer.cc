#include "engine/tensor/working_buffer.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/util/status_error.h"

namespace gradserve::internal {

int64_t WorkingBufferBytes(int64_t n, size_t elem_size) {
  int64_t bytes = 0;
  if (n < 0 || __builtin_mul_overflow(n, static_cast<int64_t>(elem_size), &bytes)) {
    ThrowStatus(absl::ResourceExhaustedError(absl::StrCat(
        "a working buffer of ", n, " elements of ", elem_size, " bytes does not fit in memory")));
  }
  return bytes;
}

void ThrowOutOfHostMemory(int64_t bytes) {
  ThrowStatus(absl::ResourceExhaustedError(
      absl::StrCat("out of host memory allocating a working buffer of ", bytes, " bytes")));
}

}  // namespace gradserve::internal
