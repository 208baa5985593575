// The calls a load run makes, on gRPC's callback API: no thread waits on a call. Requests are
// serialized once and shared by all calls, so nothing is copied per call: a unary call sends
// one ByteBuffer through a GenericStub; a streamed grad call sends the pre-cut, pre-serialized
// chunks of ComputeGradientsStream from a ClientBidiReactor on the same stub. Responses are
// counted as bytes, not parsed (but a Forward's, for its session id).
//
// Note [Session load]
// Scenario session measures a graph session's calls: one Forward, then N Backward calls with
// retain_graph over the held graph, then Release. Every Forward and every Backward is one call
// of the run, timed and counted like any other; so with N Backward calls per session, N of
// every N + 1 calls are Backward calls, and for a large N the figures are those of Backward
// (bench/run's session row uses N = 100). A call takes a session that has Backward calls left
// and no call in flight, on its connection (a session lives on the replica that answered its
// Forward, and the connection of a session run keeps to one: pick_first); if there is none,
// the call is a Forward, which adds one. So at most `concurrency` sessions are open per
// connection at once. A session's last Backward call sends a Release that is not timed (it
// runs beside the next calls, and costs the server what a Ping does); a session whose call
// failed is released too, and forgotten. When the run ends, Finish releases the sessions
// still held, so that none waits for the server's idle TTL.

#ifndef GRADSERVE_CLIENT_LOAD_LOAD_CALLS_H_
#define GRADSERVE_CLIENT_LOAD_LOAD_CALLS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/load/workload.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/byte_buffer.h"

namespace gradserve::load {

// One gRPC channel with its own TCP connection (a local subchannel pool, so that channels to
// the same target do not share one), and the stub the calls use.
//
// Thread safety: after Open, every member may be used from any thread at once.
class LoadConnection {
 public:
  // Opens a channel to target (client::CreateClientChannel: an address, a list of them or a
  // gRPC target URI) with credentials (null: plaintext) and waits up to connect_timeout for
  // it to connect to one of them; UNAVAILABLE naming the target if it does not.
  // sessions: a channel for a session run (Note [Session load]): pick_first, no retries
  // (client::CreateSessionChannel).
  static absl::StatusOr<std::unique_ptr<LoadConnection>> Open(
      const std::string& target, absl::Duration connect_timeout,
      const std::shared_ptr<grpc::ChannelCredentials>& credentials = nullptr,
      bool sessions = false);

  const std::string& target() const { return target_; }
  grpc::GenericStub& generic() { return generic_; }
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }

 private:
  LoadConnection(std::string target, std::shared_ptr<grpc::Channel> channel);

  const std::string target_;
  const std::shared_ptr<grpc::Channel> channel_;
  grpc::GenericStub generic_;
};

// Called once per call, on a gRPC callback thread, with the final status code and the message
// bytes sent and received.
using CallDoneFn = std::function<void(int code, int64_t bytes_up, int64_t bytes_down)>;

// Sends a workload's request. The workload is not owned and must outlive every call started.
//
// Thread safety: Start may be called from any thread at once, also from within a CallDoneFn.
class CallStarter {
 public:
  explicit CallStarter(const Workload& workload);
  ~CallStarter();

  // Starts one call on connection with context (not owned; both must live until done runs,
  // and the context must not be reused). done runs exactly once.
  void Start(LoadConnection& connection, grpc::ClientContext* context, CallDoneFn done) const;

  // Once no call is in flight: releases the sessions a session run still holds, waiting at
  // most timeout in all (Note [Session load]). Does nothing for other workloads.
  void Finish(absl::Duration timeout) const;

 private:
  struct Sessions;  // load_calls.cc

  // Scenario session's call on connection (Note [Session load]).
  void StartSessionCall(LoadConnection& connection, grpc::ClientContext* context,
                        CallDoneFn done) const;

  const Workload& workload_;
  // Scenario session's open sessions; shared with the Release calls in flight.
  const std::shared_ptr<Sessions> sessions_;
  grpc::ByteBuffer unary_request_;               // the serialized request of a unary workload
  std::vector<grpc::ByteBuffer> stream_chunks_;  // the serialized chunks of a streamed one
};

}  // namespace gradserve::load

#endif  // GRADSERVE_CLIENT_LOAD_LOAD_CALLS_H_
