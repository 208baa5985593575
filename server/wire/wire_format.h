// protobuf's varint where the server works on a request's bytes rather than on parsed
// messages: the chunked stream (server/wire/chunked_request.cc), the unary request's split
// (Note [Ops parsed once], server/wire/unary_messages.cc) and the framing of the chunks it
// writes (Note [Chunks sent without a copy], server/wire/chunk_message.cc). Written with
// protobuf's encoder; read by hand, since the chunked reader's bytes span chunks, which
// protobuf's readers do not take.
//
// Thread safety: stateless functions.

#ifndef GRADSERVE_SERVER_WIRE_WIRE_FORMAT_H_
#define GRADSERVE_SERVER_WIRE_WIRE_FORMAT_H_

#include <cstddef>
#include <cstdint>

#include "google/protobuf/io/coded_stream.h"

namespace gradserve::server {

// Writes v as a varint (or a tag) with append(const char*, size_t), encoded by protobuf.
template <typename Append>
void PutVarint(uint64_t v, Append&& append) {
  uint8_t buf[10];
  const uint8_t* end = google::protobuf::io::CodedOutputStream::WriteVarint64ToArray(v, buf);
  append(reinterpret_cast<const char*>(buf), static_cast<size_t>(end - buf));
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

#endif  // GRADSERVE_SERVER_WIRE_WIRE_FORMAT_H_
