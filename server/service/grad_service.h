// The gRPC service gradserve.v1.GradService, on gRPC's callback API.
//
// Note [Request flow]
// Each call is admitted first (at most max_in_flight grad calls at once, otherwise
// RESOURCE_EXHAUSTED at once; UNAVAILABLE after StartDraining, at the end of a drain: Note
// [Draining] in server/service/grad_server.h); a streamed call only once it has fully
// arrived, as an upload until then (Note [Uploads apart from work] in
// server/limits/upload_tracker.h). With a token file, a call is its client's tenant's too
// (found from its token: Note [Who may call] in server/security/token_auth.h), admitted first
// against that tenant's share of slots, and its memory drawn from the tenant's share of the
// budget (Note [Tenants' shares] in server/security/tenants.h). What a call holds counts against
// the server's memory budget (Note [Sizing the server's memory]): a unary request's bytes from
// admission, an upload's as they arrive, the tensors of every request (each request's budget lies
// within the server's), and the response while it is serialized. A unary call whose estimated work
// is small (Note [Inline or pool] in server/run/dispatch.h) then runs inline on gRPC's callback
// thread, as Ping does, and finishes gRPC's default reactor before the handler returns. Any
// other call gets a small reactor that owns itself (deleted in OnDone) and is handed to the
// WorkerPool of engine CPU workers; the gRPC thread returns at once and never waits on the
// Engine. Either way, the same code (GradService::Run) runs the request (a RequestRunner) and does
// the bookkeeping (counters, the log line, releasing admission); on the pool, finishing the
// reactor is the last thing the worker touches of the call, and what the request made is freed
// after that (Note [Teardown after the reply] in server/run/request_runner.h). The client's
// deadline reaches the work through a CancellationToken built with the call's deadline; on the
// pool, OnCancel cancels it too (gRPC delivers OnCancel only after the handler returned, so not to
// inline work). The streaming variant collects the chunks of the serialized request (at most
// max_request_bytes), runs it on the pool, then streams the serialized response back in
// chunks of chunk_bytes.

#ifndef GRADSERVE_SERVER_SERVICE_GRAD_SERVICE_H_
#define GRADSERVE_SERVER_SERVICE_GRAD_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/autograd/cancellation.h"
#include "engine/tensor/memory_budget.h"
#include "engine/util/mutex.h"
#include "gradserve/v1/gradserve.grpc.pb.h"
#include "server/base/log.h"
#include "server/limits/upload_tracker.h"
#include "server/metrics/request_metrics.h"
#include "server/run/device_load.h"
#include "server/run/request_runner.h"
#include "server/run/worker_pool.h"
#include "server/security/tenants.h"
#include "server/security/token_auth.h"
#include "server/service/server_options.h"
#include "server/service/trace_id.h"
#include "server/session/session_store.h"
#include "server/shared_memory/registry.h"
#include "server/wire/chunked_request.h"
#include "server/wire/unary_messages.h"

namespace gradserve::server {

// The name of a call's tenant in the session store and the shared-memory registry: the
// implicit tenant (null, without a token file) is "".
inline std::string TenantKey(const Tenant* tenant) {
  return tenant == nullptr ? "" : tenant->name();
}

// Thread safety: the gRPC methods are called by gRPC from any thread; StartDraining,
// WaitUntilIdle and counters may be called from any thread. The destructor waits for the
// worker pool to finish what it was given; destroy the service only after the grpc::Server
// that uses it has shut down.
//
// ComputeGradients is a raw method: it parses its request and serializes its response itself
// (Note [Unary messages reused]); so is ComputeGradientsStream, for its chunks (Note [Chunks
// sent without a copy] in server/wire/chunk_message.h).
// (The raw stream's handler has the typed one's parameters, so the typed mixin of
// CallbackService cannot be below it: the service is built from the four mixins it uses.)
class GradService final
    : public v1::GradService::WithRawCallbackMethod_ComputeGradients<
          v1::GradService::WithRawCallbackMethod_ComputeGradientsStream<
              v1::GradService::WithCallbackMethod_GetServerInfo<
                  v1::GradService::WithCallbackMethod_Ping<
                      v1::GradService::WithCallbackMethod_Forward<
                          v1::GradService::WithCallbackMethod_Backward<
                              v1::GradService::WithCallbackMethod_Extend<
                                  v1::GradService::WithCallbackMethod_Release<
                                      v1::GradService::WithCallbackMethod_RegisterSharedMemory<
                                          v1::GradService::
                                              WithCallbackMethod_UnregisterSharedMemory<
                                                  v1::GradService::Service>>>>>>>>>> {
 public:
  // auth: the token file's processor (Note [Who may call]), or null: one implicit tenant.
  explicit GradService(ServerOptions options, std::shared_ptr<TokenAuth> auth = nullptr);
  ~GradService() override;

  grpc::ServerUnaryReactor* ComputeGradients(grpc::CallbackServerContext* context,
                                             const grpc::ByteBuffer* request,
                                             grpc::ByteBuffer* response) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* ComputeGradientsStream(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const v1::ServerInfoRequest* request,
                                          v1::ServerInfo* response) override;
  grpc::ServerUnaryReactor* Ping(grpc::CallbackServerContext* context,
                                 const v1::PingRequest* request,
                                 v1::PingResponse* response) override;

  // Graph sessions (Note [Graph sessions] in server/session/session_store.h), in
  // session_calls.cc. Forward, Backward and Extend are grad calls: admitted, run on the pool,
  // logged.
  grpc::ServerUnaryReactor* Forward(grpc::CallbackServerContext* context,
                                    const v1::ForwardRequest* request,
                                    v1::ForwardResponse* response) override;
  grpc::ServerUnaryReactor* Backward(grpc::CallbackServerContext* context,
                                     const v1::BackwardRequest* request,
                                     v1::BackwardResponse* response) override;
  grpc::ServerUnaryReactor* Extend(grpc::CallbackServerContext* context,
                                   const v1::ExtendRequest* request,
                                   v1::ExtendResponse* response) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* context,
                                    const v1::ReleaseRequest* request,
                                    v1::ReleaseResponse* response) override;

  // Shared memory (Note [Shared-memory regions] in server/shared_memory/registry.h), in
  // shared_memory_calls.cc: answered inline, taking no engine slot.
  grpc::ServerUnaryReactor* RegisterSharedMemory(
      grpc::CallbackServerContext* context, const v1::RegisterSharedMemoryRequest* request,
      v1::RegisterSharedMemoryResponse* response) override;
  grpc::ServerUnaryReactor* UnregisterSharedMemory(
      grpc::CallbackServerContext* context, const v1::UnregisterSharedMemoryRequest* request,
      v1::UnregisterSharedMemoryResponse* response) override;

  // From now on grad calls are refused with UNAVAILABLE; those admitted go on. Ends every
  // session: their ids are NOT_FOUND from now on, and session calls say that the server
  // ended them.
  void StartDraining();
  // Blocks until no grad call is admitted, or timeout passes. True if none is.
  bool WaitUntilIdle(absl::Duration timeout);
  v1::Counters counters() const;
  // What GetServerInfo answers: the static part and the counters now.
  v1::ServerInfo Info() const;
  // Grad calls and session Backward calls that ran inline on gRPC's thread (Note [Inline or
  // pool], Note [Session calls inline]).
  int64_t requests_inline() const { return requests_inline_.load(std::memory_order_relaxed); }
  // The Prometheus text of the server's metrics now (docs/operations.md, "Metrics").
  std::string MetricsText() const;
  // The budget all requests draw from (Note [Sizing the server's memory]).
  const std::shared_ptr<MemoryBudget>& memory() const { return memory_; }
  const UploadTracker& uploads() const { return uploads_; }
  const SessionStore& sessions() const { return *sessions_; }
  const SharedMemoryRegistry& shared_memory() const { return *shared_memory_; }
  // The GPUs and simulated devices requests' bare "cuda" and "sim" spread over (Note [Bare
  // device names]).
  const DeviceLoad& device_load() const { return device_load_; }

 private:
  class UnaryGradReactor;
  class StreamGradReactor;
  class SessionReactor;

  // One admitted grad request on its way through the worker pool.
  struct Job {
    metrics::Rpc rpc = metrics::Rpc::kComputeGradients;
    std::string trace;         // the call's trace id (Note [Trace ids]), or empty
    Tenant* tenant = nullptr;  // null without a token file
    absl::Time received;
    const v1::GradRequest* request = nullptr;  // the call's UnaryMessages, or the reactor's
    v1::GradResponse* response = nullptr;      // likewise
    int64_t request_bytes = 0;
    // The records of a unary request's ops as sent (UnaryMessages::op_records), or null.
    const std::string* op_records = nullptr;
    // The chunks that hold the request's big tensors' bytes: a streamed request's, which
    // *request was parsed from (Note [Tensor bytes left in the chunks]), or those taken out of
    // a big unary request (Note [Unary tensor bytes taken]); owned by the reactor or the
    // UnaryMessages, cleared by the worker. Null when there are none.
    ChunkedRequest* chunked = nullptr;
    // Where the response's big tensors wait to be serialized; owned by the reactor or the
    // UnaryMessages.
    ChunkedResponse* deferred = nullptr;
    std::shared_ptr<autograd::CancellationToken> cancel;
    // Runs on the worker after the bookkeeping, with the request's status. Must be the last
    // use of anything the reactor owns.
    std::function<void(const absl::Status&)> done;
  };

  // The tenant of a call (Note [Who may call]): null without a token file; with one,
  // UNAUTHENTICATED if the call's token was revoked since TokenAuth let it in.
  absl::StatusOr<Tenant*> TenantOf(const grpc::CallbackServerContext* context);
  // The budget a tenant's requests draw from: its share, or the server's (tenant null).
  const std::shared_ptr<MemoryBudget>& BudgetOf(const Tenant* tenant) const {
    return tenant != nullptr ? tenant->memory() : memory_;
  }
  // Admits a grad call of tenant (may be null), counting it in flight against the tenant's
  // share and the server's bound, or says why not (and *reason, for the metrics).
  absl::Status Admit(Tenant* tenant, metrics::RejectReason* reason);
  // Queues an admitted job on the worker pool, where Run runs it and job.done follows.
  void Execute(Job job);
  // Runs an admitted job on this thread with runner and ends its accounting (EndCall); returns
  // its status. The caller destroys runner once the response is on its way (Note [Teardown after
  // the reply]).
  absl::Status Run(const Job& job, RequestRunner& runner);
  // Ends an admitted call's accounting: counters, metrics, the log line (through refusal_log_
  // for a failure), admission released. timings: the engine's, if the call reached it.
  // trace: the call's trace id (Note [Trace ids]), or empty.
  void EndCall(const std::string& request_id, absl::string_view trace, metrics::Rpc rpc,
               Tenant* tenant, const absl::Status& status, absl::Time received, int64_t nodes,
               int64_t bytes_in, int64_t bytes_out, const v1::Timings* timings = nullptr);
  // A session call's tenant, admitted; or its refusal, already counted and logged (Reject).
  absl::StatusOr<Tenant*> AdmitSessionCall(const grpc::CallbackServerContext* context,
                                           const std::string& request_id, const std::string& trace,
                                           metrics::Rpc rpc);
  // A session call's work on an engine worker: fills the call's response and *nodes (the
  // Nodes it recorded, for the log) and returns the call's status.
  using SessionWork = std::function<absl::Status(
      Tenant* tenant, const std::shared_ptr<autograd::CancellationToken>& cancel,
      absl::Time received, int64_t bytes_in, int64_t* nodes)>;
  // A session call's work tried on gRPC's thread (Note [Session calls inline]): as SessionWork,
  // or std::nullopt, having done nothing the client can see, when the call is to go to the
  // worker pool instead.
  using InlineSessionWork = std::function<std::optional<absl::Status>(
      Tenant* tenant, const std::shared_ptr<autograd::CancellationToken>& cancel,
      absl::Time received, int64_t bytes_in, int64_t* nodes)>;
  // Forward, Backward and Extend (session_calls.cc): admits the call as rpc, runs try_inline
  // on this thread if given, else (or when it declines) work on the worker pool, then ends the
  // call's accounting (EndCall) with request's and response's sizes. request, request_id and
  // response are the call's, alive until it finishes.
  grpc::ServerUnaryReactor* StartSessionCall(grpc::CallbackServerContext* context,
                                             const google::protobuf::Message& request,
                                             const std::string& request_id,
                                             const google::protobuf::Message& response,
                                             metrics::Rpc rpc, SessionWork work,
                                             InlineSessionWork try_inline = nullptr);
  // Finishes a call answered at once, taking no engine slot (Ping, GetServerInfo, Release),
  // with status, counting it in the metrics under rpc and tenant (null: none or unknown);
  // received: when it arrived. No log line: these calls are cheap and many.
  grpc::ServerUnaryReactor* FinishCounted(grpc::CallbackServerContext* context, metrics::Rpc rpc,
                                          const Tenant* tenant, absl::Time received,
                                          const grpc::Status& status);
  // Counts and logs a call refused at admission (through refusal_log_).
  void Reject(const std::string& request_id, absl::string_view trace, metrics::Rpc rpc,
              const Tenant* tenant, const absl::Status& status, metrics::RejectReason reason);

  // Lowers in_flight_ by one, waking WaitUntilIdle when it reaches 0.
  void EndInFlight();
  // Whether a request that ends with status gets a log line (--log_requests).
  bool Logs(const absl::Status& status) const;

  const ServerOptions options_;
  const absl::Time started_;
  const v1::ServerInfo info_;  // the static part of GetServerInfo's answer
  // The lines of failed and refused calls (Note [Refusals logged at a bounded rate]).
  RateLimitedLog refusal_log_;

  // Note [Admission without a lock]
  // Admit and Release run for every grad call, on many threads at once, so they take no
  // lock: Admit raises in_flight_ with a compare-and-swap bounded by max_in_flight, then
  // reads draining_; StartDraining sets draining_ before WaitUntilIdle reads in_flight_. Both
  // pairs are sequentially consistent, so either Admit sees draining_ (and takes its call
  // back) or WaitUntilIdle sees the call in flight: no call is admitted once draining was
  // seen idle. A release that brings in_flight_ to 0 signals idle_ under idle_mutex_ (a
  // std::mutex, cheap when free: Note [Why not absl::Mutex]), and WaitUntilIdle reads
  // in_flight_ under it before waiting, so that signal cannot be lost.
  std::atomic<int64_t> in_flight_{0};
  std::atomic<bool> draining_{false};
  // Guards no data: it orders EndInFlight's signal with WaitUntilIdle's check (above).
  Mutex idle_mutex_;
  CondVar idle_;

  std::atomic<int64_t> requests_total_{0};
  std::atomic<int64_t> requests_ok_{0};
  std::atomic<int64_t> requests_failed_{0};
  std::atomic<int64_t> requests_rejected_{0};
  std::atomic<int64_t> requests_inline_{0};
  std::atomic<int64_t> bytes_received_{0};
  std::atomic<int64_t> bytes_sent_{0};
  // Note [Metrics without a lock].
  metrics::RequestMetrics metrics_;

  const std::shared_ptr<MemoryBudget> memory_;  // options_.max_server_memory_bytes
  UploadTracker uploads_;
  // Note [Bare device names]: the devices registered when the service was made.
  DeviceLoad device_load_ = DeviceLoad::ForRegisteredDevices();
  const std::shared_ptr<TokenAuth> auth_;  // null without a token file
  std::unique_ptr<Tenants> tenants_;       // likewise
  // The graphs sessions hold (Note [Graph sessions]); freed before the budgets they draw from.
  std::unique_ptr<SessionStore> sessions_;
  // The regions clients registered (Note [Shared-memory regions]); likewise.
  std::unique_ptr<SharedMemoryRegistry> shared_memory_;

  // Last member: destroyed first, so workers finish while the rest is alive.
  std::unique_ptr<WorkerPool> pool_;
};

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_SERVICE_GRAD_SERVICE_H_
