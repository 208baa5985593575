// Chunks written without copying their data (chunk_message.h).

#include "server/wire/chunk_message.h"

#include <utility>
#include <vector>

#include "grpcpp/impl/codegen/proto_utils.h"
#include "grpcpp/support/slice.h"
#include "proto/chunking.h"
#include "server/wire/wire_format.h"

namespace gradserve::server {
namespace {

// Field numbers and wire types of v1::Chunk.
constexpr uint64_t kDataTag = (uint64_t{v1::Chunk::kDataFieldNumber} << 3) | 2;  // bytes
constexpr uint64_t kTotalBytesTag =
    (uint64_t{v1::Chunk::kTotalBytesFieldNumber} << 3) | 0;  // int64

// The release of a data slice: the string's buffer goes back to the pool.
void GiveBack(void* owned) {
  auto* data = static_cast<std::string*>(owned);
  chunking::BufferPool::Default().Give(std::move(*data));
  delete data;
}

}  // namespace

grpc::ByteBuffer SerializeChunk(std::string data, int64_t total_bytes) {
  std::vector<grpc::Slice> slices;
  if (data.empty()) {
    chunking::BufferPool::Default().Give(std::move(data));
  } else {
    auto* owned = new std::string(std::move(data));
    slices.emplace_back(owned->data(), owned->size(), &GiveBack, owned);
  }
  return SerializeChunk(std::move(slices), total_bytes);
}

grpc::ByteBuffer SerializeChunk(std::vector<grpc::Slice> data, int64_t total_bytes) {
  size_t data_bytes = 0;
  for (const grpc::Slice& slice : data) data_bytes += slice.size();
  std::string framing;
  auto append = [&framing](const char* p, size_t n) { framing.append(p, n); };
  std::vector<grpc::Slice> slices;
  slices.reserve(data.size() + 2);
  if (data_bytes > 0) {
    PutVarint(kDataTag, append);
    PutVarint(data_bytes, append);
    slices.emplace_back(framing);
    for (grpc::Slice& slice : data) {
      if (slice.size() > 0) slices.push_back(std::move(slice));
    }
    framing.clear();
  }
  if (total_bytes != 0) {
    PutVarint(kTotalBytesTag, append);
    PutVarint(static_cast<uint64_t>(total_bytes), append);  // int64: two's complement, as protobuf
    slices.emplace_back(framing);
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

bool ParseChunk(grpc::ByteBuffer* bytes, v1::Chunk* chunk) {
  return grpc::GenericDeserialize<grpc::ProtoBufferReader, v1::Chunk>(bytes, chunk).ok();
}

}  // namespace gradserve::server
