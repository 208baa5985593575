// protobuf's varint where gradserve works on a message's bytes rather than on parsed messages:
// the server's chunked stream (server/wire/chunked_request.cc) and unary request split (Note
// [Ops parsed once], server/wire/unary_messages.cc), and the Chunk frames both ends write and
// read as gRPC slices (Note [Zero-copy streaming], proto/chunk_slices.h). Written with protobuf's
// encoder; read by hand, since those bytes span chunks or slices, which protobuf's readers do
// not take.
//
// Thread safety: stateless functions.

#ifndef GRADSERVE_PROTO_WIRE_FORMAT_H_
#define GRADSERVE_PROTO_WIRE_FORMAT_H_

#include <cstddef>
#include <cstdint>

#include "google/protobuf/io/coded_stream.h"

namespace gradserve {

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

}  // namespace gradserve

#endif  // GRADSERVE_PROTO_WIRE_FORMAT_H_
