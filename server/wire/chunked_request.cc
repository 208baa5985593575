#include "server/wire/chunked_request.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/unknown_field_set.h"
#include "google/protobuf/wire_format_lite.h"
#include "proto/chunking.h"
#include "server/wire/malformed_request.h"
#include "server/wire/wire_format.h"

namespace gradserve::server {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::io::CodedOutputStream;
using WireFormat = google::protobuf::internal::WireFormatLite;
using Chunks = std::vector<std::shared_ptr<std::string>>;

// protobuf's own default nesting limit.
constexpr int kMaxDepth = 100;
constexpr int kTensorDataField = v1::Tensor::kDataFieldNumber;
constexpr int kMarkerField = ChunkedRequest::kExternalDataField;

// Writes v as a varint of exactly n bytes (at least its VarintSize64), padding with continuation
// bytes: protobuf reads such non-minimal varints as the same value.
void PutPaddedVarint(uint64_t v, size_t n, char* out) {
  for (size_t i = 0; i + 1 < n; ++i) {
    out[i] = static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out[n - 1] = static_cast<char>(v);
}

uint32_t Tag(int field, WireFormat::WireType type) { return WireFormat::MakeTag(field, type); }

// Reads the wire format forward across a list of chunks. Callers check that what they read
// lies before the end of the message they walk; the reader never reads past the last chunk.
class WireReader {
 public:
  explicit WireReader(const Chunks* chunks) : chunks_(chunks) {}

  uint64_t position() const { return position_; }

  // Reads a varint that must end before end; false if it does not.
  bool Varint(uint64_t end, uint64_t* v) {
    return GetVarint([&] { return position_ < end; },
                     [this] {
                       Settle();
                       const auto byte = static_cast<unsigned char>((*(*chunks_)[chunk_])[offset_]);
                       ++offset_;
                       ++position_;
                       return byte;
                     },
                     v);
  }

  // Moves past n bytes, which must be there, calling f(const std::shared_ptr<std::string>&
  // chunk, size_t offset, size_t size) for each run of them.
  template <typename F>
  void Read(uint64_t n, F&& f) {
    while (n > 0) {
      Settle();
      const std::shared_ptr<std::string>& chunk = (*chunks_)[chunk_];
      const size_t k = std::min<uint64_t>(n, chunk->size() - offset_);
      f(chunk, offset_, k);
      offset_ += k;
      position_ += k;
      n -= k;
    }
  }

 private:
  // Steps over exhausted (or empty) chunks.
  void Settle() {
    while (offset_ >= (*chunks_)[chunk_]->size()) {
      ++chunk_;
      offset_ = 0;
    }
  }

  const Chunks* chunks_;  // not owned
  size_t chunk_ = 0;
  size_t offset_ = 0;
  uint64_t position_ = 0;
};

// Appends bytes to chunk strings of at most chunk_bytes, each reserved (not zero-filled) to
// what it will hold, on a pooled buffer when there is one (Note [Chunk buffer pool]).
class ChunkWriter {
 public:
  ChunkWriter(std::vector<std::string>* chunks, size_t chunk_bytes, size_t total)
      : chunks_(chunks), chunk_bytes_(chunk_bytes), remaining_(total) {}

  void operator()(const char* data, size_t n) {
    while (n > 0) {
      if (chunks_->empty() || chunks_->back().size() == chunk_bytes_) {
        chunks_->push_back(chunking::BufferPool::Default().Take());
        chunks_->back().reserve(std::min(chunk_bytes_, remaining_));
      }
      std::string& chunk = chunks_->back();
      const size_t k = std::min(n, chunk_bytes_ - chunk.size());
      chunk.append(data, k);
      data += k;
      n -= k;
      remaining_ -= std::min(remaining_, k);
    }
  }

 private:
  std::vector<std::string>* const chunks_;
  const size_t chunk_bytes_;
  size_t remaining_;
};

}  // namespace

// The request's pass (Note [Tensor bytes left in the chunks]).
class ChunkedRequest::Walker {
 public:
  explicit Walker(ChunkedRequest* request) : request_(request), in_(&request->chunks_) {}

  // Rewrites the fields of a message of type d, the next `length` bytes, into *out.
  absl::Status Message(const Descriptor* d, uint64_t length, int depth, std::string* out) {
    if (depth > kMaxDepth) return Malformed("messages nested too deep");
    const uint64_t end = in_.position() + length;
    const bool is_tensor = d == v1::Tensor::descriptor();
    bool extracted = false;  // an earlier data field of this Tensor was left in the chunks
    auto append = [out](const char* p, size_t n) { out->append(p, n); };
    auto copy = [out](const std::shared_ptr<std::string>& chunk, size_t offset, size_t n) {
      out->append(*chunk, offset, n);
    };
    auto skip = [](const std::shared_ptr<std::string>&, size_t, size_t) {};
    while (in_.position() < end) {
      uint64_t tag = 0;
      if (!in_.Varint(end, &tag)) return Malformed("truncated tag");
      const uint64_t number = tag >> 3;
      if (number == 0 || number > static_cast<uint64_t>(kMarkerField)) {
        return Malformed("invalid field number");
      }
      const int field = static_cast<int>(number);
      const auto type = static_cast<WireFormat::WireType>(tag & 7);
      const bool dropped = is_tensor && field == kMarkerField;  // the client's own marker
      switch (type) {
        case WireFormat::WIRETYPE_VARINT: {
          uint64_t v = 0;
          if (!in_.Varint(end, &v)) return Malformed("truncated varint");
          if (!dropped) {
            PutVarint(tag, append);
            PutVarint(v, append);
          }
          break;
        }
        case WireFormat::WIRETYPE_FIXED64:
        case WireFormat::WIRETYPE_FIXED32: {
          const uint64_t n = type == WireFormat::WIRETYPE_FIXED64 ? 8 : 4;
          if (end - in_.position() < n) return Malformed("truncated fixed-size field");
          if (dropped) {
            in_.Read(n, skip);
          } else {
            PutVarint(tag, append);
            in_.Read(n, copy);
          }
          break;
        }
        case WireFormat::WIRETYPE_LENGTH_DELIMITED: {
          uint64_t n = 0;
          if (!in_.Varint(end, &n)) return Malformed("truncated length");
          if (n > end - in_.position()) {
            return Malformed("a length runs past the end of its message");
          }
          const FieldDescriptor* f = d->FindFieldByNumber(field);
          if (dropped) {
            in_.Read(n, skip);
          } else if (f != nullptr && f->type() == FieldDescriptor::TYPE_MESSAGE) {
            // Written in place, its length patched afterwards in as many bytes as the original
            // length took: a rewritten message is never longer than the original (extracting
            // saves more than its marker costs), so each byte is copied once, at any depth.
            PutVarint(tag, append);
            const size_t length_at = out->size();
            const size_t length_bytes = CodedOutputStream::VarintSize64(n);
            out->append(length_bytes, '\0');
            if (absl::Status s = Message(f->message_type(), n, depth + 1, out); !s.ok()) return s;
            const size_t written = out->size() - length_at - length_bytes;
            if (written > n) return absl::InternalError("a rewritten message grew");
            PutPaddedVarint(written, length_bytes, out->data() + length_at);
          } else if (is_tensor && field == kTensorDataField && n >= kMinExternalBytes) {
            Bytes bytes;
            bytes.size = n;
            in_.Read(n, [&](const std::shared_ptr<std::string>& chunk, size_t offset, size_t k) {
              bytes.pieces.push_back(Piece{chunk, offset, k});
            });
            request_->external_.push_back(std::move(bytes));
            PutVarint(tag, append);
            PutVarint(0, append);
            PutVarint(Tag(kMarkerField, WireFormat::WIRETYPE_VARINT), append);
            PutVarint(request_->external_.size(), append);
            extracted = true;
          } else {
            PutVarint(tag, append);
            PutVarint(n, append);
            in_.Read(n, copy);
            if (is_tensor && field == kTensorDataField && extracted) {
              // This inline data replaces the earlier one left in the chunks.
              PutVarint(Tag(kMarkerField, WireFormat::WIRETYPE_VARINT), append);
              PutVarint(0, append);
              extracted = false;
            }
          }
          break;
        }
        default:
          return Malformed("groups and invalid wire types are not part of gradserve.v1");
      }
    }
    if (in_.position() != end) return Malformed("a field runs past the end of its message");
    return absl::OkStatus();
  }

 private:
  absl::Status Malformed(const char* why) const {
    return MalformedRequest(request_->size_, /*streamed=*/true,
                            absl::StrCat(why, " at byte ", in_.position()));
  }

  ChunkedRequest* const request_;
  WireReader in_;
};

void ChunkedRequest::Append(std::string data) {
  size_ += static_cast<int64_t>(data.size());
  chunks_.push_back(std::make_shared<std::string>(std::move(data)));
}

absl::Status ChunkedRequest::Parse(v1::GradRequest* request) {
  external_.clear();
  std::string skeleton;
  Walker walker(this);
  if (absl::Status s =
          walker.Message(v1::GradRequest::descriptor(), static_cast<uint64_t>(size_), 0, &skeleton);
      !s.ok()) {
    return s;
  }
  if (!request->ParseFromString(skeleton)) return MalformedRequest(size_, /*streamed=*/true);
  return absl::OkStatus();
}

namespace {

// The marker's value in a Tensor: the last one (a later inline data field cancels an earlier
// marker with 0); 0 if none.
uint64_t MarkerOf(const v1::Tensor& tensor) {
  const google::protobuf::UnknownFieldSet& unknown =
      tensor.GetReflection()->GetUnknownFields(tensor);
  uint64_t index = 0;
  for (int i = 0; i < unknown.field_count(); ++i) {
    const google::protobuf::UnknownField& f = unknown.field(i);
    if (f.number() == kMarkerField && f.type() == google::protobuf::UnknownField::TYPE_VARINT) {
      index = f.varint();
    }
  }
  return index;
}

}  // namespace

const ChunkedRequest::Bytes* ChunkedRequest::Find(const v1::Tensor& tensor) const {
  if (tensor.contents_case() != v1::Tensor::kData || !tensor.data().empty()) return nullptr;
  const uint64_t index = MarkerOf(tensor);
  if (index == 0 || index > external_.size()) return nullptr;
  return &external_[index - 1];
}

void ChunkedRequest::Clear() {
  std::vector<Bytes>().swap(external_);
  for (std::shared_ptr<std::string>& chunk : chunks_) {
    // A chunk a tensor adopted stays with the tensor.
    if (chunk.use_count() == 1) chunking::BufferPool::Default().Give(std::move(*chunk));
  }
  Chunks().swap(chunks_);
  size_ = 0;
  memory_.Reset();
}

// --- ChunkedResponse ----------------------------------------------------------------------

namespace {

// Writes a serialized skeleton (from protobuf, so well formed) with each marker replaced by
// the data field of its tensor. Measure first (once), then Write.
class Splicer {
 public:
  Splicer(const std::string& skeleton, const std::vector<Tensor>& tensors)
      : chunks_{std::make_shared<std::string>(skeleton)}, in_(&chunks_), tensors_(tensors) {}

  // The expanded size of the message of type d in the rest of the skeleton.
  size_t Measure(const Descriptor* d) { return Walk(d, chunks_[0]->size(), nullptr); }

  // Writes it, with the sizes found by Measure.
  void Write(const Descriptor* d, ChunkWriter* out) {
    in_ = WireReader(&chunks_);
    next_size_ = 0;
    Walk(d, chunks_[0]->size(), out);
  }

 private:
  // Walks the fields up to end, writing them to out, or (out null) measuring them and
  // recording the sizes of sub-messages in sizes_, in the order Write needs them.
  size_t Walk(const Descriptor* d, uint64_t end, ChunkWriter* out) {
    const bool is_tensor = d == v1::Tensor::descriptor();
    size_t size = 0;
    auto put = [&](const char* p, size_t n) {
      size += n;
      if (out != nullptr) (*out)(p, n);
    };
    auto copy = [&](const std::shared_ptr<std::string>& chunk, size_t offset, size_t n) {
      put(chunk->data() + offset, n);
    };
    while (in_.position() < end) {
      uint64_t tag = 0;
      in_.Varint(end, &tag);
      const int field = static_cast<int>(tag >> 3);
      const auto type = static_cast<WireFormat::WireType>(tag & 7);
      switch (type) {
        case WireFormat::WIRETYPE_VARINT: {
          uint64_t v = 0;
          in_.Varint(end, &v);
          if (is_tensor && field == kMarkerField) {
            if (v == 0 || v > tensors_.size()) break;
            const Tensor& t = tensors_[v - 1];
            PutVarint(Tag(kTensorDataField, WireFormat::WIRETYPE_LENGTH_DELIMITED), put);
            PutVarint(t.nbytes(), put);
            put(static_cast<const char*>(t.raw_data()), t.nbytes());
          } else {
            PutVarint(tag, put);
            PutVarint(v, put);
          }
          break;
        }
        case WireFormat::WIRETYPE_FIXED64:
        case WireFormat::WIRETYPE_FIXED32:
          PutVarint(tag, put);
          in_.Read(type == WireFormat::WIRETYPE_FIXED64 ? 8 : 4, copy);
          break;
        case WireFormat::WIRETYPE_LENGTH_DELIMITED: {
          uint64_t n = 0;
          in_.Varint(end, &n);
          const FieldDescriptor* f = d->FindFieldByNumber(field);
          PutVarint(tag, put);
          if (f != nullptr && f->type() == FieldDescriptor::TYPE_MESSAGE) {
            const uint64_t sub_end = in_.position() + n;
            if (out == nullptr) {
              const size_t slot = sizes_.size();
              sizes_.push_back(0);
              sizes_[slot] = Walk(f->message_type(), sub_end, nullptr);
              size += CodedOutputStream::VarintSize64(sizes_[slot]) + sizes_[slot];
            } else {
              PutVarint(sizes_[next_size_++], put);
              size += Walk(f->message_type(), sub_end, out);
            }
          } else {
            PutVarint(n, put);
            in_.Read(n, copy);
          }
          break;
        }
        default:  // not produced by protobuf's serializer
          in_.Read(end - in_.position(),
                   [](const std::shared_ptr<std::string>&, size_t, size_t) {});
          break;
      }
    }
    return size;
  }

  const Chunks chunks_;
  WireReader in_;
  const std::vector<Tensor>& tensors_;
  std::vector<size_t> sizes_;  // of sub-messages, in pre-order
  size_t next_size_ = 0;
};

}  // namespace

void ChunkedResponse::Defer(Tensor host, v1::Tensor* out) {
  tensors_.push_back(std::move(host));
  out->GetReflection()->MutableUnknownFields(out)->AddVarint(kMarkerField, tensors_.size());
}

size_t ChunkedResponse::SerializedSize(const v1::GradResponse& response) const {
  if (tensors_.empty()) return response.ByteSizeLong();
  Splicer splicer(response.SerializeAsString(), tensors_);
  return splicer.Measure(v1::GradResponse::descriptor());
}

bool ChunkedResponse::Serialize(const v1::GradResponse& response, int64_t chunk_bytes,
                                std::vector<std::string>* chunks) const {
  chunks->clear();
  Splicer splicer(response.SerializeAsString(), tensors_);
  const size_t total = splicer.Measure(v1::GradResponse::descriptor());
  if (total > static_cast<size_t>(std::numeric_limits<int>::max())) return false;
  const size_t chunk =
      static_cast<size_t>(std::clamp<int64_t>(chunk_bytes, 1, std::numeric_limits<int>::max()));
  ChunkWriter writer(chunks, chunk, total);
  splicer.Write(v1::GradResponse::descriptor(), &writer);
  if (chunks->empty()) chunks->emplace_back();
  return true;
}

}  // namespace gradserve::server
