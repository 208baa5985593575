// Where a client connects, and how it spreads its calls over several servers.
//
// Note [Several replicas]
// One gRPC channel can talk to several servers: its resolver turns the target into a list of
// addresses, and its load-balancing policy picks one for each call. gRPC's default policy,
// pick_first, sends every call to the first address that connects, so a client of several
// replicas (a Kubernetes headless Service, a list of hosts) would load one of them. Every
// channel the gradserve clients make (this library, the `gradserve` tool, `gradserve load`,
// the Python client and the Node.js example, each with its own copy of the same JSON) gets
// the service config kServiceConfigJson instead:
//   - `round_robin`: a connection to every address, calls dealt to the READY ones in turn;
//     an address that fails (a replica killed or draining, whose GOAWAY closes its
//     connection) is skipped until it reconnects;
//   - a retry policy for UNAVAILABLE, the status of a call that never reached a server or
//     whose connection died under it (a replica killed), and for CANCELLED as a server sends
//     it: to a call that reached a draining server in the instant its GOAWAY was on the way
//     (Note [Draining] in server/service/grad_server.h: gRPC 1.51 ends it so, before any
//     handler), or one still running when a drain's grace period ended. A call the client
//     itself cancels is never retried: gRPC ends it at once. Up to 4 attempts (maxAttempts),
//     50 ms backoff doubling to at most 1 s (gRPC jitters each), each attempt picked anew, so
//     on another replica. Safe for every method of gradserve.v1.GradService, since each is a
//     pure function of its request (ComputeGradients computes gradients and changes nothing
//     on the server); and for grpc.health.v1. gRPC replays a call only while it has buffered
//     all of it: kRetryBufferBytes of request, 32 MiB, which holds any unary request the
//     server takes by default (--max_message_bytes); larger streamed requests are not retried.
//     gRPC's own default, 256 KiB, is not only smaller but unsafe in 1.51: a call over it
//     that a GOAWAY turned back before the server read it was still retried, with an empty
//     message (seen in python_cgroup_memory under load: the server logged requests of 0
//     bytes as INVALID_ARGUMENT, the client got UNAVAILABLE).
// The target may be what gRPC takes ("host:port", "dns:///host:port" for a name whose
// addresses are the replicas, "ipv4:a:p,b:p", "unix:path") or a comma-separated list of IP
// addresses ("10.0.0.1:50051,10.0.0.2:50051", "[::1]:50051,[::1]:50052"), which GrpcTarget
// turns into gRPC's ipv4: or ipv6: list. A list of host names is refused: gRPC resolves one
// name per channel, so use dns:/// with a name that resolves to every replica. The service
// config is the channel's default and is never replaced by one from DNS (TXT records).
// Supported by Debian 12's gRPC 1.51 (C++ and python3-grpcio) and by @grpc/grpc-js 1.8 and
// later (retries); round_robin by all of them.
//
// Thread safety: pure functions.

#ifndef GRADSERVE_CLIENT_LIBRARY_CHANNEL_TARGET_H_
#define GRADSERVE_CLIENT_LIBRARY_CHANNEL_TARGET_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace gradserve::client {

// The request bytes gRPC keeps per call so that it can replay it (Note [Several replicas]).
inline constexpr int kRetryBufferBytes = 32 << 20;

// The service config of every client channel (Note [Several replicas]).
inline constexpr char kServiceConfigJson[] =
    R"({"loadBalancingConfig": [{"round_robin": {}}], "methodConfig": [{"name": [)"
    R"({"service": "gradserve.v1.GradService"}, {"service": "grpc.health.v1.Health"}], )"
    R"("retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.05s", "maxBackoff": "1s", )"
    R"("backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE", "CANCELLED"]}}]})";

// The gRPC target for target: a list of IP addresses as gRPC's "ipv4:" or "ipv6:" list, a
// single address or a gRPC target URI unchanged. INVALID_ARGUMENT naming the entry for an
// empty target, a list entry that is not IP:PORT or [IPV6]:PORT, or a list that mixes IPv4
// and IPv6.
absl::StatusOr<std::string> GrpcTarget(const std::string& target);

// A channel to target (GrpcTarget's rules; a target it refuses is given to gRPC as it is,
// whose calls then fail with UNAVAILABLE) with credentials (null: plaintext), args, and the
// service config of Note [Several replicas].
std::shared_ptr<grpc::Channel> CreateClientChannel(
    const std::string& target, const std::shared_ptr<grpc::ChannelCredentials>& credentials,
    grpc::ChannelArguments args);

// The service config of a channel for graph sessions: pick_first and no retries, so that every
// call goes over the one connection that answered the session's Forward, to the replica that
// holds it (docs/sessions.md, "Several replicas"); a retry on another replica could only get
// NOT_FOUND.
inline constexpr char kSessionServiceConfigJson[] =
    R"({"loadBalancingConfig": [{"pick_first": {}}]})";

// CreateClientChannel's channel with kSessionServiceConfigJson instead.
std::shared_ptr<grpc::Channel> CreateSessionChannel(
    const std::string& target, const std::shared_ptr<grpc::ChannelCredentials>& credentials,
    grpc::ChannelArguments args);

}  // namespace gradserve::client

#endif  // GRADSERVE_CLIENT_LIBRARY_CHANNEL_TARGET_H_
