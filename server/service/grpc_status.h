// absl::Status to grpc::Status (DESIGN.md section 5).

#ifndef GRADSERVE_SERVER_SERVICE_GRPC_STATUS_H_
#define GRADSERVE_SERVER_SERVICE_GRPC_STATUS_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace gradserve::server {

// The codes map 1:1 (both follow google.rpc.Code), except UNKNOWN: the server never answers
// UNKNOWN, so an unclassified error becomes INTERNAL (it can only be a bug). The message is
// ClientMessage's: one line of at most kMaxMessageBytes (Note [Quoting client strings] in
// engine/util/quote.h).
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_SERVICE_GRPC_STATUS_H_
