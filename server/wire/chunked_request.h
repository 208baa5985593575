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
// kExternalDataField) and keeps the engine tensor; Serialize then writes the small serialized
// skeleton into the outgoing chunks with each marker replaced by the `data` field, its bytes
// copied once, straight from the engine tensor into the chunk strings (appended, so never
// zero-filled first). Lengths of enclosing messages are computed in a first pass.

#ifndef GRADSERVE_SERVER_WIRE_CHUNKED_REQUEST_H_
#define GRADSERVE_SERVER_WIRE_CHUNKED_REQUEST_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/tensor/memory_budget.h"
#include "engine/tensor/tensor.h"
#include "gradserve/v1/gradserve.pb.h"

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

  // The bytes of tensor's data if Parse left them in the chunks; null otherwise. tensor must
  // be part of the request Parse filled.
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
  // bytes of host, a contiguous CPU tensor, which is kept until Clear.
  void Defer(Tensor host, v1::Tensor* out);

  // The size of response serialized with the deferred bytes in place.
  size_t SerializedSize(const v1::GradResponse& response) const;

  // Serializes response, with the deferred bytes in place, into *chunks (cleared first) of at
  // most chunk_bytes each, at least one. False if it would be larger than 2 GiB.
  bool Serialize(const v1::GradResponse& response, int64_t chunk_bytes,
                 std::vector<std::string>* chunks) const;

  // Drops the deferred tensors.
  void Clear() { std::vector<Tensor>().swap(tensors_); }

 private:
  std::vector<Tensor> tensors_;
};

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_WIRE_CHUNKED_REQUEST_H_
