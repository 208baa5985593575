#include "server/service/grad_server.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "engine/tensor/storage.h"
#include "grpc/grpc.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "proto/chunking.h"
#include "server/limits/server_memory.h"

namespace gradserve::server {
namespace {

// Note [Draining], step 5: how long calls other than grad calls may stay open once the last
// grad call ended.
constexpr absl::Duration kFlush = absl::Seconds(2);

// Note [Draining], step 5: waits until no grad call is open, admitted or still uploading, or
// until `until`; true if none is. Uploads signal nothing when they end, so they are polled.
bool GradCallsEnd(GradService& service, absl::Time until) {
  for (;;) {
    if (!service.WaitUntilIdle(until - absl::Now())) return false;
    if (service.uploads().open() == 0) return true;
    if (absl::Now() >= until) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
}

std::string Mib(int64_t bytes) {
  return absl::StrFormat("%.0f MiB", static_cast<double>(bytes) / (1 << 20));
}

// A duration as gRPC's int milliseconds; INT_MAX, gRPC's "never", for anything longer.
int Millis(absl::Duration d) {
  if (d >= absl::Milliseconds(INT_MAX)) return INT_MAX;
  return static_cast<int>(absl::ToInt64Milliseconds(d));
}

// t as gRPC's C API takes it.
gpr_timespec GprTime(absl::Time t) {
  if (t == absl::InfiniteFuture()) return gpr_inf_future(GPR_CLOCK_REALTIME);
  const timespec ts = absl::ToTimespec(t);
  gpr_timespec g;
  g.tv_sec = ts.tv_sec;
  g.tv_nsec = static_cast<int32_t>(ts.tv_nsec);
  g.clock_type = GPR_CLOCK_REALTIME;
  return g;
}

}  // namespace

// Note [The admin address]: GetServerInfo, from the serving port's GradService.
class GradServer::AdminService final : public v1::GradService::CallbackService {
 public:
  explicit AdminService(const GradService* service) : service_(service) {}

  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const v1::ServerInfoRequest* /*request*/,
                                          v1::ServerInfo* response) override {
    *response = service_->Info();
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  const GradService* const service_;
};

absl::StatusOr<std::unique_ptr<GradServer>> GradServer::Start(const ServerOptions& options) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  // Note [Who may call]: read before the port is bound, so that bad files fail the start.
  absl::StatusOr<ServerSecurity> security = SetUpSecurity(options.security);
  if (!security.ok()) return security.status();
  // Note [Our own listening socket]: bound here, not by gRPC.
  absl::StatusOr<std::unique_ptr<Listener>> listener = Listener::Bind(options.listen_address);
  if (!listener.ok()) return listener.status();

  // Both are process-wide switches that take effect for servers built after them.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  // Note [Sizing the server's memory]: what the flags left at 0 comes from the container.
  ServerOptions resolved = options;
  const MemorySize memory = options.memory.has_value() ? *options.memory : DetectMemory();
  if (resolved.max_server_memory_bytes == 0) {
    resolved.max_server_memory_bytes = DefaultServerMemoryBytes(memory);
  }
  if (resolved.grpc_memory_bytes == 0) resolved.grpc_memory_bytes = DefaultGrpcMemoryBytes(memory);
  // Where each figure came from, for the start-up line: a flag, or a share of the memory.
  auto from = [&](int64_t flag, double share) {
    return flag != 0 ? std::string("flag")
                     : absl::StrFormat("%.0f%% of %s", share * 100, Mib(memory.bytes));
  };
  SetBigBlockCacheBytes(static_cast<size_t>(CacheBytes(memory, int64_t{256} << 20)));
  chunking::BufferPool::Default().set_max_bytes(static_cast<size_t>(
      CacheBytes(memory, static_cast<int64_t>(chunking::BufferPool::kPoolBytes))));

  std::unique_ptr<GradServer> server(new GradServer);
  server->security_ = *std::move(security);
  server->memory_line_ = absl::StrFormat(
      "memory: %s for requests (--max_server_memory_bytes: %s), %s for gRPC's buffers "
      "(--grpc_memory_bytes: %s), of %s (%s); reuse caches at most %s and %s",
      Mib(resolved.max_server_memory_bytes),
      from(options.max_server_memory_bytes, kServerBudgetShare), Mib(resolved.grpc_memory_bytes),
      from(options.grpc_memory_bytes, kGrpcQuotaShare), Mib(memory.bytes), memory.source,
      Mib(CacheBytes(memory, int64_t{256} << 20)),
      Mib(CacheBytes(memory, static_cast<int64_t>(chunking::BufferPool::kPoolBytes))));
  server->service_ = std::make_unique<GradService>(resolved, server->security_.auth);
  server->listener_ = *std::move(listener);

  grpc::ServerBuilder builder;
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor =
      builder.experimental().AddExternalConnectionAcceptor(
          grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD,
          server->security_.credentials);
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
  if (!options.security.admin_listen.empty()) {  // Note [The admin address]
    server->admin_service_ = std::make_unique<AdminService>(server->service_.get());
    grpc::ServerBuilder admin;
    admin.AddListeningPort(options.security.admin_listen, grpc::InsecureServerCredentials(),
                           &server->admin_port_);
    admin.RegisterService(server->admin_service_.get());
    server->admin_server_ = admin.BuildAndStart();
    if (server->admin_server_ == nullptr || server->admin_port_ == 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot listen on --admin_listen ", options.security.admin_listen));
    }
  }
  if (!options.metrics_listen.empty()) {  // Note [The metrics address]
    const GradService* service = server->service_.get();
    absl::StatusOr<std::unique_ptr<metrics::MetricsEndpoint>> endpoint =
        metrics::MetricsEndpoint::Start(options.metrics_listen,
                                        [service] { return service->MetricsText(); });
    if (!endpoint.ok()) return endpoint.status();
    server->metrics_ = *std::move(endpoint);
  }
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
  if (shut_down_) return drained_;
  shut_down_ = true;
  const absl::Time deadline = absl::Now() + grace;
  // Note [Draining], steps 1 to 3.
  listener_->Stop();
  for (grpc::Server* s : {server_.get(), admin_server_.get()}) {
    if (s == nullptr) continue;
    if (grpc::HealthCheckServiceInterface* health = s->GetHealthCheckService()) {
      health->Shutdown();  // NOT_SERVING for every service, for good
    }
  }
  // GOAWAY now, through gRPC's C API: grpc::Server::Shutdown sends it too, but then waits
  // until its deadline while a health Watch is open (step 5). The queue is the C one, since a
  // C++ CompletionQueue would take the tag for an object of its own.
  grpc_completion_queue* shutdown_queue = grpc_completion_queue_create_for_next(nullptr);
  int shutdown_tag = 0;
  grpc_server_shutdown_and_notify(server_->c_server(), shutdown_queue, &shutdown_tag);
  // True once gRPC has finished every call (and closed every connection), waiting until `until`.
  bool finished = false;
  auto finish_by = [&](absl::Time until) {
    if (!finished) {
      finished = grpc_completion_queue_next(shutdown_queue, GprTime(until), nullptr).type ==
                 GRPC_OP_COMPLETE;
    }
    return finished;
  };

  // Steps 4 and 5. A grad call that comes after the service was seen idle (one that had
  // reached gRPC's handler just before the GOAWAY, or an upload between its last chunk and its
  // admission) makes it wait again.
  bool drained = false;
  for (;;) {
    drained = GradCallsEnd(*service_, deadline);
    if (!drained || finish_by(std::min(deadline, absl::Now() + kFlush))) break;
    if (GradCallsEnd(*service_, absl::Now())) break;  // the rest never end by themselves
  }
  if (!finished) {
    service_->StartDraining();
    grpc_server_cancel_all_calls(server_->c_server());
  }
  // gRPC's own shutdown: the GOAWAY is sent and the calls are over or cancelled, so this only
  // waits for the cancelled calls' reactors, and releases what the C++ server holds.
  server_->Shutdown(absl::ToChronoTime(absl::Now()));
  server_->Wait();
  if (admin_server_ != nullptr) {
    admin_server_->Shutdown(absl::ToChronoTime(absl::Now()));
    admin_server_->Wait();
  }
  grpc_completion_queue_shutdown(shutdown_queue);
  while (grpc_completion_queue_next(shutdown_queue, gpr_inf_future(GPR_CLOCK_REALTIME), nullptr)
             .type != GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(shutdown_queue);
  drained_ = drained;
  return drained;
}

}  // namespace gradserve::server
