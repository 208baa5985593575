#include "server/service/grad_server.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"

namespace gradserve::server {

absl::StatusOr<std::unique_ptr<GradServer>> GradServer::Start(const ServerOptions& options) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  // Both are process-wide switches that take effect for servers built after them.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  std::unique_ptr<GradServer> server(new GradServer);
  server->service_ = std::make_unique<GradService>(options);

  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen_address, grpc::InsecureServerCredentials(),
                           &server->port_);
  builder.RegisterService(server->service_.get());
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  builder.SetMaxSendMessageSize(-1);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("could not listen on ", options.listen_address,
                     " (address in use, or not an address of this host?)"));
  }
  return server;
}

GradServer::~GradServer() {
  if (!shut_down_) Shutdown(absl::ZeroDuration());
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
  server_->Shutdown(absl::ToChronoTime(absl::Now() + flush));
  server_->Wait();
  return drained;
}

}  // namespace gradserve::server
