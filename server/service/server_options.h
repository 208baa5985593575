// Everything a GradServer is configured with; server/process/main.cc fills it from flags.

#ifndef GRADSERVE_SERVER_SERVICE_SERVER_OPTIONS_H_
#define GRADSERVE_SERVER_SERVICE_SERVER_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/autograd/cancellation.h"
#include "engine/graph/interpreter.h"
#include "gradserve/v1/gradserve.pb.h"
#include "server/limits/server_memory.h"
#include "server/security/security_options.h"
#include "server/shared_memory/registry.h"

namespace gradserve::server {

struct ServerOptions {
  // host:port; port 0 picks a free port (GradServer::port() tells which).
  std::string listen_address = "127.0.0.1:50051";
  // Engine CPU worker threads: requests that run at once. 0: one per hardware thread.
  int worker_threads = 0;
  // Largest gRPC message the server receives (a unary request, one chunk of a stream).
  int64_t max_message_bytes = int64_t{32} << 20;
  // Largest serialized GradRequest, streamed in chunks.
  int64_t max_request_bytes = int64_t{1} << 30;
  // Size of the chunks a streamed response is cut into.
  int64_t chunk_bytes = int64_t{4} << 20;
  // Grad requests admitted at once (queued or running); more get RESOURCE_EXHAUSTED. A
  // streamed request is admitted once it has fully arrived (Note [Uploads apart from work]).
  int64_t max_in_flight = 32;
  // Streamed requests still arriving at once; more get RESOURCE_EXHAUSTED.
  int64_t max_uploads = 1024;
  // An upload whose client sends nothing for this long is ended with DEADLINE_EXCEEDED.
  absl::Duration upload_idle_timeout = absl::Seconds(5);
  // Graph sessions (Note [Graph sessions] in server/session/session_store.h): one no call used
  // for this long ends; a tenant (the implicit one without a token file) holds at most
  // max_sessions_per_tenant at once.
  absl::Duration session_idle_ttl = absl::Minutes(5);
  int64_t max_sessions_per_tenant = 64;
  // Shared memory for clients on the server's host (Note [Shared-memory regions] in
  // server/shared_memory/registry.h): the keys' prefix (empty: off), regions per tenant, and
  // the longest idle TTL.
  SharedMemoryOptions shared_memory;
  // What all requests together may hold: tensors, autograd state, buffered uploads, responses
  // being serialized (Note [Sizing the server's memory] in server/limits/server_memory.h).
  // 0: kServerBudgetShare of the container's memory limit, else of physical memory.
  int64_t max_server_memory_bytes = 0;
  // gRPC's resource quota for what its transports buffer; 0: kGrpcQuotaShare of the same.
  int64_t grpc_memory_bytes = 0;
  // The memory the process has, which the two above default to shares of; unset: DetectMemory()
  // (this process's cgroup, else physical memory). main.cc sets it from --cgroup_root.
  std::optional<MemorySize> memory;
  // Whether gzip- and deflate-compressed requests are taken (decompressed, and counted
  // decompressed); if not, gRPC refuses them with UNIMPLEMENTED before decompressing.
  bool accept_compressed = true;
  // Unary grad requests whose estimated cost is at most this run inline on gRPC's thread
  // instead of queuing for a worker; 0: every request goes to the workers. See Note [Inline
  // or pool] in server/run/dispatch.h for the estimate. The default is a fraction of a millisecond
  // of CPU.
  int64_t max_inline_cost = 16384;
  // Which grad requests get a log line on stderr: all of them, only failed and refused ones,
  // or none. Each line is a write to stderr, about 9% of the server's CPU for a small request
  // (docs/benchmarks.md), so by default only failures are logged.
  enum class LogRequests { kAll, kErrors, kNone };
  LogRequests log_requests = LogRequests::kErrors;
  // At most this many lines a second for failed and refused requests; the others are counted
  // in a summary line (Note [Refusals logged at a bounded rate] in server/base/log.h).
  int64_t log_refusals_per_second = 10;
  // Per-request limits enforced by the interpreter and by the request's validation.
  graph::Limits limits;
  // TLS, tokens, tenants' shares and the admin address (Note [Who may call] in
  // server/security/token_auth.h).
  SecurityOptions security;
  // host:port of the Prometheus metrics, GET /metrics over plain HTTP (Note [The metrics
  // address] in server/metrics/metrics_endpoint.h); empty: none. Port 0 picks a free port
  // (GradServer::metrics_port() tells which).
  std::string metrics_listen;
  // The malloc the process links ("glibc" or "mimalloc"), for the build_info metric.
  std::string malloc_name = "glibc";

  // Connections (Note [Connection limits] in server/service/grad_server.h says what each does
  // and why its default). An infinite duration turns off idle and age limits and keepalive.
  // A connection without calls for this long is closed (GOAWAY).
  absl::Duration max_connection_idle = absl::Minutes(5);
  // A connection is sent GOAWAY after this long (+-10%, gRPC's jitter), so that clients
  // reconnect and spread over the replicas there are now ...
  absl::Duration max_connection_age = absl::Minutes(30);
  // ... and closed this long after that GOAWAY, whatever calls are still running on it.
  absl::Duration max_connection_age_grace = absl::Minutes(1);
  // The server pings a connection after this long without activity, and closes it if the
  // ping is not answered within keepalive_timeout: a vanished client's calls and descriptor
  // are released.
  absl::Duration keepalive_time = absl::Minutes(1);
  absl::Duration keepalive_timeout = absl::Seconds(20);
  // A client may ping (keepalive) this often, with or without calls; a client that pings more
  // often than this three times is sent GOAWAY ("too_many_pings") and disconnected.
  absl::Duration min_client_ping_interval = absl::Seconds(5);
  // HTTP/2 streams (calls) at once on one connection; a client queues more until one ends.
  int64_t max_concurrent_streams = 100;

  // For tests: runs on the thread that is about to run an admitted grad request (gRPC's for
  // one that runs inline, a worker's otherwise), with its cancellation token, before the work.
  std::function<void(const v1::GradRequest&, const autograd::CancellationToken&)>
      before_run_for_testing;
};

// "all", "errors", "none": the --log_requests values.
const char* LogRequestsName(ServerOptions::LogRequests value);
// INVALID_ARGUMENT for anything but "all", "errors" or "none".
absl::Status ParseLogRequests(const std::string& text, ServerOptions::LogRequests* value);

// INVALID_ARGUMENT naming the first field that is out of range (non-positive sizes, a chunk
// larger than a message, CheckSecurityOptions' cases).
absl::Status CheckOptions(const ServerOptions& options);

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_SERVICE_SERVER_OPTIONS_H_
