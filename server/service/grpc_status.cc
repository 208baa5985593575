#include "server/service/grpc_status.h"

#include <string>

namespace gradserve::server {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  if (status.code() == absl::StatusCode::kUnknown) {
    return grpc::Status(grpc::StatusCode::INTERNAL, std::string(status.message()));
  }
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

}  // namespace gradserve::server
