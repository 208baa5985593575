// The C++ client of gradserve: builds requests from tensors, sends them (unary, or streamed
// when too large for one message), and returns gradients as plain structs or proto messages.
// It depends on the wire contract (proto/) only, never on the engine.
//
//   auto client = gradserve::client::Client::Connect("127.0.0.1:50051");
//   gradserve::client::RequestBuilder b;
//   b.Leaf("x", HostTensor::Float32({1, 2, 3}, {3}), /*requires_grad=*/true)
//    .Op("mul", {"x", "x"}, {"y"})
//    .Op("sum", {"y"}, {"loss"});
//   b.Grad({"loss"}, {"x"});
//   absl::StatusOr<GradResult> r = client->Grad(b.request());
//   // r->calls[0].gradients[0].value->ToDoubles() == {2, 4, 6}
//
// A graph session (docs/sessions.md): the forward pass now, backward passes later.
//
//   absl::StatusOr<std::unique_ptr<Session>> s = client->Forward(b.request());
//   // look at (*s)->values(), choose seeds, then:
//   absl::StatusOr<std::vector<CallGradients>> g = (*s)->Backward({call});
//   // the session is released when *s is destroyed

#ifndef GRADSERVE_CLIENT_LIBRARY_GRADSERVE_CLIENT_H_
#define GRADSERVE_CLIENT_LIBRARY_GRADSERVE_CLIENT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gradserve/v1/gradserve.grpc.pb.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/security/credentials.h"

namespace gradserve::client {

namespace v1 = ::gradserve::v1;

// A tensor as the wire carries it: raw little-endian row-major bytes.
struct HostTensor {
  v1::DType dtype = v1::DTYPE_FLOAT32;
  std::vector<int64_t> shape;
  std::string data;
  std::string device;  // where it lives on the server; empty means "cpu"

  static HostTensor Float32(const std::vector<float>& values, std::vector<int64_t> shape);
  static HostTensor Float64(const std::vector<double>& values, std::vector<int64_t> shape);
  static HostTensor Int64(const std::vector<int64_t>& values, std::vector<int64_t> shape);
  static HostTensor Bool(const std::vector<bool>& values, std::vector<int64_t> shape);

  // The product of the shape (1 for a 0-d tensor).
  int64_t numel() const;
  // Every element converted to double, in row-major order. Empty if data is too short for the
  // shape (a malformed tensor).
  std::vector<double> ToDoubles() const;

  void ToProto(v1::Tensor* out) const;
  // Accepts raw data or values; INVALID_ARGUMENT if the contents do not match dtype and shape.
  static absl::StatusOr<HostTensor> FromProto(const v1::Tensor& tensor);
};

// PyTorch's name of a dtype: "float32", "float16", "bfloat16", ...; "invalid" for others.
const char* DTypeName(v1::DType dtype);

// "float32[2, 2] [[1, 2], [3, 4]]", with at most max_elements elements written out.
std::string FormatTensor(const HostTensor& tensor, int max_elements = 16);

// Attribute values for RequestBuilder::Op.
v1::AttrValue IntAttr(int64_t v);
v1::AttrValue FloatAttr(double v);
v1::AttrValue BoolAttr(bool v);
v1::AttrValue StringAttr(std::string v);
v1::AttrValue IntsAttr(const std::vector<int64_t>& v);
v1::AttrValue FloatsAttr(const std::vector<double>& v);
v1::AttrValue StringsAttr(const std::vector<std::string>& v);

// Builds a GradRequest: leaves and ops in forward order, then backward calls.
class RequestBuilder {
 public:
  RequestBuilder& Leaf(const std::string& name, const HostTensor& value,
                       bool requires_grad = false);
  RequestBuilder& Op(const std::string& op, const std::vector<std::string>& inputs,
                     const std::vector<std::string>& outputs,
                     const std::map<std::string, v1::AttrValue>& attrs = {});
  // grad() semantics: returns gradients of roots with respect to inputs. The returned call
  // may be changed further (seeds, retain_graph, ...) until the next call to the builder.
  v1::BackwardCall& Grad(const std::vector<std::string>& roots,
                         const std::vector<std::string>& inputs);
  // backward() semantics: accumulates into leaves' .grad and returns those of inputs (empty:
  // every leaf that requires grad).
  v1::BackwardCall& Backward(const std::vector<std::string>& roots,
                             const std::vector<std::string>& inputs = {});
  RequestBuilder& ReturnValue(const std::string& name);
  RequestBuilder& RequestId(const std::string& id);

  const v1::GradRequest& request() const { return request_; }
  v1::GradRequest* mutable_request() { return &request_; }

 private:
  v1::GradRequest request_;
};

// Results as plain structs.
struct Gradient {
  std::string name;
  bool connected = false;           // reached from the roots
  std::optional<HostTensor> value;  // absent if not connected and not materialized
  // For a gradient written to its shared-memory destination: where it is (read it with
  // SharedMemory::Get(*in_shared_memory)); value is then absent. Its dtype, shape, range.
  std::optional<v1::Tensor> in_shared_memory;
};
struct CallGradients {
  std::vector<Gradient> gradients;
  // The gradient for name, or null.
  const Gradient* Find(absl::string_view name) const;
};
struct GradResult {
  std::string request_id;
  std::vector<CallGradients> calls;                        // one per backward call
  std::vector<std::pair<std::string, HostTensor>> values;  // the requested forward values
  v1::Timings timings;
  int64_t num_nodes = 0;
};
absl::StatusOr<GradResult> FromProto(const v1::GradResponse& response);

// Cancels a call from another thread. Bind it to one call at a time through CallOptions.
//
// Thread safety: Cancel may be called from any thread, before, during or after the call; a
// call started after Cancel is cancelled at once.
class CallCanceller {
 public:
  void Cancel();

 private:
  friend class Client;
  friend class Session;
  void Bind(grpc::ClientContext* context);
  void Unbind();

  absl::Mutex mutex_;
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mutex_) = nullptr;
  bool cancelled_ ABSL_GUARDED_BY(mutex_) = false;
};

struct CallOptions {
  // Sent as the call's gRPC deadline; the server stops the work when it passes.
  absl::Duration timeout = absl::InfiniteDuration();
  CallCanceller* canceller = nullptr;  // not owned; must outlive the call
  enum class Transport { kAuto, kUnary, kStream };
  // kAuto streams requests too large for one message (the server's max_message_bytes).
  Transport transport = Transport::kAuto;
  // The call's trace id, which the server writes in its log line and echoes back (Note [Trace
  // ids] in server/service/trace_id.h): a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>) is
  // sent as `traceparent`, anything else as `x-request-id` (printable ASCII, at most 128
  // bytes, or the server ignores it). Empty: none.
  std::string trace_id;
  // If not null, receives the call's trailing metadata (the echoed trace id among it).
  std::multimap<std::string, std::string>* trailing_metadata = nullptr;
};

struct ClientOptions {
  // The largest request sent as one message. 0: ask the server (GetServerInfo) once, on the
  // first grad call; if it cannot say, gRPC's default of 4 MiB.
  int64_t max_message_bytes = 0;
  // Size of the chunks a streamed request is cut into (capped below max_message_bytes).
  int64_t chunk_bytes = int64_t{1} << 20;
  std::shared_ptr<grpc::ChannelCredentials> credentials;  // null: insecure
};

class Client;

// A graph held on one server between its Forward and later Extend and Backward calls
// (docs/sessions.md), made by Client::Forward. Every call goes over the channel that answered
// the Forward (Client's session channel: pick_first, no retries), so it reaches the replica
// that holds the graph. Destroying it releases the session on the server, unless Release was
// called; errors are then ignored (a session the server already ended has nothing left).
// Errors are the call's gRPC status as an absl::Status: NOT_FOUND for a session the server no
// longer holds (expired, released, another replica), UNAVAILABLE once it drained; both mean
// run the forward pass again.
//
// Thread safety: calls may come from any thread at once; the server runs them one at a time,
// in arrival order (docs/sessions.md, "Concurrent backward calls"). Release and the destructor
// must not overlap other calls.
class Session {
 public:
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // The session's id: 32 hex digits.
  const std::string& id() const { return id_; }
  // The values the Forward returned, by name, in the order asked for.
  const std::vector<std::pair<std::string, HostTensor>>& values() const { return values_; }
  // Autograd nodes its Forward recorded.
  int64_t num_nodes() const { return num_nodes_; }

  // Runs calls, in order, over the held graph; their roots and inputs name the session's
  // values. One CallGradients per call.
  absl::StatusOr<std::vector<CallGradients>> Backward(const std::vector<v1::BackwardCall>& calls,
                                                      const CallOptions& options = {});
  // Runs graph's leaves and ops after the session's (docs/sessions.md, "Extending a session"):
  // they may read any of its values by name and define new ones, from which later Backward
  // calls may start. Returns the values return_values names (new or old), in order.
  absl::StatusOr<std::vector<std::pair<std::string, HostTensor>>> Extend(
      const v1::Graph& graph, const std::vector<std::string>& return_values = {},
      const CallOptions& options = {});
  // Ends the session on the server and frees its memory. Once called, the destructor sends
  // nothing; a second call returns OK and sends nothing.
  absl::Status Release(const CallOptions& options = {});

 private:
  friend class Client;
  Session(std::shared_ptr<grpc::Channel> channel, std::string id, int64_t num_nodes);
  // Makes one unary call with options: send(context) sends it and returns its status. Also
  // what Client uses for its calls over the session channel (Forward, shared memory).
  template <typename Send>
  static absl::Status Call(const CallOptions& options, Send&& send);

  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<v1::GradService::Stub> stub_;
  const std::string id_;
  const int64_t num_nodes_;
  std::vector<std::pair<std::string, HostTensor>> values_;
  bool released_ = false;
};

// Errors are the call's gRPC status as an absl::Status (same code, same message).
//
// Thread safety: all methods may be called from any thread at once.
class Client {
 public:
  // Sessions' calls go over session_channel, or over channel if it is null.
  Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options = {},
         std::shared_ptr<grpc::Channel> session_channel = nullptr);
  // A channel to target that accepts responses of any size: "host:port", a list of IP
  // addresses or a gRPC target URI such as "dns:///host:port", with round_robin over its
  // addresses and UNAVAILABLE retried (Note [Several replicas] in channel_target.h); and, for
  // sessions, a second channel to target with pick_first and no retries
  // (CreateSessionChannel), which connects on its first call.
  static std::unique_ptr<Client> Connect(const std::string& target, ClientOptions options = {});

  // Sends request, by ComputeGradients or, when it is too large, ComputeGradientsStream. A
  // request that names shared memory goes over the session channel, to the server its regions
  // were registered with (see RegisterSharedMemory).
  absl::StatusOr<v1::GradResponse> ComputeGradients(const v1::GradRequest& request,
                                                    const CallOptions& options = {});
  // The same, as plain structs.
  absl::StatusOr<GradResult> Grad(const v1::GradRequest& request, const CallOptions& options = {});
  absl::StatusOr<v1::ServerInfo> GetServerInfo(const CallOptions& options = {});
  // Echoes payload; returns the echo.
  absl::StatusOr<std::string> Ping(const std::string& payload = "",
                                   const CallOptions& options = {});
  // Runs request's graph forward on the server and holds it there (docs/sessions.md): returns
  // the Session, whose values() are request's return_values. request's calls are ignored.
  // Sent over the session channel (see Connect), unary: the request must fit in one message.
  absl::StatusOr<std::unique_ptr<Session>> Forward(const v1::GradRequest& request,
                                                   const CallOptions& options = {});
  // Shared memory (client/library/shared_memory.h, docs/shared_memory.md): the server maps
  // byte_size bytes of the POSIX shared-memory object key as region name (writable: gradients
  // may be written there) until UnregisterSharedMemory or idle_ttl (0: the server's) without
  // a call naming it. Returns the idle TTL the region got. Sent over the session channel.
  absl::StatusOr<absl::Duration> RegisterSharedMemory(
      const std::string& name, const std::string& key, int64_t byte_size, bool writable,
      absl::Duration idle_ttl = absl::ZeroDuration(), const CallOptions& options = {});
  absl::Status UnregisterSharedMemory(const std::string& name, const CallOptions& options = {});
  // grpc.health.v1 Check: "SERVING", "NOT_SERVING", ...
  absl::StatusOr<std::string> CheckHealth(const std::string& service = "",
                                          const CallOptions& options = {});

  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }

 private:
  // The message limit to obey; asks the server the first time.
  int64_t MaxMessageBytes();
  absl::StatusOr<v1::GradResponse> Unary(const v1::GradRequest& request,
                                         const CallOptions& options);
  absl::StatusOr<v1::GradResponse> Streamed(const v1::GradRequest& request,
                                            const CallOptions& options, int64_t max_message);

  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<v1::GradService::Stub> stub_;
  const std::shared_ptr<grpc::Channel> session_channel_;
  const std::unique_ptr<v1::GradService::Stub> session_stub_;
  const ClientOptions options_;
  absl::Mutex mutex_;
  int64_t max_message_bytes_ ABSL_GUARDED_BY(mutex_);
};

// grpc::Status to absl::Status: the same code and message.
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace gradserve::client

#endif  // GRADSERVE_CLIENT_LIBRARY_GRADSERVE_CLIENT_H_
