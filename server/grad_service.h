// The gRPC service gradserve.v1.GradService, on gRPC's callback API.
//
// Note [Request flow]
// Each call gets a small reactor that owns itself (deleted in OnDone). A grad call is first
// admitted (at most max_in_flight at once, otherwise RESOURCE_EXHAUSTED at once; UNAVAILABLE
// while draining), then handed to the WorkerPool of engine CPU workers; the gRPC thread returns
// at once and never waits on the Engine. The worker runs the request (RunGradRequest), does
// the bookkeeping (counters, the log line, releasing admission) and then finishes the
// reactor, which is the last thing it touches. The client's cancellation and deadline reach the
// work through a CancellationToken built with the call's deadline and cancelled in OnCancel.
// The streaming variant collects the chunks of the serialized request (at most
// max_request_bytes), runs it the same way, then streams the serialized response back in
// chunks of chunk_bytes.

#ifndef GRADSERVE_SERVER_GRAD_SERVICE_H_
#define GRADSERVE_SERVER_GRAD_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/autograd/cancellation.h"
#include "gradserve/v1/gradserve.grpc.pb.h"
#include "server/chunked_request.h"
#include "server/server_options.h"
#include "server/worker_pool.h"

namespace gradserve::server {

// Thread safety: the gRPC methods are called by gRPC from any thread; StartDraining,
// WaitUntilIdle and counters may be called from any thread. The destructor waits for the
// worker pool to finish what it was given; destroy the service only after the grpc::Server
// that uses it has shut down.
class GradService final : public v1::GradService::CallbackService {
 public:
  explicit GradService(ServerOptions options);
  ~GradService() override;

  grpc::ServerUnaryReactor* ComputeGradients(grpc::CallbackServerContext* context,
                                             const v1::GradRequest* request,
                                             v1::GradResponse* response) override;
  grpc::ServerBidiReactor<v1::Chunk, v1::Chunk>* ComputeGradientsStream(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const v1::ServerInfoRequest* request,
                                          v1::ServerInfo* response) override;
  grpc::ServerUnaryReactor* Ping(grpc::CallbackServerContext* context,
                                 const v1::PingRequest* request,
                                 v1::PingResponse* response) override;

  // From now on grad calls are refused with UNAVAILABLE; those admitted go on.
  void StartDraining();
  // Blocks until no grad call is admitted, or timeout passes. True if none is.
  bool WaitUntilIdle(absl::Duration timeout);
  v1::Counters counters() const;

 private:
  class UnaryGradReactor;
  class StreamGradReactor;

  // One admitted grad request on its way through the worker pool.
  struct Job {
    std::string rpc;  // "unary" or "stream", for the log
    absl::Time received;
    const v1::GradRequest* request = nullptr;  // owned by the reactor or gRPC
    v1::GradResponse* response = nullptr;      // owned by the reactor or gRPC
    int64_t request_bytes = 0;
    // A streamed request's chunks, which *request was parsed from and which hold its big
    // tensors' bytes (Note [Tensor bytes left in the chunks]); owned by the reactor, cleared
    // by the worker. Null for unary calls.
    ChunkedRequest* chunked = nullptr;
    // Where a streamed response's big tensors wait to be written into its chunks; owned by
    // the reactor. Null for unary calls.
    ChunkedResponse* deferred = nullptr;
    std::shared_ptr<autograd::CancellationToken> cancel;
    // Runs on the worker after the bookkeeping, with the request's status. Must be the last
    // use of anything the reactor owns.
    std::function<void(const absl::Status&)> done;
  };

  // Admits a grad call (counting it in flight) or says why not.
  absl::Status Admit();
  // Queues an admitted job on the worker pool.
  void Execute(Job job);
  // Ends an admitted call's accounting: counters, the log line, admission released.
  void Release(const std::string& request_id, const std::string& rpc, const absl::Status& status,
               absl::Time received, int64_t nodes, int64_t bytes_in, int64_t bytes_out);
  // Counts and logs a call refused at admission.
  void Reject(const std::string& request_id, const std::string& rpc, const absl::Status& status);

  bool Idle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return in_flight_ == 0; }

  const ServerOptions options_;
  const absl::Time started_;
  const v1::ServerInfo info_;  // the static part of GetServerInfo's answer

  mutable absl::Mutex mutex_;
  int64_t in_flight_ ABSL_GUARDED_BY(mutex_) = 0;
  bool draining_ ABSL_GUARDED_BY(mutex_) = false;

  std::atomic<int64_t> requests_total_{0};
  std::atomic<int64_t> requests_ok_{0};
  std::atomic<int64_t> requests_failed_{0};
  std::atomic<int64_t> requests_rejected_{0};
  std::atomic<int64_t> bytes_received_{0};
  std::atomic<int64_t> bytes_sent_{0};

  // Last member: destroyed first, so workers finish while the rest is alive.
  std::unique_ptr<WorkerPool> pool_;
};

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_GRAD_SERVICE_H_
