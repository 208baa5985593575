#include "server/wire/unary_messages.h"

#include <climits>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/slice.h"
#include "proto/wire_format.h"
#include "server/base/per_thread.h"
#include "server/wire/malformed_request.h"

namespace gradserve::server {
namespace {

// Holders given back on a thread, reset. Each thread's cache is its own, so it needs no lock;
// a holder may be taken on one thread and given back on another.
using HolderCache = PerThread<std::vector<std::unique_ptr<UnaryMessages>>>;

using WireFormat = google::protobuf::internal::WireFormatLite;
constexpr uint32_t kRequestGraphField = v1::GradRequest::kGraphFieldNumber;
constexpr uint32_t kGraphOpsField = v1::Graph::kOpsFieldNumber;
constexpr uint32_t kLengthDelimited = WireFormat::WIRETYPE_LENGTH_DELIMITED;

// Reads a varint from *in, advancing it; false if it is cut off or too long.
bool ReadVarint(absl::string_view* in, uint64_t* value) {
  return GetVarint([in] { return !in->empty(); },
                   [in] {
                     const auto byte = static_cast<unsigned char>(in->front());
                     in->remove_prefix(1);
                     return byte;
                   },
                   value);
}

// One field of an encoded message: its number, wire type, the whole record (tag, length and
// payload) and, if length-delimited, the payload.
struct WireField {
  uint32_t number = 0;
  uint32_t type = 0;
  absl::string_view record;
  absl::string_view payload;
};

// Reads the next field of *in, advancing it; false if it is malformed or a group (which
// SplitOps leaves to protobuf).
bool ReadField(absl::string_view* in, WireField* field) {
  const char* const start = in->data();
  uint64_t tag;
  if (!ReadVarint(in, &tag) || tag > UINT32_MAX || (tag >> 3) == 0) return false;
  field->number = static_cast<uint32_t>(tag >> 3);
  field->type = static_cast<uint32_t>(tag & 7);
  uint64_t skip = 0;
  switch (field->type) {
    case WireFormat::WIRETYPE_VARINT: {
      uint64_t ignored;
      if (!ReadVarint(in, &ignored)) return false;
      break;
    }
    case WireFormat::WIRETYPE_FIXED64:
      skip = 8;
      break;
    case WireFormat::WIRETYPE_FIXED32:
      skip = 4;
      break;
    case kLengthDelimited:
      if (!ReadVarint(in, &skip)) return false;
      break;
    default:
      return false;
  }
  if (skip > in->size()) return false;
  field->payload = in->substr(0, skip);
  in->remove_prefix(skip);
  field->record = absl::string_view(start, static_cast<size_t>(in->data() - start));
  return true;
}

// Note [Ops parsed once]: splits an encoded GradRequest into the records of its graph's ops,
// in order (*ops), and the request without them (*rest: every other field as it was, the graph
// re-encoded without its ops). False, with the outputs unspecified, where the bytes are not
// plainly split: a malformed field or a group anywhere in the two levels read, the graph field
// twice or not length-delimited, an op field not length-delimited.
bool SplitOps(absl::string_view request, std::string* ops, std::string* rest) {
  ops->clear();
  rest->clear();
  bool graph_seen = false;
  WireField field;
  while (!request.empty()) {
    if (!ReadField(&request, &field)) return false;
    if (field.number != kRequestGraphField) {
      rest->append(field.record.data(), field.record.size());
      continue;
    }
    if (graph_seen || field.type != kLengthDelimited) return false;
    graph_seen = true;
    // Two passes over the graph: the first takes the ops and measures what is left, the
    // second copies what is left after the graph's new tag and length.
    size_t graph_rest_size = 0;
    WireField inner;
    for (absl::string_view graph = field.payload; !graph.empty();) {
      if (!ReadField(&graph, &inner)) return false;
      if (inner.number != kGraphOpsField) {
        graph_rest_size += inner.record.size();
      } else if (inner.type == kLengthDelimited) {
        ops->append(inner.record.data(), inner.record.size());
      } else {
        return false;
      }
    }
    auto append = [rest](const char* bytes, size_t n) { rest->append(bytes, n); };
    PutVarint(WireFormat::MakeTag(kRequestGraphField, WireFormat::WIRETYPE_LENGTH_DELIMITED),
              append);
    PutVarint(graph_rest_size, append);
    for (absl::string_view graph = field.payload; !graph.empty();) {
      ReadField(&graph, &inner);  // read once already
      if (inner.number != kGraphOpsField) rest->append(inner.record.data(), inner.record.size());
    }
  }
  return true;
}

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

std::string UnaryMessages::PeekRequestId(const grpc::ByteBuffer& bytes) {
  grpc::Slice first;
  if (!bytes.TrySingleSlice(&first).ok()) {
    std::vector<grpc::Slice> slices;
    if (!bytes.Dump(&slices).ok() || slices.empty()) return "";
    first = std::move(slices.front());
  }
  absl::string_view in(reinterpret_cast<const char*>(first.begin()), first.size());
  WireField field;
  if (!ReadField(&in, &field) || field.number != v1::GradRequest::kRequestIdFieldNumber ||
      field.type != kLengthDelimited) {
    return "";
  }
  return std::string(field.payload.substr(0, kMaxPeekedIdBytes));
}

absl::Status UnaryMessages::ParseRequest(const grpc::ByteBuffer& bytes) {
  request_bytes_ = bytes.Length();
  auto malformed = [&] {
    return MalformedRequest(static_cast<int64_t>(request_bytes_), /*streamed=*/false);
  };
  if (request_bytes_ <= kMaxReusedBytes) {
    // Note [Ops parsed once]. A small request comes in one slice or a few; either way its
    // bytes are gathered into flat_.
    auto append = [this](const grpc::Slice& slice) {
      flat_.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    };
    flat_.clear();
    if (grpc::Slice single; bytes.TrySingleSlice(&single).ok()) {
      append(single);
    } else {
      std::vector<grpc::Slice> slices;
      if (!bytes.Dump(&slices).ok()) return malformed();
      for (const grpc::Slice& slice : slices) append(slice);
    }
    return ParseSmall() ? absl::OkStatus() : malformed();
  }
  ops_kept_ = false;
  ops_parsed_from_kept_bytes_ = false;
  if (request_bytes_ > static_cast<size_t>(INT_MAX)) return malformed();
  // The reader only reads the buffer's slices, but takes a pointer to a mutable buffer.
  grpc::ProtoBufferReader reader(const_cast<grpc::ByteBuffer*>(&bytes));
  if (!reader.status().ok()) return malformed();
  // Merged, not parsed: a parse would first free what Reset kept.
  if (!request_.MergeFromBoundedZeroCopyStream(&reader, static_cast<int>(request_bytes_))) {
    return malformed();
  }
  if (request_bytes_ >= kMinTakenBytes) taken_any_ = taken_.TakeFrom(&request_) > 0;
  return absl::OkStatus();
}

bool UnaryMessages::ParseSmall() {
  const bool split = SplitOps(flat_, &ops_bytes_, &rest_);
  const bool reuse = split && ops_kept_ && ops_bytes_ == kept_ops_bytes_;
  ops_kept_ = false;
  ops_parsed_from_kept_bytes_ = false;
  bool parsed;
  if (reuse) {
    // The request's ops, emptied by Reset, and the kept ones trade places.
    request_.mutable_graph()->mutable_ops()->Swap(&kept_ops_);
    parsed = request_.MergeFromString(rest_);
  } else {
    // Merged, not parsed: a parse would first free what Reset kept.
    parsed = request_.MergeFromString(flat_);
    if (parsed && split) kept_ops_bytes_.swap(ops_bytes_);
  }
  ops_parsed_from_kept_bytes_ = parsed && split;
  return parsed;
}

namespace {

// A response over protobuf's 2 GiB, which one message cannot carry.
absl::Status TooLargeForOneMessage(size_t bytes) {
  return absl::ResourceExhaustedError(
      absl::StrCat("the response takes ", bytes,
                   " bytes, more than one message can carry; use ComputeGradientsStream"));
}

}  // namespace

absl::Status UnaryMessages::SerializeResponse(grpc::ByteBuffer* bytes) {
  if (!deferred_.empty()) {
    // Note [Unary tensor bytes taken]: the big tensors go to gRPC as they are.
    std::vector<grpc::Slice> slices;
    if (!deferred_.SerializeToSlices(response_, &slices)) {
      return TooLargeForOneMessage(deferred_.SerializedSize(response_));
    }
    response_bytes_ = 0;
    for (const grpc::Slice& slice : slices) response_bytes_ += slice.size();
    *bytes = grpc::ByteBuffer(slices.data(), slices.size());
    deferred_.Clear();
    return absl::OkStatus();
  }
  response_bytes_ = response_.ByteSizeLong();
  if (response_bytes_ > static_cast<size_t>(INT_MAX)) return TooLargeForOneMessage(response_bytes_);
  // ByteSizeLong cached every sub-message's size, so the bytes are written in one pass.
  grpc::Slice slice(response_bytes_);
  response_.SerializeWithCachedSizesToArray(const_cast<uint8_t*>(slice.begin()));
  *bytes = grpc::ByteBuffer(&slice, 1);
  return absl::OkStatus();
}

void UnaryMessages::Reset() {
  request_.clear_request_id();
  // Note [Ops parsed once]: parsed ops wait in kept_ops_, and its emptied ones take their
  // place. Clear keeps the graph's emptied ops for the next full parse.
  kept_ops_.Clear();
  ops_kept_ = ops_parsed_from_kept_bytes_ && request_.has_graph();
  ops_parsed_from_kept_bytes_ = false;
  if (ops_kept_) request_.mutable_graph()->mutable_ops()->Swap(&kept_ops_);
  if (request_.has_graph()) request_.mutable_graph()->Clear();
  request_.mutable_calls()->Clear();
  request_.mutable_return_values()->Clear();
  request_.clear_allow_tf32();
  request_.GetReflection()->MutableUnknownFields(&request_)->Clear();
  response_.Clear();
  taken_.Clear();
  taken_any_ = false;
  deferred_.Clear();
  request_bytes_ = 0;
  response_bytes_ = 0;
}

}  // namespace gradserve::server
