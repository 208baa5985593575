#include "client/library/gradserve_client.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/library/channel_target.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/impl/rpc_method.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "grpcpp/support/sync_stream.h"
#include "proto/chunk_slices.h"
#include "proto/trace_context.h"

namespace gradserve::client {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the wire format is little-endian; this host would need byte swapping");

// gRPC's default receive limit, assumed when the server cannot tell its own.
constexpr int64_t kDefaultMaxMessageBytes = int64_t{4} << 20;
// Room left for the framing of a message around its largest field.
constexpr int64_t kFramingBytes = 1024;
// ComputeGradientsStream, called with ByteBuffers (Note [Zero-copy streaming]).
constexpr char kStreamMethod[] = "/gradserve.v1.GradService/ComputeGradientsStream";

int64_t ElementBytes(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32:
      return 4;
    case v1::DTYPE_FLOAT64:
    case v1::DTYPE_INT64:
      return 8;
    case v1::DTYPE_FLOAT16:
    case v1::DTYPE_BFLOAT16:
      return 2;
    case v1::DTYPE_BOOL:
      return 1;
    default:
      return 0;
  }
}

// The value of IEEE 754 binary16 bits (exact in double).
double HalfToDouble(uint16_t h) {
  const int exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
  double v = exponent == 0    ? std::ldexp(mantissa, -24)
             : exponent == 31 ? (mantissa != 0 ? std::nan("") : HUGE_VAL)
                              : std::ldexp(mantissa | 0x400, exponent - 25);
  return (h & 0x8000) != 0 ? -v : v;
}

}  // namespace

const char* DTypeName(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32:
      return "float32";
    case v1::DTYPE_FLOAT64:
      return "float64";
    case v1::DTYPE_INT64:
      return "int64";
    case v1::DTYPE_BOOL:
      return "bool";
    case v1::DTYPE_FLOAT16:
      return "float16";
    case v1::DTYPE_BFLOAT16:
      return "bfloat16";
    default:
      return "invalid";
  }
}

namespace {

template <typename T>
HostTensor Pack(v1::DType dtype, const std::vector<T>& values, std::vector<int64_t> shape) {
  HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.data.resize(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(t.data.data(), values.data(), t.data.size());
  return t;
}

void SetUp(grpc::ClientContext& context, const CallOptions& options) {
  if (options.timeout != absl::InfiniteDuration()) {
    context.set_deadline(absl::ToChronoTime(absl::Now() + options.timeout));
  }
  if (!options.trace_id.empty())
    context.AddMetadata(trace_context::KeyFor(options.trace_id), options.trace_id);
}

// Hands the call's trailing metadata to the caller, if it asked (CallOptions).
void TakeTrailers(const grpc::ClientContext& context, const CallOptions& options) {
  if (options.trailing_metadata == nullptr) return;
  options.trailing_metadata->clear();
  for (const auto& [key, value] : context.GetServerTrailingMetadata()) {
    options.trailing_metadata->emplace(std::string(key.data(), key.size()),
                                       std::string(value.data(), value.size()));
  }
}

// Binds a call's context to the caller's canceller for the scope of the call.
class CancellerBinding {
 public:
  CancellerBinding(CallCanceller* canceller, grpc::ClientContext* context,
                   void (CallCanceller::*bind)(grpc::ClientContext*),
                   void (CallCanceller::*unbind)())
      : canceller_(canceller), unbind_(unbind) {
    if (canceller_ != nullptr) (canceller_->*bind)(context);
  }
  ~CancellerBinding() {
    if (canceller_ != nullptr) (canceller_->*unbind_)();
  }

 private:
  CallCanceller* const canceller_;
  void (CallCanceller::*const unbind_)();
};

// Named values from the wire; the first malformed one's status.
absl::StatusOr<std::vector<std::pair<std::string, HostTensor>>> NamedValues(
    const google::protobuf::RepeatedPtrField<v1::NamedTensor>& values) {
  std::vector<std::pair<std::string, HostTensor>> out;
  for (const v1::NamedTensor& v : values) {
    absl::StatusOr<HostTensor> t = HostTensor::FromProto(v.value());
    if (!t.ok()) return t.status();
    out.emplace_back(v.name(), *std::move(t));
  }
  return out;
}

// True if graph, or a checkpoint body within it, has a leaf in shared memory.
bool NamesSharedMemory(const v1::Graph& graph) {
  for (const v1::Leaf& leaf : graph.leaves()) {
    if (leaf.value().has_shared_memory()) return true;
  }
  for (const v1::Op& op : graph.ops()) {
    if (op.has_body() && NamesSharedMemory(op.body())) return true;
  }
  return false;
}

// True if request names a shared-memory range anywhere: a leaf, a seed, a gradient
// destination. A region lives on the one server that registered it, over the session channel,
// so such a request goes there too (docs/shared_memory.md).
bool NamesSharedMemory(const v1::GradRequest& request) {
  if (NamesSharedMemory(request.graph())) return true;
  for (const v1::BackwardCall& call : request.calls()) {
    if (!call.gradient_destinations().empty()) return true;
    for (const auto& [name, seed] : call.seeds()) {
      if (seed.has_shared_memory()) return true;
    }
  }
  return false;
}

}  // namespace

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

// --- HostTensor -------------------------------------------------------------------------

HostTensor HostTensor::Float32(const std::vector<float>& values, std::vector<int64_t> shape) {
  return Pack(v1::DTYPE_FLOAT32, values, std::move(shape));
}
HostTensor HostTensor::Float64(const std::vector<double>& values, std::vector<int64_t> shape) {
  return Pack(v1::DTYPE_FLOAT64, values, std::move(shape));
}
HostTensor HostTensor::Int64(const std::vector<int64_t>& values, std::vector<int64_t> shape) {
  return Pack(v1::DTYPE_INT64, values, std::move(shape));
}
HostTensor HostTensor::Bool(const std::vector<bool>& values, std::vector<int64_t> shape) {
  std::vector<uint8_t> bytes(values.begin(), values.end());
  return Pack(v1::DTYPE_BOOL, bytes, std::move(shape));
}

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<double> HostTensor::ToDoubles() const {
  const int64_t n = numel();
  const int64_t size = ElementBytes(dtype);
  if (size == 0 || n < 0 || static_cast<int64_t>(data.size()) != n * size) return {};
  std::vector<double> out(n);
  const char* p = data.data();
  for (int64_t i = 0; i < n; ++i, p += size) {
    switch (dtype) {
      case v1::DTYPE_FLOAT32: {
        float v;
        std::memcpy(&v, p, 4);
        out[i] = v;
        break;
      }
      case v1::DTYPE_FLOAT64:
        std::memcpy(&out[i], p, 8);
        break;
      case v1::DTYPE_INT64: {
        int64_t v;
        std::memcpy(&v, p, 8);
        out[i] = static_cast<double>(v);
        break;
      }
      case v1::DTYPE_FLOAT16: {
        uint16_t h;
        std::memcpy(&h, p, 2);
        out[i] = HalfToDouble(h);
        break;
      }
      case v1::DTYPE_BFLOAT16: {
        uint16_t b;
        std::memcpy(&b, p, 2);
        const uint32_t bits = static_cast<uint32_t>(b) << 16;
        float v;
        std::memcpy(&v, &bits, 4);
        out[i] = v;
        break;
      }
      default:
        out[i] = *p != 0 ? 1.0 : 0.0;
        break;
    }
  }
  return out;
}

void HostTensor::ToProto(v1::Tensor* out) const {
  out->set_dtype(dtype);
  out->mutable_shape()->Assign(shape.begin(), shape.end());
  out->set_data(data);
  if (!device.empty()) out->set_device(device);
}

absl::StatusOr<HostTensor> HostTensor::FromProto(const v1::Tensor& tensor) {
  HostTensor t;
  t.dtype = tensor.dtype();
  t.shape.assign(tensor.shape().begin(), tensor.shape().end());
  t.device = tensor.device();
  const int64_t size = ElementBytes(t.dtype);
  if (size == 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor has no valid dtype (", t.dtype, ")"));
  }
  const int64_t n = t.numel();
  if (tensor.has_values()) {
    const v1::TensorValues& v = tensor.values();
    if (size == 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a ", DTypeName(t.dtype), " tensor's values are read from data only, not values"));
    }
    if (t.dtype == v1::DTYPE_FLOAT32) {
      t = Pack(t.dtype, std::vector<float>(v.doubles().begin(), v.doubles().end()), t.shape);
    } else if (t.dtype == v1::DTYPE_FLOAT64) {
      t = Pack(t.dtype, std::vector<double>(v.doubles().begin(), v.doubles().end()), t.shape);
    } else if (t.dtype == v1::DTYPE_INT64) {
      t = Pack(t.dtype, std::vector<int64_t>(v.ints().begin(), v.ints().end()), t.shape);
    } else {
      t = Pack(t.dtype, std::vector<uint8_t>(v.bools().begin(), v.bools().end()), t.shape);
    }
    t.device = tensor.device();
  } else {
    t.data = tensor.data();
  }
  if (static_cast<int64_t>(t.data.size()) != n * size) {
    return absl::InvalidArgumentError(absl::StrCat("tensor data has ", t.data.size(),
                                                   " bytes; its dtype and shape need ", n * size));
  }
  return t;
}

std::string FormatTensor(const HostTensor& tensor, int max_elements) {
  std::string out =
      absl::StrCat(DTypeName(tensor.dtype), "[", absl::StrJoin(tensor.shape, ", "), "]");
  if (!tensor.device.empty() && tensor.device != "cpu")
    absl::StrAppend(&out, " on ", tensor.device);
  const std::vector<double> values = tensor.ToDoubles();
  if (values.empty() && tensor.numel() != 0) return absl::StrCat(out, " <malformed data>");
  out += " ";
  // Writes the block of dimension d starting at element offset, nested as in NumPy.
  int written = 0;
  std::vector<int64_t> stride(tensor.shape.size(), 1);
  for (int d = static_cast<int>(tensor.shape.size()) - 2; d >= 0; --d) {
    stride[d] = stride[d + 1] * tensor.shape[d + 1];
  }
  auto write = [&](auto&& self, size_t d, int64_t offset) -> void {
    if (d == tensor.shape.size()) {
      if (written < max_elements) absl::StrAppend(&out, values[offset]);
      ++written;
      return;
    }
    out += "[";
    for (int64_t i = 0; i < tensor.shape[d]; ++i) {
      if (written >= max_elements) {
        out += i > 0 ? ", ..." : "...";
        break;
      }
      if (i > 0) out += ", ";
      self(self, d + 1, offset + i * stride[d]);
    }
    out += "]";
  };
  write(write, 0, 0);
  return out;
}

// --- Attributes and RequestBuilder ------------------------------------------------------

v1::AttrValue IntAttr(int64_t v) {
  v1::AttrValue a;
  a.set_i(v);
  return a;
}
v1::AttrValue FloatAttr(double v) {
  v1::AttrValue a;
  a.set_f(v);
  return a;
}
v1::AttrValue BoolAttr(bool v) {
  v1::AttrValue a;
  a.set_b(v);
  return a;
}
v1::AttrValue StringAttr(std::string v) {
  v1::AttrValue a;
  a.set_s(std::move(v));
  return a;
}
v1::AttrValue IntsAttr(const std::vector<int64_t>& v) {
  v1::AttrValue a;
  a.mutable_ints()->mutable_values()->Assign(v.begin(), v.end());
  return a;
}
v1::AttrValue FloatsAttr(const std::vector<double>& v) {
  v1::AttrValue a;
  a.mutable_floats()->mutable_values()->Assign(v.begin(), v.end());
  return a;
}
v1::AttrValue StringsAttr(const std::vector<std::string>& v) {
  v1::AttrValue a;
  for (const std::string& s : v) a.mutable_strings()->add_values(s);
  return a;
}

RequestBuilder& RequestBuilder::Leaf(const std::string& name, const HostTensor& value,
                                     bool requires_grad) {
  v1::Leaf* leaf = request_.mutable_graph()->add_leaves();
  leaf->set_name(name);
  value.ToProto(leaf->mutable_value());
  leaf->set_requires_grad(requires_grad);
  return *this;
}

RequestBuilder& RequestBuilder::Op(const std::string& op, const std::vector<std::string>& inputs,
                                   const std::vector<std::string>& outputs,
                                   const std::map<std::string, v1::AttrValue>& attrs) {
  v1::Op* o = request_.mutable_graph()->add_ops();
  o->set_op(op);
  for (const std::string& in : inputs) o->add_inputs(in);
  for (const std::string& out : outputs) o->add_outputs(out);
  for (const auto& [name, value] : attrs) (*o->mutable_attrs())[name] = value;
  return *this;
}

v1::BackwardCall& RequestBuilder::Grad(const std::vector<std::string>& roots,
                                       const std::vector<std::string>& inputs) {
  v1::BackwardCall* call = request_.add_calls();
  for (const std::string& r : roots) call->add_roots(r);
  for (const std::string& in : inputs) call->add_inputs(in);
  return *call;
}

v1::BackwardCall& RequestBuilder::Backward(const std::vector<std::string>& roots,
                                           const std::vector<std::string>& inputs) {
  v1::BackwardCall& call = Grad(roots, inputs);
  call.set_accumulate_grad(true);
  return call;
}

RequestBuilder& RequestBuilder::ReturnValue(const std::string& name) {
  request_.add_return_values(name);
  return *this;
}

RequestBuilder& RequestBuilder::RequestId(const std::string& id) {
  request_.set_request_id(id);
  return *this;
}

// --- Results ----------------------------------------------------------------------------

const Gradient* CallGradients::Find(absl::string_view name) const {
  for (const Gradient& g : gradients) {
    if (g.name == name) return &g;
  }
  return nullptr;
}

absl::StatusOr<GradResult> FromProto(const v1::GradResponse& response) {
  GradResult r;
  r.request_id = response.request_id();
  r.timings = response.timings();
  r.num_nodes = response.num_nodes();
  for (const v1::CallResult& call : response.calls()) {
    CallGradients& out = r.calls.emplace_back();
    for (const v1::Gradient& g : call.gradients()) {
      Gradient& grad = out.gradients.emplace_back();
      grad.name = g.name();
      grad.connected = g.connected();
      if (g.has_value() && g.value().has_shared_memory()) {
        grad.in_shared_memory = g.value();
      } else if (g.has_value()) {
        absl::StatusOr<HostTensor> t = HostTensor::FromProto(g.value());
        if (!t.ok()) return t.status();
        grad.value = *std::move(t);
      }
    }
  }
  absl::StatusOr<std::vector<std::pair<std::string, HostTensor>>> values =
      NamedValues(response.values());
  if (!values.ok()) return values.status();
  r.values = *std::move(values);
  return r;
}

// --- CallCanceller ----------------------------------------------------------------------

void CallCanceller::Cancel() {
  absl::MutexLock lock(&mutex_);
  cancelled_ = true;
  if (context_ != nullptr) context_->TryCancel();
}

void CallCanceller::Bind(grpc::ClientContext* context) {
  absl::MutexLock lock(&mutex_);
  context_ = context;
  if (cancelled_) context_->TryCancel();
}

void CallCanceller::Unbind() {
  absl::MutexLock lock(&mutex_);
  context_ = nullptr;
}

// --- Client -----------------------------------------------------------------------------

Client::Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options,
               std::shared_ptr<grpc::Channel> session_channel)
    : channel_(std::move(channel)),
      stub_(v1::GradService::NewStub(channel_)),
      session_channel_(session_channel != nullptr ? std::move(session_channel) : channel_),
      session_stub_(v1::GradService::NewStub(session_channel_)),
      options_(std::move(options)),
      max_message_bytes_(options_.max_message_bytes) {}

std::unique_ptr<Client> Client::Connect(const std::string& target, ClientOptions options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  // Note [Several replicas]: round_robin over every address, UNAVAILABLE retried.
  std::shared_ptr<grpc::Channel> channel = CreateClientChannel(target, options.credentials, args);
  // docs/sessions.md, "Several replicas": a session's calls stay on one connection.
  std::shared_ptr<grpc::Channel> sessions = CreateSessionChannel(target, options.credentials, args);
  return std::make_unique<Client>(std::move(channel), std::move(options), std::move(sessions));
}

absl::StatusOr<std::unique_ptr<Session>> Client::Forward(const v1::GradRequest& request,
                                                         const CallOptions& options) {
  v1::ForwardRequest forward;
  forward.set_request_id(request.request_id());
  *forward.mutable_graph() = request.graph();
  *forward.mutable_return_values() = request.return_values();
  v1::ForwardResponse response;
  absl::Status status = Session::Call(options, [&](grpc::ClientContext& context) {
    return session_stub_->Forward(&context, forward, &response);
  });
  if (!status.ok()) return status;
  std::unique_ptr<Session> session(
      new Session(session_channel_, response.session_id(), response.num_nodes()));
  absl::StatusOr<std::vector<std::pair<std::string, HostTensor>>> values =
      NamedValues(response.values());
  if (!values.ok()) return values.status();  // the destructor releases the session
  session->values_ = *std::move(values);
  return session;
}

// --- Session ----------------------------------------------------------------------------

template <typename Send>
absl::Status Session::Call(const CallOptions& options, Send&& send) {
  grpc::ClientContext context;
  SetUp(context, options);
  CancellerBinding binding(options.canceller, &context, &CallCanceller::Bind,
                           &CallCanceller::Unbind);
  grpc::Status status = send(context);
  TakeTrailers(context, options);
  return FromGrpcStatus(status);
}

Session::Session(std::shared_ptr<grpc::Channel> channel, std::string id, int64_t num_nodes)
    : channel_(std::move(channel)),
      stub_(v1::GradService::NewStub(channel_)),
      id_(std::move(id)),
      num_nodes_(num_nodes) {}

Session::~Session() {
  CallOptions options;
  options.timeout = absl::Seconds(5);  // a destructor must not hang on a dead server
  Release(options).IgnoreError();
}

absl::StatusOr<std::vector<CallGradients>> Session::Backward(
    const std::vector<v1::BackwardCall>& calls, const CallOptions& options) {
  v1::BackwardRequest request;
  request.set_session_id(id_);
  for (const v1::BackwardCall& call : calls) *request.add_calls() = call;
  v1::BackwardResponse response;
  absl::Status status = Call(options, [&](grpc::ClientContext& context) {
    return stub_->Backward(&context, request, &response);
  });
  if (!status.ok()) return status;
  v1::GradResponse as_grad;  // FromProto reads the calls
  as_grad.mutable_calls()->Swap(response.mutable_calls());
  absl::StatusOr<GradResult> result = FromProto(as_grad);
  if (!result.ok()) return result.status();
  return std::move(result->calls);
}

absl::StatusOr<std::vector<std::pair<std::string, HostTensor>>> Session::Extend(
    const v1::Graph& graph, const std::vector<std::string>& return_values,
    const CallOptions& options) {
  v1::ExtendRequest request;
  request.set_session_id(id_);
  *request.mutable_graph() = graph;
  for (const std::string& name : return_values) request.add_return_values(name);
  v1::ExtendResponse response;
  absl::Status status = Call(options, [&](grpc::ClientContext& context) {
    return stub_->Extend(&context, request, &response);
  });
  if (!status.ok()) return status;
  return NamedValues(response.values());
}

absl::Status Session::Release(const CallOptions& options) {
  if (released_) return absl::OkStatus();
  released_ = true;
  v1::ReleaseRequest request;
  request.set_session_id(id_);
  v1::ReleaseResponse response;
  return Call(options, [&](grpc::ClientContext& context) {
    return stub_->Release(&context, request, &response);
  });
}

int64_t Client::MaxMessageBytes() {
  {
    absl::MutexLock lock(&mutex_);
    if (max_message_bytes_ > 0) return max_message_bytes_;
  }
  CallOptions options;
  options.timeout = absl::Seconds(10);
  absl::StatusOr<v1::ServerInfo> info = GetServerInfo(options);
  // A server that cannot answer now is asked again next time; meanwhile assume the default.
  if (!info.ok() || info->limits().max_message_bytes() <= 0) return kDefaultMaxMessageBytes;
  absl::MutexLock lock(&mutex_);
  max_message_bytes_ = info->limits().max_message_bytes();
  return max_message_bytes_;
}

absl::StatusOr<v1::GradResponse> Client::ComputeGradients(const v1::GradRequest& request,
                                                          const CallOptions& options) {
  switch (options.transport) {
    case CallOptions::Transport::kUnary:
      return Unary(request, options);
    case CallOptions::Transport::kStream:
      return Streamed(request, options, MaxMessageBytes());
    case CallOptions::Transport::kAuto:
      break;
  }
  const int64_t max_message = MaxMessageBytes();
  if (static_cast<int64_t>(request.ByteSizeLong()) + kFramingBytes <= max_message) {
    return Unary(request, options);
  }
  return Streamed(request, options, max_message);
}

absl::StatusOr<GradResult> Client::Grad(const v1::GradRequest& request,
                                        const CallOptions& options) {
  absl::StatusOr<v1::GradResponse> response = ComputeGradients(request, options);
  if (!response.ok()) return response.status();
  return FromProto(*response);
}

absl::StatusOr<v1::GradResponse> Client::Unary(const v1::GradRequest& request,
                                               const CallOptions& options) {
  grpc::ClientContext context;
  SetUp(context, options);
  CancellerBinding binding(options.canceller, &context, &CallCanceller::Bind,
                           &CallCanceller::Unbind);
  v1::GradResponse response;
  v1::GradService::Stub& stub = NamesSharedMemory(request) ? *session_stub_ : *stub_;
  grpc::Status status = stub.ComputeGradients(&context, request, &response);
  TakeTrailers(context, options);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::StatusOr<v1::GradResponse> Client::Streamed(const v1::GradRequest& request,
                                                  const CallOptions& options, int64_t max_message) {
  const int64_t chunk_bytes =
      std::max<int64_t>(1, std::min(options_.chunk_bytes, max_message - kFramingBytes));
  // Note [Zero-copy streaming]: the request's Chunks are slices over its own bytes fields, and
  // the response's data stays in the slices gRPC received until the response is parsed from
  // them. Declared first, aliased is destroyed last: it waits for gRPC to let go of every slice
  // over the request.
  chunking::AliasedSlices aliased;
  std::vector<grpc::Slice> slices;
  if (!chunking::SerializeToSlices(request, &aliased, &slices)) {
    return absl::InvalidArgumentError("the request could not be serialized");
  }
  std::vector<grpc::ByteBuffer> frames =
      chunking::CutIntoChunks(slices, chunk_bytes, static_cast<int64_t>(request.GetCachedSize()));
  std::vector<grpc::Slice>().swap(slices);
  grpc::ClientContext context;
  SetUp(context, options);
  CancellerBinding binding(options.canceller, &context, &CallCanceller::Bind,
                           &CallCanceller::Unbind);
  grpc::Channel& channel = NamesSharedMemory(request) ? *session_channel_ : *channel_;
  const grpc::internal::RpcMethod method(kStreamMethod, grpc::internal::RpcMethod::BIDI_STREAMING);
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
          &channel, method, &context));
  // A failed write means the server ended the call; Finish below says why.
  for (grpc::ByteBuffer& frame : frames) {
    if (!stream->Write(frame)) break;
    frame.Clear();
  }
  stream->WritesDone();
  std::vector<grpc::ByteBuffer>().swap(frames);

  std::vector<grpc::Slice> received;
  int64_t chunks = 0;
  bool malformed = false;
  grpc::ByteBuffer chunk;
  while (stream->Read(&chunk)) {
    ++chunks;
    if (!malformed && !chunking::AppendChunkData(chunk, &received)) malformed = true;
    chunk.Clear();
  }
  grpc::Status status = stream->Finish();
  TakeTrailers(context, options);
  if (!status.ok()) return FromGrpcStatus(status);
  if (malformed) {
    return absl::InternalError("a chunk of the server's streamed response is no Chunk message");
  }
  v1::GradResponse response;
  if (!chunking::ParseFromSlices(received, &response)) {
    int64_t received_bytes = 0;
    for (const grpc::Slice& slice : received) received_bytes += static_cast<int64_t>(slice.size());
    return absl::InternalError(absl::StrCat("the server's streamed response (", received_bytes,
                                            " bytes in ", chunks,
                                            " chunks) does not parse as a GradResponse"));
  }
  return response;
}

absl::StatusOr<v1::ServerInfo> Client::GetServerInfo(const CallOptions& options) {
  grpc::ClientContext context;
  SetUp(context, options);
  CancellerBinding binding(options.canceller, &context, &CallCanceller::Bind,
                           &CallCanceller::Unbind);
  v1::ServerInfo info;
  grpc::Status status = stub_->GetServerInfo(&context, v1::ServerInfoRequest(), &info);
  if (!status.ok()) return FromGrpcStatus(status);
  return info;
}

absl::StatusOr<std::string> Client::Ping(const std::string& payload, const CallOptions& options) {
  grpc::ClientContext context;
  SetUp(context, options);
  CancellerBinding binding(options.canceller, &context, &CallCanceller::Bind,
                           &CallCanceller::Unbind);
  v1::PingRequest request;
  request.set_payload(payload);
  v1::PingResponse response;
  grpc::Status status = stub_->Ping(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response.payload();
}

absl::StatusOr<absl::Duration> Client::RegisterSharedMemory(const std::string& name,
                                                            const std::string& key,
                                                            int64_t byte_size, bool writable,
                                                            absl::Duration idle_ttl,
                                                            const CallOptions& options) {
  v1::RegisterSharedMemoryRequest request;
  request.set_name(name);
  request.set_key(key);
  request.set_byte_size(byte_size);
  request.set_writable(writable);
  request.set_idle_ttl_ms(absl::ToInt64Milliseconds(idle_ttl));
  v1::RegisterSharedMemoryResponse response;
  // Over the session channel, as the session calls are (Session::Call).
  absl::Status status = Session::Call(options, [&](grpc::ClientContext& context) {
    return session_stub_->RegisterSharedMemory(&context, request, &response);
  });
  if (!status.ok()) return status;
  return absl::Milliseconds(response.idle_ttl_ms());
}

absl::Status Client::UnregisterSharedMemory(const std::string& name, const CallOptions& options) {
  v1::UnregisterSharedMemoryRequest request;
  request.set_name(name);
  v1::UnregisterSharedMemoryResponse response;
  return Session::Call(options, [&](grpc::ClientContext& context) {
    return session_stub_->UnregisterSharedMemory(&context, request, &response);
  });
}

absl::StatusOr<std::string> Client::CheckHealth(const std::string& service,
                                                const CallOptions& options) {
  grpc::ClientContext context;
  SetUp(context, options);
  CancellerBinding binding(options.canceller, &context, &CallCanceller::Bind,
                           &CallCanceller::Unbind);
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status =
      grpc::health::v1::Health::NewStub(channel_)->Check(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status());
}

}  // namespace gradserve::client
