// The Chunks of ComputeGradientsStream as the bytes gRPC carries: read with protobuf, written by
// hand so that a chunk's data reaches gRPC without a copy.
//
// Note [Chunks sent without a copy]
// The stream is a raw method (gRPC hands the server ByteBuffers, as for unary calls, Note [Unary
// messages reused]). A response chunk's data is a string the serializer already filled
// (ChunkedResponse, Note [Tensor bytes left in the chunks]); writing it as a v1::Chunk had
// protobuf copy those bytes once more into gRPC's slices, 64 MiB for a 64 MiB gradient (about
// 7 ms, 8% of the server's time on such a call). SerializeChunk instead writes the Chunk's few
// bytes of framing itself (field 1's tag and length, and field 2 on the first chunk) into a
// small slice and hands gRPC the string's own buffer as a second slice, which owns the string
// and gives its buffer back to the chunk pool (Note [Chunk buffer pool]) when gRPC is done with
// it. The bytes are those protobuf writes for the same Chunk: fields in number order, and a
// field at its default (empty data, total_bytes 0) left out. Received chunks are parsed by
// protobuf as before, from the ByteBuffer; bytes that are no Chunk are the caller's
// INVALID_ARGUMENT.
//
// Thread safety: stateless functions. A slice's release may run on any gRPC thread.

#ifndef GRADSERVE_SERVER_WIRE_CHUNK_MESSAGE_H_
#define GRADSERVE_SERVER_WIRE_CHUNK_MESSAGE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "gradserve/v1/gradserve.pb.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"

namespace gradserve::server {

// The serialized v1::Chunk with data and total_bytes, data's bytes not copied (see the Note).
grpc::ByteBuffer SerializeChunk(std::string data, int64_t total_bytes);
// As above, with data given as the slices it is made of, which gRPC takes as they are (Note
// [Unary tensor bytes taken]: slices over an engine tensor's memory).
grpc::ByteBuffer SerializeChunk(std::vector<grpc::Slice> data, int64_t total_bytes);

// Parses *bytes (cleared) into *chunk, reusing chunk's data buffer; false if they are no Chunk.
bool ParseChunk(grpc::ByteBuffer* bytes, v1::Chunk* chunk);

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_WIRE_CHUNK_MESSAGE_H_
