#include "server/service/grad_server.h"

#include <chrono>
#include <climits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "engine/tensor/storage.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "proto/chunking.h"
#include "server/limits/server_memory.h"

namespace gradserve::server {
namespace {

std::string Mib(int64_t bytes) {
  return absl::StrFormat("%.0f MiB", static_cast<double>(bytes) / (1 << 20));
}

// A duration as gRPC's int milliseconds; INT_MAX, gRPC's "never", for anything longer.
int Millis(absl::Duration d) {
  if (d >= absl::Milliseconds(INT_MAX)) return INT_MAX;
  return static_cast<int>(absl::ToInt64Milliseconds(d));
}

}  // namespace

absl::StatusOr<std::unique_ptr<GradServer>> GradServer::Start(const ServerOptions& options) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  // Note [Our own listening socket]: bound here, not by gRPC.
  absl::StatusOr<std::unique_ptr<Listener>> listener = Listener::Bind(options.listen_address);
  if (!listener.ok()) return listener.status();

  // Both are process-wide switches that take effect for servers built after them.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  // Note [Sizing the server's memory]: what the flags left at 0 comes from the container.
  ServerOptions resolved = options;
  const MemorySize memory = DetectMemory();
  if (resolved.max_server_memory_bytes == 0) {
    resolved.max_server_memory_bytes = DefaultServerMemoryBytes(memory);
  }
  if (resolved.grpc_memory_bytes == 0) resolved.grpc_memory_bytes = DefaultGrpcMemoryBytes(memory);
  SetBigBlockCacheBytes(static_cast<size_t>(CacheBytes(memory, int64_t{256} << 20)));
  chunking::BufferPool::Default().set_max_bytes(static_cast<size_t>(
      CacheBytes(memory, static_cast<int64_t>(chunking::BufferPool::kPoolBytes))));

  std::unique_ptr<GradServer> server(new GradServer);
  server->memory_line_ = absl::StrFormat(
      "memory: %s for requests (--max_server_memory_bytes), %s for gRPC's buffers "
      "(--grpc_memory_bytes), of %s (%s); reuse caches at most %s and %s",
      Mib(resolved.max_server_memory_bytes), Mib(resolved.grpc_memory_bytes), Mib(memory.bytes),
      memory.source, Mib(CacheBytes(memory, int64_t{256} << 20)),
      Mib(CacheBytes(memory, static_cast<int64_t>(chunking::BufferPool::kPoolBytes))));
  server->service_ = std::make_unique<GradService>(resolved);
  server->listener_ = *std::move(listener);

  grpc::ServerBuilder builder;
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor =
      builder.experimental().AddExternalConnectionAcceptor(
          grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD,
          grpc::InsecureServerCredentials());
  grpc::ResourceQuota quota("gradserve");
  quota.Resize(static_cast<size_t>(resolved.grpc_memory_bytes));
  builder.SetResourceQuota(quota);
  if (!resolved.accept_compressed) {
    builder.SetCompressionAlgorithmSupportStatus(GRPC_COMPRESS_DEFLATE, false);
    builder.SetCompressionAlgorithmSupportStatus(GRPC_COMPRESS_GZIP, false);
  }
  builder.RegisterService(server->service_.get());
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  builder.SetMaxSendMessageSize(-1);
  // Note [Connection limits].
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, Millis(options.max_connection_idle));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, Millis(options.max_connection_age));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
                             Millis(options.max_connection_age_grace));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, Millis(options.keepalive_time));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, Millis(options.keepalive_timeout));
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             Millis(options.min_client_ping_interval));
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 2);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             static_cast<int>(options.max_concurrent_streams));
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("gRPC could not start a server for ", options.listen_address));
  }
  server->port_ = server->listener_->port();
  server->listener_->Start(std::move(acceptor));
  return server;
}

GradServer::~GradServer() {
  if (!shut_down_ && server_ != nullptr) Shutdown(absl::ZeroDuration());
}

bool GradServer::Shutdown(absl::Duration grace) {
  shut_down_ = true;
  if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService()) {
    health->SetServingStatus(false);
  }
  service_->StartDraining();
  const bool drained = service_->WaitUntilIdle(grace);
  // Calls still running past the grace period are cancelled; gRPC waits for their reactors
  // to finish, which the cancellation makes quick. Finished calls get a moment to flush.
  const absl::Duration flush = drained ? absl::Seconds(2) : absl::ZeroDuration();
  listener_->Stop();  // before gRPC's shutdown (Note [Our own listening socket])
  server_->Shutdown(absl::ToChronoTime(absl::Now() + flush));
  server_->Wait();
  return drained;
}

}  // namespace gradserve::server
