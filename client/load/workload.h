// Workload: what every call of a load run sends, serialized once before the run, so that the
// run measures the service and not the client's serialization.

#ifndef GRADSERVE_CLIENT_LOAD_WORKLOAD_H_
#define GRADSERVE_CLIENT_LOAD_WORKLOAD_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gradserve/v1/gradserve.pb.h"

namespace gradserve::load {

namespace v1 = ::gradserve::v1;

// The method of the echo server of bench/echo_server.cc. Its one message has the payload in
// field 1 (bytes), the same wire format as gradserve.v1.PingRequest, so the load tester
// builds it as a PingRequest and needs no code generated from bench/.
inline constexpr char kEchoMethod[] = "/gradserve.bench.Echo/Echo";
inline constexpr char kPingMethod[] = "/gradserve.v1.GradService/Ping";
inline constexpr char kGradMethod[] = "/gradserve.v1.GradService/ComputeGradients";
inline constexpr char kForwardMethod[] = "/gradserve.v1.GradService/Forward";
inline constexpr char kBackwardMethod[] = "/gradserve.v1.GradService/Backward";
inline constexpr char kReleaseMethod[] = "/gradserve.v1.GradService/Release";

// The most Backward calls per session of scenario session.
inline constexpr int64_t kMaxSessionBackwardCalls = 1'000'000;

// Scenario names MakeWorkload accepts, in the order --help lists them.
const std::vector<std::string>& ScenarioNames();

struct WorkloadSpec {
  // One of ScenarioNames(), or empty when request_file is given.
  std::string scenario;
  // A GradRequest in protobuf JSON; exclusive with scenario.
  std::string request_file;
  // ping and echo: payload bytes each call carries and gets back. payload and payload_shm:
  // gradient bytes.
  int64_t payload_bytes = 0;
  // "auto", "unary" or "stream": how grad requests travel. auto streams a request larger than
  // max_message_bytes.
  std::string transport = "auto";
  // The server's one-message limit (GetServerInfo), for transport "auto".
  int64_t max_message_bytes = int64_t{4} << 20;
  // Size of the chunks a streamed request is cut into.
  int64_t chunk_bytes = int64_t{4} << 20;
  // session: Backward calls per session, 1 to kMaxSessionBackwardCalls.
  int64_t session_backward_calls = 10;
  // payload_shm: the registered regions its leaf is read from and its gradient written to
  // (LoadRegions in load_regions.h).
  std::string shm_in_region;
  std::string shm_out_region;
};

struct Workload {
  std::string name;  // the scenario, or the request file's name
  bool streamed = false;
  // Unary: the full method name and the serialized request.
  std::string method;
  std::string request;
  // Streamed (ComputeGradientsStream): the request cut into chunks, the first one carrying
  // the total size.
  std::vector<v1::Chunk> chunks;
  // The serialized request's size, either way.
  int64_t request_bytes = 0;
  // Scenario session (Note [Session load] in load_calls.h): method and request are the
  // Forward's; each session then gets session_backward_calls Backward calls of
  // backward_request (a serialized BackwardRequest without its session id).
  bool session = false;
  std::string backward_request;
  int64_t session_backward_calls = 0;
};

// INVALID_ARGUMENT for an unknown scenario, a bad payload size or transport; NOT_FOUND or
// INVALID_ARGUMENT for a request file that cannot be read or parsed.
absl::StatusOr<Workload> MakeWorkload(const WorkloadSpec& spec);

}  // namespace gradserve::load

#endif  // GRADSERVE_CLIENT_LOAD_WORKLOAD_H_
