#include "server/service/grpc_status.h"

#include <string>
#include <utility>

#include "engine/util/quote.h"

namespace gradserve::server {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // One line of at most kMaxMessageBytes, whatever a message quoted (Note [Quoting client
  // strings]): it travels in the call's metadata, which the client limits (8 KiB by default).
  std::string message = ClientMessage(status.message());
  if (status.code() == absl::StatusCode::kUnknown) {
    return grpc::Status(grpc::StatusCode::INTERNAL, std::move(message));
  }
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::move(message));
}

}  // namespace gradserve::server
