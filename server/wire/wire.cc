#include "server/wire/wire.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "engine/device/device.h"
#include "engine/device/device_registry.h"
#include "engine/tensor/shape.h"
#include "engine/util/parallel.h"
#include "engine/util/quote.h"
#include "engine/util/status_error.h"
#include "server/shared_memory/region.h"

namespace gradserve::server {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the wire format is little-endian; this host would need byte swapping");

// What a wire tensor will become, known without allocating it.
struct TensorPlan {
  DType dtype = DType::kFloat32;
  Shape shape;
  int64_t numel = 0;
  int64_t nbytes = 0;
  Device device = kCPU;
  // For contents in shared memory: the region (held by the request's RequestRegions) and the
  // offset of the bytes in it.
  const SharedMemoryRegion* region = nullptr;
  int64_t offset = 0;
};

// INVALID_ARGUMENT naming the first byte of n at p that is neither 0 nor 1 (bool data); `first`
// is the index of p[0] in the whole tensor.
std::optional<absl::Status> CheckBools(const char* p, size_t n, size_t first,
                                       absl::FunctionRef<std::string()> what) {
  for (size_t k = 0; k < n; ++k) {
    const auto byte = static_cast<unsigned char>(p[k]);
    if (byte > 1) {
      return absl::InvalidArgumentError(absl::StrCat(what(), ": byte ", first + k,
                                                     " of bool data is ", static_cast<int>(byte),
                                                     "; bools are 0 or 1"));
    }
  }
  return std::nullopt;
}

// The raw bytes of a tensor whose contents are `data`: inline in the message, or left in the
// received chunks of a streamed request (Note [Tensor bytes left in the chunks]).
class DataView {
 public:
  DataView(const v1::Tensor& t, const ChunkedRequest* chunked)
      : inline_(t.data()), external_(chunked != nullptr ? chunked->Find(t) : nullptr) {}

  size_t size() const { return external_ != nullptr ? external_->size : inline_.size(); }
  const ChunkedRequest::Bytes* external() const { return external_; }

  // Calls f(const char* data, size_t n) for each run of the bytes, in order.
  template <typename F>
  void ForEachPiece(F f) const {
    if (external_ == nullptr) {
      f(inline_.data(), inline_.size());
      return;
    }
    for (const ChunkedRequest::Piece& piece : external_->pieces) f(piece.data(), piece.size);
  }

  // Copies the bytes, size() of them, to out: bytes left in several chunks are shared out over
  // the intra-op threads when there are enough of them (Note [Gathered bytes split over
  // threads]).
  void CopyTo(char* out) const;

 private:
  const std::string& inline_;
  const ChunkedRequest::Bytes* const external_;
};

// Note [Gathered bytes split over threads]
// A streamed request's big tensor arrives in chunks of the client's size (1 to 4 MiB from
// gradserve's clients), so its bytes are gathered into the tensor with one copy (Note [Tensor bytes
// left in the chunks]): 64 MiB for grad_64mb, on the worker alone while the server's other CPUs,
// done with the upload, idle. A tensor of kParallelMinUnits bytes or more is therefore copied
// with ParallelBlocks, as the graph's own long loops are (Note [Intra-op parallelism]): each
// chunk of the byte range finds its first piece by binary search and copies to the end of its
// range. The bytes land where the serial copy puts them; only the threads differ.
void DataView::CopyTo(char* out) const {
  if (external_ == nullptr || static_cast<int64_t>(external_->size) < kParallelMinUnits) {
    ForEachPiece([&](const char* p, size_t n) {
      if (n > 0) std::memcpy(out, p, n);
      out += n;
    });
    return;
  }
  const std::vector<ChunkedRequest::Piece>& pieces = external_->pieces;
  std::vector<size_t> starts;  // each piece's offset in the tensor's bytes
  starts.reserve(pieces.size());
  size_t at = 0;
  for (const ChunkedRequest::Piece& piece : pieces) {
    starts.push_back(at);
    at += piece.size;
  }
  ParallelBlocks(static_cast<int64_t>(at), [&](int64_t, int64_t begin, int64_t end) {
    auto pos = static_cast<size_t>(begin);
    const auto stop = static_cast<size_t>(end);
    // The last piece starting at or before pos (empty pieces are stepped over below).
    size_t i = static_cast<size_t>(absl::c_upper_bound(starts, pos) - starts.begin()) - 1;
    for (; pos < stop; ++i) {
      const ChunkedRequest::Piece& piece = pieces[i];
      const size_t from = pos - starts[i];
      const size_t n = std::min(piece.size - from, stop - pos);
      if (n > 0) std::memcpy(out + pos, piece.data() + from, n);
      pos += n;
    }
  });
}

// "op #3 'mul' (output 'h')", the client's strings quoted (Note [Quoting client strings]).
std::string DescribeOp(const v1::Op& op, int index) {
  return absl::StrCat(
      "op #", index, " ", Quote(op.op()),
      op.outputs_size() > 0 ? absl::StrCat(" (output ", Quote(op.outputs(0)), ")") : std::string());
}

// INVALID_ARGUMENT if s, a string of the client's, is longer than max_name_bytes; what(),
// called only then, says what it is ("leaf #0 name"). Note [Quoting client strings].
absl::Status CheckString(const std::string& s, const graph::Limits& limits,
                         absl::FunctionRef<std::string()> what) {
  if (static_cast<int64_t>(s.size()) <= limits.max_name_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what(), " ", Quote(s), " is longer than the limit of ", limits.max_name_bytes,
                   " bytes (--max_name_bytes)"));
}

// Whether every one of strings is within max_bytes: the common case, checked in one pass
// that builds no description and no status (Note [String checks in one pass]).
bool AllFit(const google::protobuf::RepeatedPtrField<std::string>& strings, int64_t max_bytes) {
  for (const std::string& s : strings) {
    if (static_cast<int64_t>(s.size()) > max_bytes) return false;
  }
  return true;
}

// CheckString on each of strings, the i-th described as "<what> #i".
absl::Status CheckStrings(const google::protobuf::RepeatedPtrField<std::string>& strings,
                          const graph::Limits& limits, absl::FunctionRef<std::string()> what) {
  if (AllFit(strings, limits.max_name_bytes)) [[likely]] {
    return absl::OkStatus();
  }
  for (int i = 0; i < strings.size(); ++i) {
    if (absl::Status s =
            CheckString(strings[i], limits, [&] { return absl::StrCat(what(), " #", i); });
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

// Note [Attributes in a deterministic order]
// An op's attributes, a call's seeds and its gradient destinations are protobuf maps, whose
// iteration order changes from one parse to the next. Checking them in that order would make a
// request with two bad entries name either one, so the same bytes could get two different
// errors (the request fuzzer found it for attributes, then for seeds). Each check runs in map
// order, which costs a good request nothing, and on an error runs again in the order of the
// keys, whose first error is the one returned.
template <typename V>
absl::Status CheckInKeyOrder(const google::protobuf::Map<std::string, V>& map,
                             absl::FunctionRef<absl::Status(const std::string&, const V&)> check) {
  for (const auto& entry : map) {
    if (absl::Status s = check(entry.first, entry.second); !s.ok()) {
      std::vector<const std::string*> keys;
      keys.reserve(map.size());
      for (const auto& e : map) keys.push_back(&e.first);
      std::sort(keys.begin(), keys.end(),
                [](const std::string* a, const std::string* b) { return *a < *b; });
      for (const std::string* key : keys) {
        if (absl::Status first = check(*key, map.at(*key)); !first.ok()) return first;
      }
      return s;
    }
  }
  return absl::OkStatus();
}

// Note [String checks in one pass]
// Every string of a request is checked against --max_name_bytes before anything is built
// (Note [Validate before allocating]), and an error names the string: "op #3 'mul' (output
// 'h'): input #1 '...' is longer than ...". The checks that can fail call a function per
// string, each passed a way to describe it and each returning a status; for the fifty or so
// strings of a ten-op graph that came to about 3% of a small request's server instructions.
// So each op's strings, and each list of strings, are first checked in one plain pass (AllFit,
// and ForEachOpString with a check that only compares sizes), and only a request with a string
// too long takes the path that finds the first one and describes it. The errors are the same:
// the slow path runs the same checks in the same order, over the same list of strings.

// Calls check(s, what) on each string of op, the op's name, inputs and outputs, then each
// attribute's name and string values (attributes in key order on an error, Note [Attributes
// in a deterministic order]), and returns the first error. what() describes s ("op #3 'mul'
// (output 'h'): input #1"); check calls it only for a string it refuses. The one list of an
// op's strings, walked by both passes of Note [String checks in one pass].
template <typename Check>
absl::Status ForEachOpString(const v1::Op& op, int index, const std::string& scope, Check&& check) {
  auto where = [&] { return absl::StrCat(scope, "op #", index); };
  auto described = [&] { return absl::StrCat(scope, DescribeOp(op, index)); };
  auto each = [&](const google::protobuf::RepeatedPtrField<std::string>& strings,
                  auto what) -> absl::Status {
    int i = 0;  // counted beside a range-for: RepeatedPtrField's indexing is out of line
    for (const std::string& string : strings) {
      if (absl::Status s = check(string, [&] { return absl::StrCat(what(), " #", i); }); !s.ok()) {
        return s;
      }
      ++i;
    }
    return absl::OkStatus();
  };
  if (absl::Status s = check(op.op(), [&] { return absl::StrCat(where(), ": name"); }); !s.ok()) {
    return s;
  }
  if (absl::Status s = each(op.inputs(), [&] { return absl::StrCat(described(), ": input"); });
      !s.ok()) {
    return s;
  }
  if (absl::Status s = each(op.outputs(), [&] { return absl::StrCat(where(), ": output"); });
      !s.ok()) {
    return s;
  }
  if (op.attrs().empty()) return absl::OkStatus();
  return CheckInKeyOrder<v1::AttrValue>(op.attrs(), [&](const std::string& name,
                                                        const v1::AttrValue& value) {
    if (absl::Status s = check(name, [&] { return absl::StrCat(described(), ": attribute name"); });
        !s.ok()) {
      return s;
    }
    auto what = [&] { return absl::StrCat(described(), ": attribute ", Quote(name), ": string"); };
    return value.value_case() == v1::AttrValue::kS ? check(value.s(), what)
                                                   : each(value.strings().values(), what);
  });
}

// The strings of one op: its name, inputs, outputs, attribute names and string values.
absl::Status CheckOpStrings(const v1::Op& op, int index, const graph::Limits& limits,
                            const std::string& scope) {
  // The plain pass: sizes only, nothing described (its error is never seen).
  auto fits = [max_bytes = limits.max_name_bytes](const std::string& s, auto&&) {
    return static_cast<int64_t>(s.size()) <= max_bytes ? absl::OkStatus()
                                                       : absl::InvalidArgumentError("");
  };
  if (ForEachOpString(op, index, scope, fits).ok()) [[likely]] {
    return absl::OkStatus();
  }
  return ForEachOpString(op, index, scope, [&](const std::string& s, auto what) {
    return CheckString(s, limits, what);
  });
}

// The region range names, with [range.offset(), + size) checked to lie within it (Note
// [Shared-memory regions]); `what` names the tensor or destination, `field` the range's region
// field, in errors. The region is held by sources.regions for the request's life. The
// description is built once even for a good range: a range holds megabytes, beside which it
// is nothing.
absl::StatusOr<const SharedMemoryRegion*> FindRange(const v1::SharedMemoryRange& range,
                                                    int64_t size, const graph::Limits& limits,
                                                    const TensorSources& sources,
                                                    absl::FunctionRef<std::string()> what,
                                                    const char* field) {
  if (absl::Status s =
          CheckString(range.region(), limits, [&] { return absl::StrCat(what(), ": ", field); });
      !s.ok()) {
    return s;
  }
  const std::string described = what();
  if (sources.regions == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(described, ": shared memory cannot be used by this call"));
  }
  absl::StatusOr<const SharedMemoryRegion*> region =
      sources.regions->Find(range.region(), described);
  if (!region.ok()) return region.status();
  if (absl::Status s = (*region)->CheckRange(range.offset(), size, described); !s.ok()) return s;
  return region;
}

// Checks everything about a wire tensor that can be checked before allocating it. `what` names
// it in errors ("leaf 'x'"); it is called only to write an error, so a good request builds no
// descriptions (but one per shared-memory range, FindRange).
absl::StatusOr<TensorPlan> PlanTensor(const v1::Tensor& t, const graph::Limits& limits,
                                      const TensorSources& sources,
                                      absl::FunctionRef<std::string()> what) {
  TensorPlan plan;
  std::optional<DType> dtype = FromProto(t.dtype());
  if (!dtype) {
    const std::string& enum_name = v1::DType_Name(t.dtype());
    return absl::InvalidArgumentError(
        absl::StrCat(what(), ": dtype ",
                     enum_name.empty() ? absl::StrCat(static_cast<int>(t.dtype())) : enum_name,
                     " is not one of DTYPE_FLOAT32, DTYPE_FLOAT64, DTYPE_FLOAT16, DTYPE_BFLOAT16, "
                     "DTYPE_INT64, DTYPE_BOOL"));
  }
  plan.dtype = *dtype;
  plan.shape.assign(t.shape().begin(), t.shape().end());
  absl::StatusOr<int64_t> numel = CheckedNumel(plan.shape);
  if (!numel.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what(), ": ", numel.status().message()));
  }
  plan.numel = *numel;
  if (plan.numel > limits.max_tensor_elements) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what(), ": shape ", ShapeToString(plan.shape), " has ", plan.numel,
                     " elements, over the limit of ", limits.max_tensor_elements,
                     " elements per tensor (--max_tensor_elements)"));
  }
  if (__builtin_mul_overflow(plan.numel, static_cast<int64_t>(ElementSize(plan.dtype)),
                             &plan.nbytes)) {
    return absl::ResourceExhaustedError(absl::StrCat(what(), ": shape ", ShapeToString(plan.shape),
                                                     " needs more bytes than fit in int64"));
  }

  const char* dtype_name = DTypeName(plan.dtype);
  switch (t.contents_case()) {
    case v1::Tensor::kData: {
      const DataView data(t, sources.chunked);
      if (static_cast<int64_t>(data.size()) != plan.nbytes) {
        return absl::InvalidArgumentError(
            absl::StrCat(what(), ": data has ", data.size(), " bytes but ", dtype_name,
                         ShapeToString(plan.shape), " needs ", plan.nbytes, " (", plan.numel,
                         " elements of ", ElementSize(plan.dtype), " bytes)"));
      }
      if (plan.dtype == DType::kBool) {
        size_t i = 0;
        std::optional<absl::Status> bad;
        data.ForEachPiece([&](const char* p, size_t n) {
          if (!bad) bad = CheckBools(p, n, i, what);
          i += n;
        });
        if (bad) return *bad;
      }
      break;
    }
    case v1::Tensor::kValues: {
      const v1::TensorValues& v = t.values();
      int64_t given = 0;
      const char* list = "";
      int64_t others = 0;
      if (IsFloating(plan.dtype)) {
        given = v.doubles_size();
        list = "doubles";
        others = v.ints_size() + v.bools_size();
      } else if (plan.dtype == DType::kInt64) {
        given = v.ints_size();
        list = "ints";
        others = v.doubles_size() + v.bools_size();
      } else {
        given = v.bools_size();
        list = "bools";
        others = v.doubles_size() + v.ints_size();
      }
      if (others != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            what(), ": a ", dtype_name, " tensor takes its values in 'values.", list, "' only"));
      }
      if (given != plan.numel) {
        return absl::InvalidArgumentError(
            absl::StrCat(what(), ": values.", list, " has ", given, " values but shape ",
                         ShapeToString(plan.shape), " needs ", plan.numel));
      }
      break;
    }
    case v1::Tensor::kSharedMemory: {
      // Note [Shared-memory regions] in server/shared_memory/registry.h.
      const v1::SharedMemoryRange& range = t.shared_memory();
      if (range.byte_size() != 0 && range.byte_size() != plan.nbytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            what(), ": shared_memory.byte_size is ", range.byte_size(), " but ", dtype_name,
            ShapeToString(plan.shape), " needs ", plan.nbytes, " (or give 0)"));
      }
      absl::StatusOr<const SharedMemoryRegion*> region =
          FindRange(range, plan.nbytes, limits, sources, what, "shared_memory.region");
      if (!region.ok()) return region.status();
      plan.region = *region;
      plan.offset = range.offset();
      break;
    }
    case v1::Tensor::CONTENTS_NOT_SET:
      if (plan.numel != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(what(),
                         ": no contents; set 'data' (raw little-endian bytes), 'values' or "
                         "'shared_memory'"));
      }
      break;
  }

  if (!t.device().empty()) {
    if (absl::Status s =
            CheckString(t.device(), limits, [&] { return absl::StrCat(what(), ": device"); });
        !s.ok()) {
      return s;
    }
    absl::StatusOr<Device> device = ParseDevice(t.device());
    if (!device.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(what(), ": ", device.status().message()));
    }
    if (absl::Status s = DeviceRegistry::Get().Validate(*device); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(what(), ": ", s.message()));
    }
    plan.device = *device;
  }
  return plan;
}

// Allocates and fills the tensor a plan (from PlanTensor on t) describes. Bytes left in one
// received chunk are adopted there (Note [Adopted storage]); others are copied. Throws
// StatusError when out of memory, when the device copy fails, or when the bytes in shared
// memory cannot be read or are not bools where they must be (`what` names the tensor then).
Tensor MakeTensor(const v1::Tensor& t, const TensorPlan& plan, const TensorSources& sources,
                  absl::FunctionRef<std::string()> what) {
  const DataView data(t, sources.chunked);
  if (t.contents_case() == v1::Tensor::kData && data.external() != nullptr &&
      data.external()->pieces.size() == 1) {
    const ChunkedRequest::Piece& piece = data.external()->pieces.front();
    Tensor host = Tensor::FromExternal(plan.shape, plan.dtype, piece.data(), piece.chunk);
    return plan.device == kCPU ? host : host.To(plan.device);
  }
  Tensor host = Tensor::Empty(plan.shape, plan.dtype, kCPU);
  if (t.contents_case() == v1::Tensor::kData) {
    data.CopyTo(static_cast<char*>(host.raw_data()));
  } else if (t.contents_case() == v1::Tensor::kSharedMemory) {
    if (absl::Status s = plan.region->Read(plan.offset, plan.nbytes, host.raw_data(), what());
        !s.ok()) {
      throw StatusError(std::move(s));
    }
    if (plan.dtype == DType::kBool) {
      if (std::optional<absl::Status> bad =
              CheckBools(static_cast<const char*>(host.raw_data()), plan.nbytes, 0, what)) {
        throw StatusError(*std::move(bad));
      }
    }
  } else if (t.contents_case() == v1::Tensor::kValues) {
    const v1::TensorValues& v = t.values();
    DispatchStorage(plan.dtype, [&](auto tag) {
      using T = decltype(tag);
      T* out = host.data<T>();
      for (int64_t i = 0; i < plan.numel; ++i) {
        if constexpr (std::is_same_v<T, bool>) {
          out[i] = v.bools(i);
        } else if constexpr (std::is_same_v<T, int64_t>) {
          out[i] = v.ints(i);
        } else {
          out[i] = static_cast<T>(v.doubles(i));
        }
      }
    });
  }
  return plan.device == kCPU ? host : host.To(plan.device);
}

// Pass one of Note [Validate before allocating]: counts and tensor plans, no allocation.
class Census {
 public:
  Census(const graph::Limits& limits, const TensorSources& sources)
      : limits_(limits), sources_(sources) {}

  // strings_known: g has the structure of a graph this census passed under the same limits
  // (FromProto's same_structure, which SameStructure compared string for string), so its
  // names and its ops' strings are not checked again; its leaves' values are counted as ever.
  absl::Status CountGraph(const v1::Graph& g, int64_t depth, const std::string& scope,
                          bool strings_known = false) {
    if (depth > limits_.max_nesting) {
      return absl::ResourceExhaustedError(
          absl::StrCat(scope, "checkpoint bodies nest deeper than the limit of ",
                       limits_.max_nesting, " (--max_nesting)"));
    }
    leaves_ += g.leaves_size();
    if (leaves_ > limits_.max_leaves) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the graph has more than ", limits_.max_leaves, " leaves (--max_leaves)"));
    }
    ops_ += g.ops_size();
    if (ops_ > limits_.max_ops) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the graph has more than ", limits_.max_ops, " ops (--max_ops)"));
    }
    const char* graph_kind = depth == 0 ? "graph" : "body";
    if (!strings_known) {
      if (absl::Status s = CheckStrings(g.inputs(), limits_,
                                        [&] { return absl::StrCat(scope, graph_kind, " input"); });
          !s.ok()) {
        return s;
      }
      if (absl::Status s = CheckStrings(g.outputs(), limits_,
                                        [&] { return absl::StrCat(scope, graph_kind, " output"); });
          !s.ok()) {
        return s;
      }
    }
    for (int i = 0; i < g.leaves_size(); ++i) {
      const v1::Leaf& leaf = g.leaves(i);
      if (!strings_known) {
        if (absl::Status s = CheckString(
                leaf.name(), limits_, [&] { return absl::StrCat(scope, "leaf #", i, ": name"); });
            !s.ok()) {
          return s;
        }
      }
      if (absl::Status s = CountTensor(
              leaf.value(), [&] { return absl::StrCat(scope, "leaf ", Quote(leaf.name())); });
          !s.ok()) {
        return s;
      }
    }
    for (int i = 0; i < g.ops_size(); ++i) {
      const v1::Op& op = g.ops(i);
      if (!strings_known) {
        if (absl::Status s = CheckOpStrings(op, i, limits_, scope); !s.ok()) return s;
      }
      if (!op.has_body()) continue;
      if (absl::Status s =
              CountGraph(op.body(), depth + 1,
                         absl::StrCat(scope, "in the body of ", DescribeOp(op, i), ": "));
          !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  }

  absl::Status CountTensor(const v1::Tensor& t, absl::FunctionRef<std::string()> what) {
    absl::StatusOr<TensorPlan> plan = PlanTensor(t, limits_, sources_, what);
    if (!plan.ok()) return plan.status();
    if (__builtin_add_overflow(bytes_, plan->nbytes, &bytes_) ||
        bytes_ > limits_.max_memory_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat(what(), ": the request's tensors need more than the limit of ",
                       limits_.max_memory_bytes, " bytes per request (--max_memory_bytes)"));
    }
    return absl::OkStatus();
  }

 private:
  const graph::Limits& limits_;
  const TensorSources& sources_;
  int64_t leaves_ = 0;
  int64_t ops_ = 0;
  int64_t bytes_ = 0;
};

std::string DescribeSeed(int call, const std::string& root) {
  return absl::StrCat("call #", call, ": seed for root ", Quote(root));
}

// The strings of a backward call and the names of its seeds; the seeds' tensors are the
// census's.
absl::Status CheckCallStrings(const v1::BackwardCall& call, int index,
                              const graph::Limits& limits) {
  if (absl::Status s = CheckStrings(call.roots(), limits,
                                    [&] { return absl::StrCat("call #", index, ": root"); });
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckStrings(call.inputs(), limits,
                                    [&] { return absl::StrCat("call #", index, ": input"); });
      !s.ok()) {
    return s;
  }
  return CheckInKeyOrder<v1::Tensor>(call.seeds(), [&](const std::string& root, const v1::Tensor&) {
    return CheckString(root, limits,
                       [&] { return absl::StrCat("call #", index, ": the seed's root name"); });
  });
}

absl::StatusOr<ops::AttrValue> FromProto(const v1::AttrValue& v,
                                         absl::FunctionRef<std::string()> what) {
  switch (v.value_case()) {
    case v1::AttrValue::kI:
      return ops::AttrValue(v.i());
    case v1::AttrValue::kF:
      return ops::AttrValue(v.f());
    case v1::AttrValue::kB:
      return ops::AttrValue(v.b());
    case v1::AttrValue::kS:
      return ops::AttrValue(v.s());
    case v1::AttrValue::kInts:
      return ops::AttrValue(
          std::vector<int64_t>(v.ints().values().begin(), v.ints().values().end()));
    case v1::AttrValue::kFloats:
      return ops::AttrValue(
          std::vector<double>(v.floats().values().begin(), v.floats().values().end()));
    case v1::AttrValue::kStrings:
      return ops::AttrValue(
          std::vector<std::string>(v.strings().values().begin(), v.strings().values().end()));
    case v1::AttrValue::VALUE_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what(), " has no value; set one of i, f, b, s, ints, floats, strings"));
}

// A leaf's value, made from the wire: pass two, as BuildGraph below.
absl::StatusOr<Tensor> LeafValue(const v1::Leaf& leaf, const graph::Limits& limits,
                                 const TensorSources& sources, const std::string& scope) {
  auto what = [&] { return absl::StrCat(scope, "leaf ", Quote(leaf.name())); };
  absl::StatusOr<TensorPlan> plan = PlanTensor(leaf.value(), limits, sources, what);
  if (!plan.ok()) return plan.status();
  return MakeTensor(leaf.value(), *plan, sources, what);
}

// Pass two: allocation. Only called once the census passed. Throws StatusError when an
// allocation fails.
absl::StatusOr<graph::Graph> BuildGraph(const v1::Graph& g, const graph::Limits& limits,
                                        const TensorSources& sources, const std::string& scope) {
  graph::Graph out;
  out.inputs.assign(g.inputs().begin(), g.inputs().end());
  out.outputs.assign(g.outputs().begin(), g.outputs().end());
  out.leaves.reserve(g.leaves_size());
  for (const v1::Leaf& leaf : g.leaves()) {
    absl::StatusOr<Tensor> value = LeafValue(leaf, limits, sources, scope);
    if (!value.ok()) return value.status();
    out.leaves.push_back(graph::Leaf{leaf.name(), *std::move(value), leaf.requires_grad()});
  }
  out.ops.reserve(g.ops_size());
  for (int i = 0; i < g.ops_size(); ++i) {
    const v1::Op& op = g.ops(i);
    graph::Op& dst = out.ops.emplace_back();
    dst.op = op.op();
    dst.inputs.assign(op.inputs().begin(), op.inputs().end());
    dst.outputs.assign(op.outputs().begin(), op.outputs().end());
    dst.no_grad = op.no_grad();
    // Note [Attributes in a deterministic order]
    if (absl::Status s = CheckInKeyOrder<v1::AttrValue>(
            op.attrs(),
            [&](const std::string& name, const v1::AttrValue& value) -> absl::Status {
              absl::StatusOr<ops::AttrValue> attr = FromProto(value, [&] {
                return absl::StrCat(scope, DescribeOp(op, i), ": attribute ", Quote(name));
              });
              if (!attr.ok()) return attr.status();
              dst.attrs.set(name, *std::move(attr));
              return absl::OkStatus();
            });
        !s.ok()) {
      return s;
    }
    if (op.has_body()) {
      absl::StatusOr<graph::Graph> body =
          BuildGraph(op.body(), limits, sources,
                     absl::StrCat(scope, "in the body of ", DescribeOp(op, i), ": "));
      if (!body.ok()) return body.status();
      dst.body = std::make_shared<const graph::Graph>(*std::move(body));
    }
  }
  return out;
}

// Doubles compare by their bits, so that -0 and 0 differ and a NaN equals itself.
bool SameBits(double a, double b) {
  return std::bit_cast<uint64_t>(a) == std::bit_cast<uint64_t>(b);
}

// Whether FromProto(wire) would be built's value.
bool SameAttr(const v1::AttrValue& wire, const ops::AttrValue& built) {
  switch (wire.value_case()) {
    case v1::AttrValue::kI:
      return std::holds_alternative<int64_t>(built) && std::get<int64_t>(built) == wire.i();
    case v1::AttrValue::kF:
      return std::holds_alternative<double>(built) && SameBits(std::get<double>(built), wire.f());
    case v1::AttrValue::kB:
      return std::holds_alternative<bool>(built) && std::get<bool>(built) == wire.b();
    case v1::AttrValue::kS:
      return std::holds_alternative<std::string>(built) && std::get<std::string>(built) == wire.s();
    case v1::AttrValue::kInts:
      return std::holds_alternative<std::vector<int64_t>>(built) &&
             absl::c_equal(wire.ints().values(), std::get<std::vector<int64_t>>(built));
    case v1::AttrValue::kFloats:
      return std::holds_alternative<std::vector<double>>(built) &&
             absl::c_equal(wire.floats().values(), std::get<std::vector<double>>(built), SameBits);
    case v1::AttrValue::kStrings:
      return std::holds_alternative<std::vector<std::string>>(built) &&
             absl::c_equal(wire.strings().values(), std::get<std::vector<std::string>>(built));
    case v1::AttrValue::VALUE_NOT_SET:
      break;
  }
  return false;
}

bool SameOp(const v1::Op& wire, const graph::Op& built) {
  if (wire.op() != built.op || wire.no_grad() != built.no_grad ||
      !absl::c_equal(wire.inputs(), built.inputs) ||
      !absl::c_equal(wire.outputs(), built.outputs) || wire.has_body() != (built.body != nullptr) ||
      static_cast<size_t>(wire.attrs_size()) != built.attrs.values().size()) {
    return false;
  }
  for (const auto& [name, value] : wire.attrs()) {
    auto it = built.attrs.values().find(name);
    if (it == built.attrs.values().end() || !SameAttr(value, it->second)) return false;
  }
  return !wire.has_body() || SameStructure(wire.body(), *built.body);
}

absl::StatusOr<graph::BackwardCall> BuildCall(const v1::BackwardCall& call, int index,
                                              const graph::Limits& limits,
                                              const TensorSources& sources) {
  graph::BackwardCall out;
  out.roots.assign(call.roots().begin(), call.roots().end());
  out.inputs.assign(call.inputs().begin(), call.inputs().end());
  out.accumulate_grad = call.accumulate_grad();
  out.retain_graph = call.retain_graph();
  out.create_graph = call.create_graph();
  out.allow_unused = call.allow_unused();
  out.materialize_grads = call.materialize_grads();
  out.anomaly_mode = call.detect_anomaly();
  if (call.seeds().empty()) return out;
  out.seeds.resize(out.roots.size());
  for (size_t r = 0; r < out.roots.size(); ++r) {
    auto it = call.seeds().find(out.roots[r]);
    if (it == call.seeds().end()) continue;
    auto what = [&] { return DescribeSeed(index, out.roots[r]); };
    absl::StatusOr<TensorPlan> plan = PlanTensor(it->second, limits, sources, what);
    if (!plan.ok()) return plan.status();
    out.seeds[r] = MakeTensor(it->second, *plan, sources, what);
  }
  return out;
}

// The destinations of call #index's gradients, each range checked against its region (Note
// [Shared-memory regions]). INVALID_ARGUMENT for a name that is not one of the call's inputs,
// a region that is not writable or a range outside it; errors of RequestRegions::Find.
absl::StatusOr<Destinations> FindDestinations(const v1::BackwardCall& call, int index,
                                              const graph::Limits& limits,
                                              const TensorSources& sources) {
  Destinations out;
  const absl::flat_hash_set<std::string> inputs(call.inputs().begin(), call.inputs().end());
  absl::Status status = CheckInKeyOrder<v1::SharedMemoryRange>(
      call.gradient_destinations(),
      [&](const std::string& input, const v1::SharedMemoryRange& range) -> absl::Status {
        auto what = [&] {
          return absl::StrCat("call #", index, ": gradient destination for ", Quote(input));
        };
        if (absl::Status s = CheckString(input, limits, what); !s.ok()) return s;
        if (!inputs.empty() && !inputs.contains(input)) {
          return absl::InvalidArgumentError(absl::StrCat(what(), ": not one of the call's inputs"));
        }
        absl::StatusOr<const SharedMemoryRegion*> region =
            FindRange(range, range.byte_size(), limits, sources, what, "region");
        if (!region.ok()) return region.status();
        if (!(*region)->writable()) {
          return absl::InvalidArgumentError(absl::StrCat(
              what(), ": shared-memory region ", Quote(range.region()),
              " was registered read-only; register it with writable set to write gradients "
              "there"));
        }
        out.emplace(input, GradientDestination{*region, range.offset(), range.byte_size()});
        return absl::OkStatus();
      });
  if (!status.ok()) return status;
  return out;
}

}  // namespace

absl::Status ToSharedMemory(const Tensor& tensor, const GradientDestination& destination,
                            absl::string_view what, v1::Tensor* out) {
  if (!tensor.defined()) return absl::OkStatus();
  Tensor host = tensor.device().is_cpu() ? tensor : tensor.To(kCPU);
  if (static_cast<int64_t>(host.nbytes()) != destination.byte_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": the gradient is ", DTypeName(host.dtype()), ShapeToString(host.shape()), ", ",
        host.nbytes(), " bytes, but its destination range has ", destination.byte_size));
  }
  // A gradient of one value (a sum's, expanded) is written as a fill, with no packed copy.
  const absl::Status written =
      host.repeats_one_value()
          ? destination.region->Fill(destination.offset, host.raw_data(), ElementSize(host.dtype()),
                                     destination.byte_size, what)
          : destination.region->Write(destination.offset, host.contiguous().raw_data(),
                                      destination.byte_size, what);
  if (!written.ok()) return written;
  out->set_dtype(ToProto(tensor.dtype()));
  out->mutable_shape()->Assign(tensor.shape().begin(), tensor.shape().end());
  out->set_device(DeviceName(tensor.device()));
  v1::SharedMemoryRange* range = out->mutable_shared_memory();
  range->set_region(destination.region->name());
  range->set_offset(destination.offset);
  range->set_byte_size(destination.byte_size);
  return absl::OkStatus();
}

std::optional<DType> FromProto(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32:
      return DType::kFloat32;
    case v1::DTYPE_FLOAT64:
      return DType::kFloat64;
    case v1::DTYPE_INT64:
      return DType::kInt64;
    case v1::DTYPE_BOOL:
      return DType::kBool;
    case v1::DTYPE_FLOAT16:
      return DType::kFloat16;
    case v1::DTYPE_BFLOAT16:
      return DType::kBFloat16;
    default:
      return std::nullopt;
  }
}

v1::DType ToProto(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return v1::DTYPE_FLOAT32;
    case DType::kFloat64:
      return v1::DTYPE_FLOAT64;
    case DType::kInt64:
      return v1::DTYPE_INT64;
    case DType::kBool:
      return v1::DTYPE_BOOL;
    case DType::kFloat16:
      return v1::DTYPE_FLOAT16;
    case DType::kBFloat16:
      return v1::DTYPE_BFLOAT16;
  }
  return v1::DTYPE_UNSPECIFIED;
}

bool SameStructure(const v1::Graph& wire, const graph::Graph& built, bool compare_ops) {
  if (!absl::c_equal(wire.inputs(), built.inputs) ||
      !absl::c_equal(wire.outputs(), built.outputs) ||
      static_cast<size_t>(wire.leaves_size()) != built.leaves.size() ||
      static_cast<size_t>(wire.ops_size()) != built.ops.size()) {
    return false;
  }
  for (size_t i = 0; i < built.leaves.size(); ++i) {
    const v1::Leaf& leaf = wire.leaves(static_cast<int>(i));
    if (leaf.name() != built.leaves[i].name ||
        leaf.requires_grad() != built.leaves[i].requires_grad) {
      return false;
    }
  }
  if (!compare_ops) return true;
  for (size_t i = 0; i < built.ops.size(); ++i) {
    if (!SameOp(wire.ops(static_cast<int>(i)), built.ops[i])) return false;
  }
  return true;
}

absl::StatusOr<EngineRequest> FromProto(const v1::GradRequest& request, const graph::Limits& limits,
                                        const ChunkedRequest* chunked,
                                        std::shared_ptr<graph::Graph> same_structure,
                                        RequestRegions* regions) {
  const TensorSources sources{chunked, regions};
  // Pass one: nothing is allocated until the whole request is known to fit, and every string
  // of the client's is within max_name_bytes (Note [Quoting client strings]).
  if (absl::Status s = CheckString(request.request_id(), limits, [] { return "request_id"; });
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CheckStrings(request.return_values(), limits, [] { return "return_values"; });
      !s.ok()) {
    return s;
  }
  if (request.calls_size() > limits.max_backward_calls) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the request has ", request.calls_size(), " backward calls, over the limit of ",
        limits.max_backward_calls, " (--max_backward_calls)"));
  }
  Census census(limits, sources);
  std::vector<Destinations> destinations;
  if (absl::Status s = census.CountGraph(request.graph(), 0, "",
                                         /*strings_known=*/same_structure != nullptr);
      !s.ok()) {
    return s;
  }
  for (int c = 0; c < request.calls_size(); ++c) {
    const v1::BackwardCall& call = request.calls(c);
    if (absl::Status s = CheckCallStrings(call, c, limits); !s.ok()) return s;
    absl::flat_hash_set<std::string> roots(call.roots().begin(), call.roots().end());
    // The census counts a seed again when an error makes CheckInKeyOrder check them twice; the
    // request is refused then anyway.
    if (absl::Status s = CheckInKeyOrder<v1::Tensor>(
            call.seeds(),
            [&](const std::string& root, const v1::Tensor& seed) -> absl::Status {
              if (!roots.contains(root)) {
                return absl::InvalidArgumentError(
                    absl::StrCat("call #", c, ": seed given for ", Quote(root),
                                 ", which is not one of the call's roots"));
              }
              return census.CountTensor(seed, [&] { return DescribeSeed(c, root); });
            });
        !s.ok()) {
      return s;
    }
    if (!call.gradient_destinations().empty()) {
      absl::StatusOr<Destinations> found = FindDestinations(call, c, limits, sources);
      if (!found.ok()) return found.status();
      destinations.resize(static_cast<size_t>(request.calls_size()));
      destinations[static_cast<size_t>(c)] = *std::move(found);
    }
  }

  // Pass two.
  try {
    EngineRequest out;
    if (same_structure != nullptr) {
      // Only the top level's leaves (Note [Reusing a validated graph]).
      for (int i = 0; i < request.graph().leaves_size(); ++i) {
        absl::StatusOr<Tensor> value = LeafValue(request.graph().leaves(i), limits, sources, "");
        if (!value.ok()) return value.status();
        same_structure->leaves[static_cast<size_t>(i)].value = *std::move(value);
      }
      out.graph = std::move(same_structure);
    } else {
      absl::StatusOr<graph::Graph> g = BuildGraph(request.graph(), limits, sources, "");
      if (!g.ok()) return g.status();
      out.graph = std::make_shared<graph::Graph>(*std::move(g));
    }
    out.calls.reserve(request.calls_size());
    for (int c = 0; c < request.calls_size(); ++c) {
      absl::StatusOr<graph::BackwardCall> call = BuildCall(request.calls(c), c, limits, sources);
      if (!call.ok()) return call.status();
      out.calls.push_back(*std::move(call));
    }
    out.destinations = std::move(destinations);
    return out;
  } catch (const StatusError& e) {
    return e.status();
  }
}

int64_t ToProtoNewBytes(const Tensor& tensor, const ChunkedResponse* deferred) {
  if (!tensor.defined()) return 0;
  // ToProto's cases: a CPU tensor deferred is taken as it is when contiguous, and written from
  // one block when it repeats one value; anything else is packed or copied whole.
  if (deferred != nullptr && tensor.device().is_cpu() && ChunkedResponse::Defers(tensor.nbytes())) {
    if (tensor.is_contiguous()) return 0;
    if (tensor.repeats_one_value()) {
      return static_cast<int64_t>(ChunkedResponse::RepeatedBlockBytes(tensor.nbytes()));
    }
  }
  return static_cast<int64_t>(tensor.nbytes());
}

void ToProto(const Tensor& tensor, v1::Tensor* out, ChunkedResponse* deferred) {
  if (!tensor.defined()) return;
  out->set_dtype(ToProto(tensor.dtype()));
  out->mutable_shape()->Assign(tensor.shape().begin(), tensor.shape().end());
  out->set_device(DeviceName(tensor.device()));
  Tensor host = tensor.device().is_cpu() ? tensor : tensor.To(kCPU);
  if (deferred != nullptr && ChunkedResponse::Defers(host.nbytes())) {
    // A tensor of one value stays so: its bytes are slices of one block (Note [A gradient of
    // one value]).
    deferred->Defer(host.repeats_one_value() ? std::move(host) : host.contiguous(), out);
    return;
  }
  host = host.contiguous();
  out->mutable_data()->assign(static_cast<const char*>(host.raw_data()), host.nbytes());
}

}  // namespace gradserve::server
