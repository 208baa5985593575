// Chunks as the gRPC slices they travel in (chunk_slices.h).

#include "proto/chunk_slices.h"

#include <algorithm>
#include <climits>
#include <string>
#include <utility>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream.h"
#include "gradserve/v1/gradserve.pb.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "proto/wire_format.h"

namespace gradserve::chunking {
namespace {

// Field numbers and wire types of v1::Chunk.
constexpr uint64_t kDataField = v1::Chunk::kDataFieldNumber;
constexpr uint64_t kDataTag = (kDataField << 3) | 2;  // bytes
constexpr uint64_t kTotalBytesTag =
    (uint64_t{v1::Chunk::kTotalBytesFieldNumber} << 3) | 0;  // int64
constexpr uint64_t kMaxFieldNumber = (uint64_t{1} << 29) - 1;

// A ZeroCopyOutputStream whose output is slices: blocks of kSliceBlockBytes it allocates, and
// the caller's own memory where protobuf asks to alias it (Note [Zero-copy streaming]).
//
// Thread safety: one thread at a time.
class SliceOutputStream final : public google::protobuf::io::ZeroCopyOutputStream {
 public:
  SliceOutputStream(AliasedSlices* aliased, std::vector<grpc::Slice>* out)
      : aliased_(aliased), out_(out) {}
  ~SliceOutputStream() override { Flush(); }

  bool Next(void** data, int* size) override {
    Flush();
    block_ = grpc::Slice(kSliceBlockBytes);
    *data = const_cast<uint8_t*>(block_.begin());
    *size = static_cast<int>(kSliceBlockBytes);
    used_ = kSliceBlockBytes;
    written_ += static_cast<int64_t>(kSliceBlockBytes);
    return true;
  }
  void BackUp(int count) override {
    used_ -= static_cast<size_t>(count);
    written_ -= count;
  }
  int64_t ByteCount() const override { return written_; }
  bool AllowsAliasing() const override { return true; }
  bool WriteAliasedRaw(const void* data, int size) override {
    Flush();
    out_->push_back(aliased_->Alias(data, static_cast<size_t>(size)));
    written_ += size;
    return true;
  }

 private:
  // The used part of the block being filled becomes the next slice.
  void Flush() {
    if (used_ > 0) out_->push_back(block_.sub(0, used_));
    used_ = 0;
    block_ = grpc::Slice();
  }

  AliasedSlices* const aliased_;
  std::vector<grpc::Slice>* const out_;
  grpc::Slice block_;
  size_t used_ = 0;  // bytes of block_ handed out and not backed up
  int64_t written_ = 0;
};

// Reads bytes across a list of slices.
//
// Thread safety: one thread at a time; the slices must outlive the cursor.
class SliceCursor {
 public:
  explicit SliceCursor(const std::vector<grpc::Slice>& slices) : slices_(slices) { SkipEmpty(); }

  bool more() const { return index_ < slices_.size(); }
  // The next byte; more() must be true.
  unsigned char next() {
    const unsigned char byte = slices_[index_].begin()[offset_];
    Advance(1);
    return byte;
  }
  // Steps over n bytes, appending them to *out (if not null) as sub-slices; false if fewer
  // than n are left.
  bool Take(uint64_t n, std::vector<grpc::Slice>* out) {
    while (n > 0) {
      if (!more()) return false;
      const grpc::Slice& slice = slices_[index_];
      const size_t k = static_cast<size_t>(std::min<uint64_t>(slice.size() - offset_, n));
      if (out != nullptr) {
        out->push_back(offset_ == 0 && k == slice.size() ? slice : slice.sub(offset_, offset_ + k));
      }
      Advance(k);
      n -= k;
    }
    return true;
  }

 private:
  void Advance(size_t k) {
    offset_ += k;
    if (offset_ == slices_[index_].size()) {
      ++index_;
      offset_ = 0;
      SkipEmpty();
    }
  }
  void SkipEmpty() {
    while (index_ < slices_.size() && slices_[index_].size() == 0) ++index_;
  }

  const std::vector<grpc::Slice>& slices_;
  size_t index_ = 0;
  size_t offset_ = 0;
};

}  // namespace

AliasedSlices::~AliasedSlices() {
  absl::MutexLock lock(&mutex_);
  mutex_.Await(absl::Condition(
      +[](int64_t* outstanding) { return *outstanding == 0; }, &outstanding_));
}

grpc::Slice AliasedSlices::Alias(const void* data, size_t size) {
  {
    absl::MutexLock lock(&mutex_);
    ++outstanding_;
  }
  // gRPC only reads the bytes; the slice's type asks for a mutable pointer.
  return grpc::Slice(const_cast<void*>(data), size, &AliasedSlices::Release, this);
}

void AliasedSlices::Release(void* self) {
  auto* aliased = static_cast<AliasedSlices*>(self);
  absl::MutexLock lock(&aliased->mutex_);
  --aliased->outstanding_;
}

bool SerializeToSlices(const google::protobuf::MessageLite& message, AliasedSlices* aliased,
                       std::vector<grpc::Slice>* slices) {
  slices->clear();
  if (message.ByteSizeLong() > static_cast<size_t>(INT_MAX)) return false;
  SliceOutputStream stream(aliased, slices);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.EnableAliasing(true);
  message.SerializeWithCachedSizes(&coded);
  coded.Trim();
  return !coded.HadError();
}

std::vector<grpc::ByteBuffer> CutIntoChunks(const std::vector<grpc::Slice>& slices,
                                            int64_t chunk_bytes, int64_t total_bytes) {
  const auto limit = static_cast<size_t>(chunk_bytes);
  std::vector<grpc::ByteBuffer> frames;
  std::vector<grpc::Slice> data;
  size_t in_frame = 0;
  auto emit = [&] {
    frames.push_back(ChunkFrame(std::move(data), frames.empty() ? total_bytes : 0));
    data.clear();
    in_frame = 0;
  };
  for (const grpc::Slice& slice : slices) {
    for (size_t offset = 0; offset < slice.size();) {
      const size_t n = std::min(slice.size() - offset, limit - in_frame);
      data.push_back(n == slice.size() ? slice : slice.sub(offset, offset + n));
      offset += n;
      in_frame += n;
      if (in_frame == limit) emit();
    }
  }
  if (in_frame > 0 || frames.empty()) emit();
  return frames;
}

grpc::ByteBuffer ChunkFrame(std::vector<grpc::Slice> data, int64_t total_bytes) {
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

bool AppendChunkData(const grpc::ByteBuffer& chunk, std::vector<grpc::Slice>* data) {
  std::vector<grpc::Slice> slices;
  if (!chunk.Dump(&slices).ok()) return false;
  SliceCursor in(slices);
  auto more = [&in] { return in.more(); };
  auto next = [&in] { return in.next(); };
  const size_t first = data->size();
  while (in.more()) {
    uint64_t tag = 0;
    if (!GetVarint(more, next, &tag)) return false;
    const uint64_t field = tag >> 3;
    if (field == 0 || field > kMaxFieldNumber) return false;
    switch (tag & 7) {
      case 0: {  // varint: total_bytes, or a field this reader does not know
        uint64_t value = 0;
        if (!GetVarint(more, next, &value)) return false;
        break;
      }
      case 1:  // fixed64
        if (!in.Take(8, nullptr)) return false;
        break;
      case 5:  // fixed32
        if (!in.Take(4, nullptr)) return false;
        break;
      case 2: {  // length-delimited: data, or a field this reader does not know
        uint64_t length = 0;
        if (!GetVarint(more, next, &length)) return false;
        const bool is_data = field == kDataField;
        if (is_data) data->resize(first);  // the last data field wins
        if (!in.Take(length, is_data ? data : nullptr)) return false;
        break;
      }
      default:  // groups (3, 4) and wire types 6 and 7: no Chunk has them
        return false;
    }
  }
  return true;
}

bool ParseFromSlices(const std::vector<grpc::Slice>& slices,
                     google::protobuf::MessageLite* message) {
  grpc::ByteBuffer buffer(slices.data(), slices.size());
  grpc::ProtoBufferReader reader(&buffer);
  if (!reader.status().ok()) return false;
  return message->ParseFromZeroCopyStream(&reader);
}

}  // namespace gradserve::chunking
