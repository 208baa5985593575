// What every call's handler uses: the token that stops a call's work, and finishing a call on
// the spot.

#ifndef GRADSERVE_SERVER_SERVICE_CALLS_H_
#define GRADSERVE_SERVER_SERVICE_CALLS_H_

#include <memory>

#include "engine/autograd/cancellation.h"
#include "grpcpp/grpcpp.h"

namespace gradserve::server {

// A token that stops the work at the call's deadline, and is cancelled by OnCancel.
std::shared_ptr<autograd::CancellationToken> MakeToken(const grpc::CallbackServerContext* context);

// What OnCancel tells the work: gRPC cancels a call both when its client gives up and when its
// deadline passes.
void CancelWork(autograd::CancellationToken& token);

// Finishes a call before its handler returns, with gRPC's default reactor, as Ping does.
grpc::ServerUnaryReactor* FinishNow(grpc::CallbackServerContext* context,
                                    const grpc::Status& status);

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_SERVICE_CALLS_H_
