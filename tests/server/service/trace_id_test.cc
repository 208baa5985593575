// Trace ids (Note [Trace ids] in server/service/trace_id.h) and JSON log lines (Note [JSON
// log lines] in server/base/log.h): a real server, the C++ client, the load generator and
// raw gRPC calls with metadata of their own.

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/load/load_generator.h"
#include "client/load/load_options.h"
#include "client/load/workload.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "tests/server/test_util.h"

namespace gradserve::testing {
namespace {

constexpr char kTraceparent[] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

// The call's trailing metadata after a grad call with trace id id.
std::multimap<std::string, std::string> Trailers(client::Client& client, const std::string& id,
                                                 client::CallOptions::Transport transport) {
  std::multimap<std::string, std::string> trailers;
  client::CallOptions options;
  options.trace_id = id;
  options.transport = transport;
  options.trailing_metadata = &trailers;
  EXPECT_TRUE(client.ComputeGradients(SquareRequest(), options).ok());
  return trailers;
}

TEST(TraceIdTest, EchoedInTrailingMetadata) {
  TestServer s;
  using Transport = client::CallOptions::Transport;
  for (Transport transport : {Transport::kUnary, Transport::kStream}) {
    auto trailers = Trailers(s.client(), "req-42", transport);
    ASSERT_EQ(trailers.count("x-request-id"), 1u);
    EXPECT_EQ(trailers.find("x-request-id")->second, "req-42");
    EXPECT_EQ(trailers.count("traceparent"), 0u);
    trailers = Trailers(s.client(), kTraceparent, transport);
    ASSERT_EQ(trailers.count("traceparent"), 1u);
    EXPECT_EQ(trailers.find("traceparent")->second, kTraceparent);
    EXPECT_EQ(Trailers(s.client(), "", transport).count("x-request-id"), 0u);
  }
}

TEST(TraceIdTest, MalformedOnesAreIgnored) {
  TestServer s;
  v1::GradRequest request = SquareRequest();
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"},
           {"traceparent", "00-00000000000000000000000000000000-00f067aa0ba902b7-01"},
           {"traceparent", "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"},
           {"x-request-id", std::string(129, 'x')},
           {"x-request-id", "has space"}}) {
    grpc::ClientContext context;
    context.AddMetadata(key, value);
    v1::GradResponse response;
    auto stub = v1::GradService::NewStub(s.client().channel());
    ASSERT_TRUE(stub->ComputeGradients(&context, request, &response).ok());
    EXPECT_EQ(context.GetServerTrailingMetadata().count(key), 0u) << key << ": " << value;
  }
}

// The lines of a JSON log, each parsed (google.protobuf.Struct: a real JSON parser).
std::vector<google::protobuf::Struct> JsonLines(const std::string& log) {
  std::vector<google::protobuf::Struct> lines;
  for (absl::string_view line : absl::StrSplit(log, '\n', absl::SkipEmpty())) {
    google::protobuf::Struct parsed;
    const auto status = google::protobuf::util::JsonStringToMessage(std::string(line), &parsed);
    EXPECT_TRUE(status.ok()) << "not one JSON object: " << line;
    lines.push_back(std::move(parsed));
  }
  return lines;
}

std::string Field(const google::protobuf::Struct& s, const std::string& key) {
  auto it = s.fields().find(key);
  if (it == s.fields().end()) return "";
  return it->second.has_number_value() ? absl::StrCat(it->second.number_value())
                                       : it->second.string_value();
}

TEST(JsonLogTest, EveryLineIsOneObjectAndTheTraceIsInIt) {
  ServerProcess process({"--log_requests=all", "--log_format=json"});
  const int port = process.WaitForPort(absl::Seconds(20));
  ASSERT_GT(port, 0) << process.Log();
  std::unique_ptr<client::Client> client =
      client::Client::Connect(absl::StrCat("127.0.0.1:", port));
  client::CallOptions traced;
  traced.trace_id = kTraceparent;
  ASSERT_TRUE(client->ComputeGradients(SquareRequest(), traced).ok());
  v1::GradRequest hostile = SquareRequest();
  hostile.set_request_id("r\"}\n{\"msg\":\"forged\"\x01\x7f");
  hostile.mutable_graph()->mutable_ops(0)->set_op("frobnicate");
  traced.trace_id = "bad-1";
  EXPECT_EQ(client->ComputeGradients(hostile, traced).status().code(),
            absl::StatusCode::kInvalidArgument);

  // The load tester's ids.
  load::WorkloadSpec spec;
  spec.scenario = "grad_tiny";
  absl::StatusOr<load::Workload> workload = load::MakeWorkload(spec);
  ASSERT_TRUE(workload.ok()) << workload.status();
  load::LoadOptions options;
  options.targets = {absl::StrCat("127.0.0.1:", port)};
  options.requests = 3;
  options.trace_prefix = "run7";
  options.max_duration = absl::Seconds(30);
  ASSERT_TRUE(load::ValidateLoadOptions(options).ok());
  ASSERT_TRUE(load::RunLoad(options, *workload, nullptr).ok());

  const std::string log = process.Log();
  int requests = 0;
  bool saw_traceparent = false, saw_hostile = false;
  std::vector<std::string> load_traces;
  for (const google::protobuf::Struct& line : JsonLines(log)) {
    EXPECT_EQ(Field(line, "source"), "gradserve-server");
    EXPECT_FALSE(Field(line, "time").empty());
    EXPECT_NE(Field(line, "msg"), "forged");
    if (Field(line, "msg") != "request") continue;
    ++requests;
    EXPECT_EQ(Field(line, "rpc"), "unary");
    if (Field(line, "trace") == kTraceparent) {
      saw_traceparent = true;
      EXPECT_EQ(Field(line, "status"), "OK");
      EXPECT_GT(line.fields().at("nodes").number_value(), 0);
    }
    if (Field(line, "trace") == "bad-1") {
      saw_hostile = true;
      EXPECT_EQ(Field(line, "status"), "INVALID_ARGUMENT");
      EXPECT_TRUE(absl::StartsWith(Field(line, "id"), "r\"}\n{\"msg\"")) << Field(line, "id");
      EXPECT_TRUE(absl::StrContains(Field(line, "error"), "frobnicate"));
    }
    if (absl::StartsWith(Field(line, "trace"), "run7-"))
      load_traces.push_back(Field(line, "trace"));
  }
  EXPECT_TRUE(saw_traceparent) << log;
  EXPECT_TRUE(saw_hostile) << log;
  EXPECT_EQ(requests, 5) << log;
  EXPECT_EQ(load_traces, (std::vector<std::string>{"run7-0", "run7-1", "run7-2"})) << log;
}

TEST(JsonLogTest, AnUnknownFormatIsAUsageError) {
  ServerProcess process({"--log_format=xml"});
  EXPECT_EQ(process.WaitForExit(absl::Seconds(20)), 2);
  EXPECT_TRUE(absl::StrContains(process.Log(), "--log_format must be text or json"))
      << process.Log();
}

TEST(LoadTraceTest, PrefixIsChecked) {
  load::LoadOptions options;
  options.targets = {"127.0.0.1:1"};
  options.requests = 1;
  options.trace_prefix = "has space";
  EXPECT_FALSE(load::ValidateLoadOptions(options).ok());
  options.trace_prefix = std::string(101, 'p');
  EXPECT_FALSE(load::ValidateLoadOptions(options).ok());
  options.trace_prefix = "ok_prefix";
  EXPECT_TRUE(load::ValidateLoadOptions(options).ok());
}

}  // namespace
}  // namespace gradserve::testing
