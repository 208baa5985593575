// protobuf's varint, read and written by hand where the server works on a request's bytes
// rather than on parsed messages: the chunked stream (server/chunked_request.cc) and the
// unary request's split (Note [Ops parsed once], server/unary_messages.cc).
//
// Thread safety: stateless functions.

#ifndef GRADSERVE_SERVER_WIRE_FORMAT_H_
#define GRADSERVE_SERVER_WIRE_FORMAT_H_

#include <cstddef>
#include <cstdint>

namespace gradserve::server {

// Writes v as a varint (or a tag) with append(const char*, size_t).
template <typename Append>
void PutVarint(uint64_t v, Append&& append) {
  char buf[10];
  size_t n = 0;
  while (v >= 0x80) {
    buf[n++] = static_cast<char>(v | 0x80);
    v >>= 7;
  }
  buf[n++] = static_cast<char>(v);
  append(buf, n);
}

// Reads a varint of at most ten bytes, taking each from next_byte() (an unsigned char) while
// more() says there is one; false if it is cut off or longer than ten bytes.
template <typename More, typename NextByte>
bool GetVarint(More&& more, NextByte&& next_byte, uint64_t* v) {
  uint64_t value = 0;
  for (int shift = 0; shift < 64 && more(); shift += 7) {
    const unsigned char byte = next_byte();
    value |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) {
      *v = value;
      return true;
    }
  }
  *v = value;
  return false;
}

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_WIRE_FORMAT_H_
