// The Chunks of ComputeGradientsStream as the bytes gRPC carries: read with protobuf, written by
// hand so that a chunk's data reaches gRPC without a copy.
//
// Note [Chunks sent without a copy]
// The stream is a raw method (gRPC hands the server ByteBuffers, as for unary calls, Note [Unary
// messages reused]). Writing a response chunk as a v1::Chunk had protobuf copy its data once
// more into gRPC's slices, 64 MiB for a 64 MiB gradient (about 7 ms, 8% of the server's time on
// such a call). The response is serialized into slices instead, its big tensors' bytes slices
// over the engine's tensors (ChunkedResponse, Note [Unary tensor bytes taken]); the reactor
// cuts them into chunk_bytes pieces (sub-slices) and frames each with chunking::ChunkFrame,
// which writes the Chunk's few bytes of framing itself (field 1's tag and length, and field 2
// on the first chunk) and hands gRPC the data's slices as they are: no copy (Note [Zero-copy
// streaming] in proto/chunk_slices.h, which the C++ client's requests use too). Received chunks
// are parsed by protobuf, from the ByteBuffer, into a pooled string (Note [Chunk buffer pool]);
// bytes that are no Chunk are the caller's INVALID_ARGUMENT.
//
// Thread safety: stateless functions.

#ifndef GRADSERVE_SERVER_WIRE_CHUNK_MESSAGE_H_
#define GRADSERVE_SERVER_WIRE_CHUNK_MESSAGE_H_

#include "gradserve/v1/gradserve.pb.h"
#include "grpcpp/support/byte_buffer.h"

namespace gradserve::server {

// Parses *bytes (cleared) into *chunk, reusing chunk's data buffer; false if they are no Chunk.
bool ParseChunk(grpc::ByteBuffer* bytes, v1::Chunk* chunk);

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_WIRE_CHUNK_MESSAGE_H_
