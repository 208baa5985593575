#include "server/unary_messages.h"

#include <climits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/slice.h"
#include "server/per_thread.h"
#include "server/wire.h"

namespace gradserve::server {
namespace {

// Holders given back on a thread, reset. Each thread's cache is its own, so it needs no lock;
// a holder may be taken on one thread and given back on another.
using HolderCache = PerThread<std::vector<std::unique_ptr<UnaryMessages>>>;

}  // namespace

UnaryMessages::Ptr UnaryMessages::Take() {
  std::vector<std::unique_ptr<UnaryMessages>>* cache = HolderCache::Get();
  if (cache == nullptr || cache->empty()) return Ptr(new UnaryMessages);
  Ptr holder(cache->back().release());
  cache->pop_back();
  return holder;
}

void UnaryMessages::Recycle::operator()(UnaryMessages* messages) const {
  std::unique_ptr<UnaryMessages> holder(messages);
  std::vector<std::unique_ptr<UnaryMessages>>* cache = HolderCache::Get();
  if (cache == nullptr || cache->size() >= kCachedPerThread ||
      holder->request_bytes_ > kMaxReusedBytes || holder->response_bytes_ > kMaxReusedBytes) {
    return;  // freed
  }
  holder->Reset();
  cache->push_back(std::move(holder));
}

absl::Status UnaryMessages::ParseRequest(const grpc::ByteBuffer& bytes) {
  request_bytes_ = bytes.Length();
  auto malformed = [&] {
    return MalformedRequest(static_cast<int64_t>(request_bytes_), /*streamed=*/false);
  };
  if (request_bytes_ > static_cast<size_t>(INT_MAX)) return malformed();
  // The reader only reads the buffer's slices, but takes a pointer to a mutable buffer.
  grpc::ProtoBufferReader reader(const_cast<grpc::ByteBuffer*>(&bytes));
  if (!reader.status().ok()) return malformed();
  // Merged, not parsed: a parse would first free what Reset kept.
  if (!request_.MergeFromBoundedZeroCopyStream(&reader, static_cast<int>(request_bytes_))) {
    return malformed();
  }
  return absl::OkStatus();
}

absl::Status UnaryMessages::SerializeResponse(grpc::ByteBuffer* bytes) {
  response_bytes_ = response_.ByteSizeLong();
  if (response_bytes_ > static_cast<size_t>(INT_MAX)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the response takes ", response_bytes_,
                     " bytes, more than one message can carry; use ComputeGradientsStream"));
  }
  // ByteSizeLong cached every sub-message's size, so the bytes are written in one pass.
  grpc::Slice slice(response_bytes_);
  response_.SerializeWithCachedSizesToArray(const_cast<uint8_t*>(slice.begin()));
  *bytes = grpc::ByteBuffer(&slice, 1);
  return absl::OkStatus();
}

void UnaryMessages::Reset() {
  request_.clear_request_id();
  if (request_.has_graph()) request_.mutable_graph()->Clear();  // keeps the graph's ops
  request_.mutable_calls()->Clear();
  request_.mutable_return_values()->Clear();
  request_.GetReflection()->MutableUnknownFields(&request_)->Clear();
  response_.Clear();
  request_bytes_ = 0;
  response_bytes_ = 0;
}

}  // namespace gradserve::server
