// Filling a buffer with one element's bytes over and over.

#ifndef GRADSERVE_ENGINE_UTIL_REPEAT_BYTES_H_
#define GRADSERVE_ENGINE_UTIL_REPEAT_BYTES_H_

#include <algorithm>
#include <cstddef>
#include <cstring>

namespace gradserve {

// Writes the element_size bytes at element over the n bytes at dst, repeated (a last, partial
// copy if element_size does not divide n). The bytes written so far are copied after
// themselves, doubling, so a block of kilobytes takes a dozen memcpy calls, not one per
// element. dst must not overlap element. Thread safety: none needed; it touches only dst.
inline void RepeatBytes(void* dst, size_t n, const void* element, size_t element_size) {
  if (n == 0 || element_size == 0) return;
  char* const out = static_cast<char*>(dst);
  std::memcpy(out, element, std::min(element_size, n));
  for (size_t filled = element_size; filled < n;) {
    const size_t step = std::min(filled, n - filled);
    std::memcpy(out + filled, out, step);
    filled += step;
  }
}

}  // namespace gradserve

#endif  // GRADSERVE_ENGINE_UTIL_REPEAT_BYTES_H_
