// Chunks read with protobuf (chunk_message.h).

#include "server/wire/chunk_message.h"

#include "grpcpp/impl/codegen/proto_utils.h"

namespace gradserve::server {

bool ParseChunk(grpc::ByteBuffer* bytes, v1::Chunk* chunk) {
  return grpc::GenericDeserialize<grpc::ProtoBufferReader, v1::Chunk>(bytes, chunk).ok();
}

}  // namespace gradserve::server
