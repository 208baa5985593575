#include "client/load/workload.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/load/scenarios.h"
#include "google/protobuf/util/json_util.h"

namespace gradserve::load {
namespace {

// Room for the gRPC frame and the Chunk's own fields around the data.
constexpr int64_t kFramingBytes = 1024;

absl::StatusOr<v1::GradRequest> ReadRequestFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream text;
  text << in.rdbuf();
  v1::GradRequest request;
  if (auto s = google::protobuf::util::JsonStringToMessage(text.str(), &request); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is not a GradRequest in protobuf JSON: ", std::string(s.message())));
  }
  return request;
}

absl::StatusOr<v1::GradRequest> BuiltInGradRequest(const WorkloadSpec& spec) {
  const std::string& scenario = spec.scenario;
  const int64_t payload_bytes = spec.payload_bytes;
  if (scenario == "grad_tiny") return GradTinyRequest();
  if (scenario == "chain_10k") return Chain10kRequest();
  if (scenario == "fanin_2k") return Fanin2kRequest();
  if (scenario == "mlp") return MlpRequest();
  if (scenario == "payload") return PayloadRequest(payload_bytes);
  if (scenario == "payload_shm") {
    if (spec.shm_in_region.empty() || spec.shm_out_region.empty()) {
      return absl::InvalidArgumentError("scenario payload_shm needs its regions (LoadRegions)");
    }
    return PayloadShmRequest(payload_bytes, spec.shm_in_region, spec.shm_out_region);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown scenario '", scenario, "'; one of: ", absl::StrJoin(ScenarioNames(), ", ")));
}

Workload UnaryWorkload(std::string name, std::string method, const google::protobuf::Message& m) {
  Workload w;
  w.name = std::move(name);
  w.method = std::move(method);
  m.SerializeToString(&w.request);
  w.request_bytes = static_cast<int64_t>(w.request.size());
  return w;
}

Workload StreamedWorkload(std::string name, const v1::GradRequest& request, int64_t chunk_bytes) {
  Workload w;
  w.name = std::move(name);
  w.streamed = true;
  const std::string bytes = request.SerializeAsString();
  w.request_bytes = static_cast<int64_t>(bytes.size());
  size_t offset = 0;
  do {
    const size_t n = std::min(bytes.size() - offset, static_cast<size_t>(chunk_bytes));
    v1::Chunk& chunk = w.chunks.emplace_back();
    if (offset == 0) chunk.set_total_bytes(w.request_bytes);
    chunk.set_data(bytes.data() + offset, n);
    offset += n;
  } while (offset < bytes.size());
  return w;
}

// grad_tiny's graph as a session: one Forward, then backward_calls Backward calls, each with
// grad_tiny's call and retain_graph.
absl::StatusOr<Workload> SessionWorkload(int64_t backward_calls) {
  if (backward_calls < 1 || backward_calls > kMaxSessionBackwardCalls) {
    return absl::InvalidArgumentError(absl::StrCat("Backward calls per session must be 1 to ",
                                                   kMaxSessionBackwardCalls, "; got ",
                                                   backward_calls));
  }
  const v1::GradRequest grad = GradTinyRequest();
  v1::ForwardRequest forward;
  *forward.mutable_graph() = grad.graph();
  Workload w = UnaryWorkload("session", kForwardMethod, forward);
  w.session = true;
  w.session_backward_calls = backward_calls;
  v1::BackwardRequest backward;
  *backward.mutable_calls() = grad.calls();
  for (v1::BackwardCall& call : *backward.mutable_calls()) call.set_retain_graph(true);
  backward.SerializeToString(&w.backward_request);
  return w;
}

}  // namespace

const std::vector<std::string>& ScenarioNames() {
  static const auto* const names =
      new std::vector<std::string>{"ping",     "echo", "grad_tiny", "session",    "chain_10k",
                                   "fanin_2k", "mlp",  "payload",   "payload_shm"};
  return *names;
}

absl::StatusOr<Workload> MakeWorkload(const WorkloadSpec& spec) {
  if (spec.scenario.empty() == spec.request_file.empty()) {
    return absl::InvalidArgumentError("give either a scenario or a request file, not both");
  }
  if (spec.payload_bytes < 0) return absl::InvalidArgumentError("payload bytes must be >= 0");
  if (spec.scenario == "ping" || spec.scenario == "echo") {
    // A PingRequest, which is also the echo server's message (see kEchoMethod).
    v1::PingRequest ping;
    ping.set_payload(std::string(static_cast<size_t>(spec.payload_bytes), 'x'));
    return UnaryWorkload(spec.scenario, spec.scenario == "ping" ? kPingMethod : kEchoMethod, ping);
  }
  if (spec.scenario == "session") return SessionWorkload(spec.session_backward_calls);
  absl::StatusOr<v1::GradRequest> request =
      spec.request_file.empty() ? BuiltInGradRequest(spec) : ReadRequestFile(spec.request_file);
  if (!request.ok()) return request.status();
  const std::string name = spec.request_file.empty() ? spec.scenario : spec.request_file;

  bool stream = false;
  if (spec.transport == "stream") {
    stream = true;
  } else if (spec.transport == "auto") {
    stream = static_cast<int64_t>(request->ByteSizeLong()) + kFramingBytes > spec.max_message_bytes;
  } else if (spec.transport != "unary") {
    return absl::InvalidArgumentError(
        absl::StrCat("transport must be auto, unary or stream; got '", spec.transport, "'"));
  }
  if (!stream) return UnaryWorkload(name, kGradMethod, *request);
  const int64_t chunk =
      std::max<int64_t>(1, std::min(spec.chunk_bytes, spec.max_message_bytes - kFramingBytes));
  return StreamedWorkload(name, *request, chunk);
}

}  // namespace gradserve::load
