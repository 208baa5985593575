#include "server/wire/chunked_request.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/util/repeat_bytes.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/unknown_field_set.h"
#include "google/protobuf/wire_format_lite.h"
#include "proto/chunking.h"
#include "proto/wire_format.h"
#include "server/wire/malformed_request.h"

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

// Removes a client's own markers from t (Note [Unary tensor bytes taken]).
void DropMarkers(v1::Tensor* t) {
  google::protobuf::UnknownFieldSet* unknown = t->GetReflection()->MutableUnknownFields(t);
  if (!unknown->empty()) unknown->DeleteByNumber(kMarkerField);
}

}  // namespace

int ChunkedRequest::TakeFrom(v1::GradRequest* request) {
  external_.clear();
  int taken = 0;
  auto take = [&](v1::Tensor* t) {
    DropMarkers(t);
    if (t->contents_case() != v1::Tensor::kData || t->data().size() < kMinExternalBytes) return;
    auto chunk = std::make_shared<std::string>();
    chunk->swap(*t->mutable_data());
    const size_t n = chunk->size();
    size_ += static_cast<int64_t>(n);
    chunks_.push_back(chunk);
    external_.push_back(Bytes{{Piece{std::move(chunk), 0, n}}, n});
    t->GetReflection()->MutableUnknownFields(t)->AddVarint(kMarkerField, external_.size());
    ++taken;
  };
  // The graph's leaves and those of checkpoint bodies, at any depth (bounded by the parse).
  std::vector<v1::Graph*> graphs;
  if (request->has_graph()) graphs.push_back(request->mutable_graph());
  while (!graphs.empty()) {
    v1::Graph* g = graphs.back();
    graphs.pop_back();
    for (v1::Leaf& leaf : *g->mutable_leaves()) {
      if (leaf.has_value()) take(leaf.mutable_value());
    }
    for (v1::Op& op : *g->mutable_ops()) {
      if (op.has_body()) graphs.push_back(op.mutable_body());
    }
  }
  for (v1::BackwardCall& call : *request->mutable_calls()) {
    for (auto& [root, seed] : *call.mutable_seeds()) take(&seed);
  }
  return taken;
}

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

// Writes into gRPC slices: the bytes around the deferred tensors copied into slices of their
// own, each tensor's bytes a slice over its memory that owns a reference to it.
class SliceWriter {
 public:
  explicit SliceWriter(std::vector<grpc::Slice>* slices) : slices_(slices) {}
  ~SliceWriter() { Flush(); }

  void Bytes(const char* data, size_t n) { pending_.append(data, n); }

  void TensorBytes(const Tensor& t) {
    if (t.nbytes() == 0) return;
    Flush();
    if (t.repeats_one_value()) {
      RepeatedBytes(t);
      return;
    }
    auto* owner = new Tensor(t);
    slices_->emplace_back(owner->raw_data(), owner->nbytes(), &Release, owner);
  }

 private:
  static void Release(void* owner) { delete static_cast<Tensor*>(owner); }
  static void ReleaseBlock(void* owner) {
    delete static_cast<std::shared_ptr<std::string>*>(owner);
  }

  // t's bytes as slices over one block of its value repeated, each slice holding the block.
  void RepeatedBytes(const Tensor& t) {
    const size_t total = t.nbytes();
    auto block = std::make_shared<std::string>(ChunkedResponse::RepeatedBlockBytes(total), '\0');
    RepeatBytes(block->data(), block->size(), t.raw_data(), ElementSize(t.dtype()));
    for (size_t at = 0; at < total; at += block->size()) {
      auto* owner = new std::shared_ptr<std::string>(block);
      slices_->emplace_back(block->data(), std::min(block->size(), total - at), &ReleaseBlock,
                            owner);
    }
  }

  void Flush() {
    if (pending_.empty()) return;
    slices_->emplace_back(pending_);
    pending_.clear();
  }

  std::vector<grpc::Slice>* const slices_;
  std::string pending_;
};

// Writes a serialized skeleton (from protobuf, so well formed) with each marker replaced by
// the data field of its tensor. Measure first (once), then Write.
class Splicer {
 public:
  Splicer(const std::string& skeleton, const std::vector<Tensor>& tensors)
      : chunks_{std::make_shared<std::string>(skeleton)}, in_(&chunks_), tensors_(tensors) {}

  // The expanded size of the message of type d in the rest of the skeleton.
  size_t Measure(const Descriptor* d) { return Walk(d, chunks_[0]->size(), nullptr); }

  // Writes it, with the sizes found by Measure.
  void Write(const Descriptor* d, SliceWriter* out) {
    in_ = WireReader(&chunks_);
    next_size_ = 0;
    Walk(d, chunks_[0]->size(), out);
  }

 private:
  // Walks the fields up to end, writing them to out, or (out null) measuring them and
  // recording the sizes of sub-messages in sizes_, in the order Write needs them.
  size_t Walk(const Descriptor* d, uint64_t end, SliceWriter* out) {
    const bool is_tensor = d == v1::Tensor::descriptor();
    size_t size = 0;
    auto put = [&](const char* p, size_t n) {
      size += n;
      if (out != nullptr) out->Bytes(p, n);
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
            size += t.nbytes();
            if (out != nullptr) out->TensorBytes(t);
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

size_t ChunkedResponse::DeferredBytes() const {
  size_t bytes = 0;
  for (const Tensor& tensor : tensors_) bytes += tensor.nbytes();
  return bytes;
}

size_t ChunkedResponse::SerializedSize(const v1::GradResponse& response) const {
  if (tensors_.empty()) return response.ByteSizeLong();
  Splicer splicer(response.SerializeAsString(), tensors_);
  return splicer.Measure(v1::GradResponse::descriptor());
}

bool ChunkedResponse::SerializeToSlices(const v1::GradResponse& response,
                                        std::vector<grpc::Slice>* slices) const {
  slices->clear();
  Splicer splicer(response.SerializeAsString(), tensors_);
  const size_t total = splicer.Measure(v1::GradResponse::descriptor());
  if (total > static_cast<size_t>(std::numeric_limits<int>::max())) return false;
  {
    SliceWriter writer(slices);
    splicer.Write(v1::GradResponse::descriptor(), &writer);
  }
  return true;
}

}  // namespace gradserve::server
