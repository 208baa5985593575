#include "server/service/calls.h"

#include <chrono>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace gradserve::server {

std::shared_ptr<autograd::CancellationToken> MakeToken(const grpc::CallbackServerContext* context) {
  const auto deadline = context->deadline();
  const absl::Time d = deadline == std::chrono::system_clock::time_point::max()
                           ? absl::InfiniteFuture()
                           : absl::FromChrono(deadline);
  return std::make_shared<autograd::CancellationToken>(d);
}

void CancelWork(autograd::CancellationToken& token) {
  if (absl::Now() >= token.deadline()) {
    token.Cancel(absl::DeadlineExceededError("the call's deadline passed; the work stopped"));
  } else {
    token.Cancel(absl::CancelledError("the client cancelled the call; the work stopped"));
  }
}

grpc::ServerUnaryReactor* FinishNow(grpc::CallbackServerContext* context,
                                    const grpc::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

}  // namespace gradserve::server
