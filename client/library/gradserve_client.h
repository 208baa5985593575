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

// Errors are the call's gRPC status as an absl::Status (same code, same message).
//
// Thread safety: all methods may be called from any thread at once.
class Client {
 public:
  Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options = {});
  // A channel to target that accepts responses of any size: "host:port", a list of IP
  // addresses or a gRPC target URI such as "dns:///host:port", with round_robin over its
  // addresses and UNAVAILABLE retried (Note [Several replicas] in channel_target.h).
  static std::unique_ptr<Client> Connect(const std::string& target, ClientOptions options = {});

  // Sends request, by ComputeGradients or, when it is too large, ComputeGradientsStream.
  absl::StatusOr<v1::GradResponse> ComputeGradients(const v1::GradRequest& request,
                                                    const CallOptions& options = {});
  // The same, as plain structs.
  absl::StatusOr<GradResult> Grad(const v1::GradRequest& request, const CallOptions& options = {});
  absl::StatusOr<v1::ServerInfo> GetServerInfo(const CallOptions& options = {});
  // Echoes payload; returns the echo.
  absl::StatusOr<std::string> Ping(const std::string& payload = "",
                                   const CallOptions& options = {});
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
  const ClientOptions options_;
  absl::Mutex mutex_;
  int64_t max_message_bytes_ ABSL_GUARDED_BY(mutex_);
};

// grpc::Status to absl::Status: the same code and message.
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace gradserve::client

#endif  // GRADSERVE_CLIENT_LIBRARY_GRADSERVE_CLIENT_H_
