// The Chunks of ComputeGradientsStream as the gRPC slices they travel in: a message serialized
// into slices that point into its own big bytes fields, cut into Chunk frames without a copy,
// and received frames read back into the slices of their data (Note [Zero-copy streaming]).
// Used by the C++ client for both directions of a streamed call, and by the server for the
// chunks it writes (Note [Chunks sent without a copy], server/wire/chunk_message.h); depends on
// protobuf, gRPC and Abseil only.
//
// Note [Zero-copy streaming]
// ComputeGradientsStream carries a serialized GradRequest (or GradResponse) cut into Chunks. The
// naive way serializes into one string, copies pieces of it into each Chunk, lets gRPC's
// protobuf serializer copy each Chunk into its slices, and on the other side has protobuf copy
// each Chunk's data out of gRPC's slices, appends them into one string and parses that: four
// copies of a 64 MiB tensor on each side besides the kernel's, and fresh big allocations, each
// faulted in page by page. The C++ client and the server call the stream with raw ByteBuffers
// instead, and move a message's bytes as the slices they travel in:
//   - SerializeToSlices lets protobuf alias bytes fields (CodedOutputStream::EnableAliasing): a
//     field too big for the block being filled becomes a slice over the message's own string,
//     and everything else is written into blocks of kSliceBlockBytes. The message must stay
//     unchanged while gRPC may read those slices, which can be a little after the call ends (a
//     transport thread drops its last references when it is done with the stream): each
//     aliased slice is counted in an AliasedSlices, whose destructor waits until gRPC has
//     released every one, so a caller that declares it before the call keeps the message for
//     exactly as long as needed.
//   - CutIntoChunks cuts those slices into frames of chunk_bytes of data each (sub-slices, no
//     copy), and ChunkFrame writes each frame's few bytes of framing itself: the bytes protobuf
//     writes for the same Chunk.
//   - AppendChunkData reads a received frame by hand, keeping its data as sub-slices of what
//     gRPC received (no copy), and ParseFromSlices parses the message from all of them through
//     gRPC's ProtoBufferReader: one copy, into the message's own fields.
// So the client's 64 MiB request costs it no copy of the tensor's bytes on the way out, and the
// response one on the way back: before, the client made four, about as much of the host's CPU
// as the server's whole share of the copies (perf, grad_64mb). The server goes further on its
// side: a request's big tensor bytes stay in the received chunks (Note [Tensor bytes left in
// the chunks], server/wire/chunked_request.h), and a response's big tensors are slices over
// the engine's own tensors, framed by ChunkFrame (Note [Chunks sent without a copy]).
//
// Thread safety: stateless functions; a slice's release may run on any gRPC thread.

#ifndef GRADSERVE_PROTO_CHUNK_SLICES_H_
#define GRADSERVE_PROTO_CHUNK_SLICES_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/message_lite.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"

namespace gradserve::chunking {

// The size of the blocks SerializeToSlices writes the non-aliased bytes into.
inline constexpr size_t kSliceBlockBytes = size_t{16} << 10;

// Counts the slices SerializeToSlices made over a message's own memory until gRPC (or anyone
// holding them) releases the last reference to each (Note [Zero-copy streaming]).
//
// Thread safety: slices may be released on any thread; the destructor waits for them.
class AliasedSlices {
 public:
  AliasedSlices() = default;
  AliasedSlices(const AliasedSlices&) = delete;
  AliasedSlices& operator=(const AliasedSlices&) = delete;
  // Blocks until every slice counted here is released.
  ~AliasedSlices();

  // A slice over size bytes at data, counted here until it is released.
  grpc::Slice Alias(const void* data, size_t size);

 private:
  static void Release(void* self);

  absl::Mutex mutex_;
  int64_t outstanding_ ABSL_GUARDED_BY(mutex_) = 0;
};

// Serializes message into *slices (cleared first), bytes fields that do not fit the block being
// filled aliased in place and counted in *aliased (Note [Zero-copy streaming]): message must stay
// unchanged until *aliased is destroyed. False if the message cannot be serialized (larger than
// 2 GiB).
bool SerializeToSlices(const google::protobuf::MessageLite& message, AliasedSlices* aliased,
                       std::vector<grpc::Slice>* slices);

// The Chunk frames of a serialized message given as slices: chunk_bytes (> 0) of data each,
// the last one shorter, total_bytes on the first; at least one frame, empty for an empty
// message. The data are sub-slices of slices: no copy.
std::vector<grpc::ByteBuffer> CutIntoChunks(const std::vector<grpc::Slice>& slices,
                                            int64_t chunk_bytes, int64_t total_bytes);

// The serialized v1::Chunk whose data is the concatenation of data (taken as they are, no
// copy) and whose total_bytes is total_bytes: fields in number order, each left out at its
// default, as protobuf writes it.
grpc::ByteBuffer ChunkFrame(std::vector<grpc::Slice> data, int64_t total_bytes);

// Appends the data of a received v1::Chunk to *data as sub-slices of chunk's own (no copy).
// The last data field wins, as in protobuf; other fields are skipped. False if the bytes are
// no Chunk (a truncated field, a group, field number 0); *data is then unspecified.
bool AppendChunkData(const grpc::ByteBuffer& chunk, std::vector<grpc::Slice>* data);

// Parses the concatenation of slices into *message. False if it does not parse.
bool ParseFromSlices(const std::vector<grpc::Slice>& slices,
                     google::protobuf::MessageLite* message);

}  // namespace gradserve::chunking

#endif  // GRADSERVE_PROTO_CHUNK_SLICES_H_
