// A unary grad call's request and response messages, parsed from and serialized to gRPC's
// bytes by the server itself, and reused by the thread that handled them.
//
// Note [Unary messages reused]
// gRPC's own handler parses a unary request into fresh message objects: for a small grad
// request that is dozens of allocations (each op, each name, each tensor), all freed again when
// the call ends, and protobuf's parse empties its target first in a way that frees a singular
// sub-message (the graph) with everything under it, so even a reused message would be rebuilt.
// ComputeGradients is therefore a raw method (gRPC hands it the serialized bytes), and the
// server parses them into a UnaryMessages that a call on the same thread used before. Reset
// empties it while keeping the objects it held: repeated fields keep their cleared elements,
// strings their buffers, and the request's graph stays allocated; protobuf then merges the new
// bytes into them. A request shaped like the thread's last one is parsed with next to no
// allocation (docs/benchmarks.md). What a reused request reads is what a fresh parse reads; the
// one difference is that a request with no graph field has an empty graph present, which reads
// the same (proto3's default) and which nothing in the server looks at.
//
// Note [Ops parsed once]
// A client that sends one graph again and again sends its ops as the same bytes each time, and
// for a small request the ops were most of the parse (about 8k of the 13k instructions of a
// ten-op request). So a holder remembers the wire records of the ops it parsed last, and keeps
// those parsed ops aside when it is reset. ParseRequest splits a small request's bytes into the
// records of graph.ops and the rest (SplitOps); if the records are byte for byte the ones it
// remembers, it puts the kept ops back and parses only the rest. Equal bytes parse to equal
// messages, so the request reads exactly as a full parse would; anything SplitOps does not
// take apart plainly (the graph field twice, a group, a field of the wrong wire type) is
// parsed whole, as is every request over kMaxReusedBytes.
//
// Bounds: each thread keeps at most kCachedPerThread holders, and a holder whose request or
// response took more than kMaxReusedBytes serialized is freed rather than kept, so what a
// thread retains is a few small messages' worth, whatever the clients send: with the kept ops
// and their bytes, and the buffers ParseRequest splits into, a holder keeps at most a few
// times kMaxReusedBytes. The kept ops are the structure of the holder's last graph (op names,
// value names, attributes), as the graph cache keeps it (Note [Reusing a validated graph]);
// they are read by no other request unless it sends the same bytes.

#ifndef GRADSERVE_SERVER_WIRE_UNARY_MESSAGES_H_
#define GRADSERVE_SERVER_WIRE_UNARY_MESSAGES_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "gradserve/v1/gradserve.pb.h"
#include "grpcpp/support/byte_buffer.h"
#include "server/wire/chunked_request.h"

namespace gradserve::server {

// Thread safety: one thread at a time uses a holder; Take and the deleter may run on any
// threads at once (each thread has its own cache).
class UnaryMessages {
 public:
  // Holders a thread keeps for reuse: one serves its inline calls; more serve calls whose
  // reactors end on it.
  static constexpr size_t kCachedPerThread = 2;
  // A holder is kept only if its request and response were at most this large serialized.
  static constexpr size_t kMaxReusedBytes = size_t{8} << 10;
  // A request at least this large has its big tensor bytes taken out of the message (Note
  // [Unary tensor bytes taken]); a smaller one may be worth the graph cache more (Note
  // [Reusing a validated graph]), which a request with taken bytes skips.
  static constexpr size_t kMinTakenBytes = size_t{1} << 20;

  // Gives the holder back to the calling thread's cache (reset), or frees it.
  struct Recycle {
    void operator()(UnaryMessages* messages) const;
  };
  using Ptr = std::unique_ptr<UnaryMessages, Recycle>;

  // A holder from this thread's cache, or a new one; its messages are empty.
  static Ptr Take();

  // The request id of an encoded GradRequest that is not parsed (a refused call's, a malformed
  // one's), for the request log: the first field of its first slice if that is request_id
  // whole, where every serializer puts it; else empty. At most kMaxPeekedIdBytes of it, and
  // not checked to be UTF-8: the log escapes it.
  static std::string PeekRequestId(const grpc::ByteBuffer& bytes);
  static constexpr size_t kMaxPeekedIdBytes = 64;

  // Parses bytes into request(). INVALID_ARGUMENT if they are not a gradserve.v1.GradRequest.
  absl::Status ParseRequest(const grpc::ByteBuffer& bytes);
  // Serializes response() into *bytes. RESOURCE_EXHAUSTED past protobuf's 2 GiB.
  absl::Status SerializeResponse(grpc::ByteBuffer* bytes);

  const v1::GradRequest& request() const { return request_; }
  v1::GradResponse* response() { return &response_; }
  // The request's big tensor bytes, taken out of it (Note [Unary tensor bytes taken]), for
  // FromProto; null when ParseRequest took none. Valid until the holder is reset.
  ChunkedRequest* chunked() { return taken_any_ ? &taken_ : nullptr; }
  // Where the response's big tensors wait for SerializeResponse (Note [Unary tensor bytes
  // taken]).
  ChunkedResponse* deferred() { return &deferred_; }
  // The serialized size of the request ParseRequest read.
  int64_t request_bytes() const { return static_cast<int64_t>(request_bytes_); }
  // The records of request().graph().ops as the request carried them, which parse to exactly
  // those ops (Note [Ops parsed once]); null if ParseRequest did not split the request. Valid
  // until the holder is reset.
  const std::string* op_records() const {
    return ops_parsed_from_kept_bytes_ ? &kept_ops_bytes_ : nullptr;
  }

 private:
  UnaryMessages() = default;
  // Empties both messages, keeping what they allocated (Note [Unary messages reused]).
  void Reset();

  // Parses flat_, the whole request, reusing the kept ops if its op records are the ones the
  // holder last parsed (Note [Ops parsed once]). False if the bytes are malformed.
  bool ParseSmall();

  v1::GradRequest request_;
  v1::GradResponse response_;
  ChunkedRequest taken_;
  bool taken_any_ = false;
  ChunkedResponse deferred_;
  size_t request_bytes_ = 0;
  size_t response_bytes_ = 0;

  // Note [Ops parsed once]. kept_ops_bytes_: the op records of the last request parsed. While
  // ops_parsed_from_kept_bytes_, request_'s ops are those records parsed; Reset then moves
  // them to kept_ops_ and sets ops_kept_, until the next ParseRequest takes them back or
  // drops them. Otherwise kept_ops_ holds emptied ops, kept for their allocations.
  google::protobuf::RepeatedPtrField<v1::Op> kept_ops_;
  std::string kept_ops_bytes_;
  bool ops_parsed_from_kept_bytes_ = false;
  bool ops_kept_ = false;
  // ParseSmall's buffers, kept for their capacity: a request gathered from several slices,
  // its op records, and the rest of it.
  std::string flat_;
  std::string ops_bytes_;
  std::string rest_;
};

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_WIRE_UNARY_MESSAGES_H_
