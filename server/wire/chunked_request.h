// A streamed GradRequest as it arrived: the received chunks, parsed without joining them and
// without copying big tensor bytes out of them.
//
// Note [Tensor bytes left in the chunks]
// Protobuf parses a `bytes` field into a string of its own: for a 64 MiB tensor that is a copy,
// a fresh 64 MiB allocation faulted in page by page (and, past 50 MB, a second, larger one as
// the string grows), after which the server copied the bytes once more into an engine tensor.
// ChunkedRequest::Parse avoids both. It walks the serialized request in its chunks once, guided
// by the message descriptors, and rewrites it into a small skeleton in which every
// Tensor.data of at least kMinExternalBytes is replaced by an empty `data` field and an
// unknown varint field kExternalDataField holding the field's index + 1 in a side table of
// (chunk, offset, size) pieces; protobuf then parses the skeleton, and wire.cc's FromProto asks
// Find() for each tensor's bytes. A tensor whose bytes lie in one chunk adopts them there
// (Note [Adopted storage]); one whose bytes span chunks is gathered into its tensor with a
// single copy. The skeleton has the same meaning as the original: each message is rewritten in
// place and its length patched in as many bytes as the original length took (the rewrite is
// never longer, so every byte is copied once whatever the nesting), fields keep their order (so
// oneof and last-one-wins rules hold: a later inline `data` gets a marker 0, cancelling an earlier
// one), a client's own field kExternalDataField in a Tensor is dropped, and groups (not part of
// proto3) are refused.
//
// Limits: the chunks are bounded by max_request_bytes before Parse runs; Parse allocates only
// the skeleton (smaller than the request) and the side table, and nothing from a length the
// client declares without the bytes being there.
//
// ChunkedResponse is the same trick the other way: wire.cc's ToProto does not copy a big
// gradient into the response message but marks the Tensor (an unknown field
// kExternalDataField) and keeps the engine tensor; SerializeToSlices then writes the small
// serialized skeleton into gRPC slices with each marker replaced by the `data` field, whose
// bytes are a slice over the engine tensor itself, holding a reference to it until gRPC has
// sent them: no copy at all. The streamed reactor cuts those slices into its chunks (sub-slices,
// no copy either). Lengths of enclosing messages are computed in a first pass. The message is
// the one protobuf would write but for the order of fields: a deferred tensor's data comes
// where its marker was, after the Tensor's other fields, which every parser reads the same.
//
// Note [Unary tensor bytes taken]
// A unary request is parsed by protobuf (Note [Unary messages reused]), so a big tensor's
// bytes arrive in a string of the message's own; the server then copied them into an engine
// tensor, and the gradient back into a string of the response, which protobuf copied once more
// into gRPC's slice: three copies of each big tensor. Now a unary request of at least
// UnaryMessages::kMinTakenBytes goes through the same side table as a streamed one: TakeFrom
// swaps each big Tensor.data string out of the message into a chunk (the string's buffer
// moves, its bytes do not), so the tensor adopts it; and every unary response defers its big
// tensors and hands them to gRPC as they are (SerializeToSlices), as a streamed one does.

#ifndef GRADSERVE_SERVER_WIRE_CHUNKED_REQUEST_H_
#define GRADSERVE_SERVER_WIRE_CHUNKED_REQUEST_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/tensor/memory_budget.h"
#include "engine/tensor/tensor.h"
#include "gradserve/v1/gradserve.pb.h"
#include "grpcpp/support/slice.h"

namespace gradserve::server {

// Thread safety: one thread at a time (the reactor appends, then one worker parses and reads).
class ChunkedRequest {
 public:
  // Tensor.data fields smaller than this are left inline in the skeleton.
  static constexpr size_t kMinExternalBytes = size_t{16} << 10;
  // The field number of the marker in the skeleton's Tensors (the largest one protobuf allows).
  static constexpr int kExternalDataField = (1 << 29) - 1;

  // A run of a tensor's bytes within one received chunk.
  struct Piece {
    std::shared_ptr<std::string> chunk;  // shared with the request, so a tensor may adopt it
    size_t offset;
    size_t size;
    char* data() const { return chunk->data() + offset; }
  };
  // The bytes of one Tensor.data left in the chunks, in order.
  struct Bytes {
    std::vector<Piece> pieces;
    size_t size = 0;
  };

  // Takes the bytes of the next received chunk.
  void Append(std::string data);
  // Bytes received so far.
  int64_t size() const { return size_; }

  // Parses the chunks into *request, leaving big tensor bytes in place. INVALID_ARGUMENT if
  // they do not form a gradserve.v1.GradRequest.
  absl::Status Parse(v1::GradRequest* request);

  // For a request protobuf parsed whole (a unary call's): moves the bytes of each
  // Tensor.data of at least kMinExternalBytes out of *request into a chunk of their own, which
  // the tensor made from it adopts (Note [Unary tensor bytes taken]), and marks the Tensor as
  // Parse does. A client's own markers are removed from every Tensor first. Returns how many
  // were taken; with none, Find finds nothing.
  int TakeFrom(v1::GradRequest* request);

  // The bytes of tensor's data if Parse or TakeFrom left them in the chunks; null otherwise.
  // tensor must be part of the request Parse or TakeFrom filled.
  const Bytes* Find(const v1::Tensor& tensor) const;

  // Drops the chunks and the side table: tensors that adopted a chunk keep it alive (and are
  // charged to the budget current where they were made). Gives back memory().
  void Clear();

  // What the received bytes are charged to while they wait here (Note [Uploads apart from
  // work] in server/limits/upload_tracker.h); empty unless the receiver sets it up.
  MemoryReservation& memory() { return memory_; }

 private:
  class Walker;

  MemoryReservation memory_;

  std::vector<std::shared_ptr<std::string>> chunks_;
  int64_t size_ = 0;
  std::vector<Bytes> external_;
};

// A streamed response whose big tensors stay in the engine until they are written into the
// chunks (Note [Tensor bytes left in the chunks]).
//
// Thread safety: one thread at a time.
class ChunkedResponse {
 public:
  // Whether a tensor of nbytes is worth deferring.
  static bool Defers(size_t nbytes) { return nbytes >= ChunkedRequest::kMinExternalBytes; }

  // Marks *out (whose dtype, shape and device are set, its contents not) as standing for the
  // bytes of host, a CPU tensor that is contiguous or repeats one value, kept until Clear.
  void Defer(Tensor host, v1::Tensor* out);

  // The bytes serializing a deferred tensor of nbytes that repeats one value makes: one block
  // of the value repeated, which every slice of its bytes points into (Note [A gradient of one
  // value] in engine/ops/broadcast.cc).
  static size_t RepeatedBlockBytes(size_t nbytes) { return std::min(nbytes, kRepeatedBlockBytes); }

  // The size of response serialized with the deferred bytes in place.
  size_t SerializedSize(const v1::GradResponse& response) const;

  // Serializes response, with the deferred bytes in place, into *slices (cleared first): the
  // bytes around the deferred tensors copied into slices, each deferred tensor's bytes a slice
  // over the tensor's memory, which the slice keeps alive until gRPC is done with it: no copy
  // (Note [Unary tensor bytes taken]); a tensor of one value, slices over one block of it
  // (RepeatedBlockBytes). False if it would be larger than 2 GiB.
  bool SerializeToSlices(const v1::GradResponse& response, std::vector<grpc::Slice>* slices) const;

  // Whether a tensor is deferred.
  bool empty() const { return tensors_.empty(); }
  // The bytes of the deferred tensors: the part of SerializedSize that is theirs, not a copy.
  size_t DeferredBytes() const;

  // Drops the deferred tensors.
  void Clear() { std::vector<Tensor>().swap(tensors_); }

 private:
  // Small enough to stay in a CPU's second-level cache while the kernel copies it out again
  // and again; large enough that a 64 MiB tensor is 256 slices.
  static constexpr size_t kRepeatedBlockBytes = size_t{256} << 10;

  std::vector<Tensor> tensors_;
};

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_WIRE_CHUNKED_REQUEST_H_
