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
// Bounds: each thread keeps at most kCachedPerThread holders, and a holder whose request or
// response took more than kMaxReusedBytes serialized is freed rather than kept, so what a
// thread retains is a few small messages' worth, whatever the clients send.

#ifndef GRADSERVE_SERVER_UNARY_MESSAGES_H_
#define GRADSERVE_SERVER_UNARY_MESSAGES_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "gradserve/v1/gradserve.pb.h"
#include "grpcpp/support/byte_buffer.h"

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

  // Gives the holder back to the calling thread's cache (reset), or frees it.
  struct Recycle {
    void operator()(UnaryMessages* messages) const;
  };
  using Ptr = std::unique_ptr<UnaryMessages, Recycle>;

  // A holder from this thread's cache, or a new one; its messages are empty.
  static Ptr Take();

  // Parses bytes into request(). INVALID_ARGUMENT if they are not a gradserve.v1.GradRequest.
  absl::Status ParseRequest(const grpc::ByteBuffer& bytes);
  // Serializes response() into *bytes. RESOURCE_EXHAUSTED past protobuf's 2 GiB.
  absl::Status SerializeResponse(grpc::ByteBuffer* bytes);

  const v1::GradRequest& request() const { return request_; }
  v1::GradResponse* response() { return &response_; }
  // The serialized size of the request ParseRequest read.
  int64_t request_bytes() const { return static_cast<int64_t>(request_bytes_); }

 private:
  UnaryMessages() = default;
  // Empties both messages, keeping what they allocated (Note [Unary messages reused]).
  void Reset();

  v1::GradRequest request_;
  v1::GradResponse response_;
  size_t request_bytes_ = 0;
  size_t response_bytes_ = 0;
};

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_UNARY_MESSAGES_H_
