// The flags of gradserve-server that shape its per-request work: --log_requests,
// --max_inline_cost and --max_in_flight's refusals, checked on the real binary and through
// ServerOptions.

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/device/cuda_devices.h"
#include "gtest/gtest.h"
#include "server/process/devices_flag.h"
#include "server/service/server_options.h"
#include "tests/server/test_util.h"

namespace gradserve::testing {
namespace {

using server::ServerOptions;

TEST(ServerFlagsTest, LogRequestsParsesItsThreeValues) {
  for (ServerOptions::LogRequests v :
       {ServerOptions::LogRequests::kAll, ServerOptions::LogRequests::kErrors,
        ServerOptions::LogRequests::kNone}) {
    ServerOptions::LogRequests parsed = ServerOptions::LogRequests::kAll;
    ASSERT_TRUE(server::ParseLogRequests(server::LogRequestsName(v), &parsed).ok());
    EXPECT_EQ(parsed, v);
  }
  ServerOptions::LogRequests parsed = ServerOptions::LogRequests::kAll;
  absl::Status s = server::ParseLogRequests("some", &parsed);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "--log_requests")) << s;
  EXPECT_EQ(ServerOptions().log_requests, ServerOptions::LogRequests::kErrors);
}

TEST(ServerFlagsTest, NegativeMaxInlineCostIsRefused) {
  ServerOptions o = TestOptions();
  o.max_inline_cost = 0;
  EXPECT_TRUE(server::CheckOptions(o).ok());
  o.max_inline_cost = -1;
  absl::Status s = server::CheckOptions(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "--max_inline_cost")) << s;
}

TEST(ServerFlagsTest, BadFlagValuesStopTheBinaryWithAMessage) {
  for (const char* flag : {"--log_requests=loud", "--max_inline_cost=-5"}) {
    ServerProcess process({flag});
    EXPECT_EQ(process.WaitForExit(absl::Seconds(20)), 2) << flag;
    const std::string name = std::string(flag).substr(0, std::string(flag).find('='));
    EXPECT_TRUE(absl::StrContains(process.Log(), name)) << process.Log();
  }
}

// Note [Connection limits] (server/service/grad_server.h): durations must be positive (or
// 'inf'), the stream cap positive and within HTTP/2's int.
TEST(ServerFlagsTest, ConnectionLimitsAreChecked) {
  EXPECT_TRUE(server::CheckOptions(TestOptions()).ok());
  using Field = absl::Duration ServerOptions::*;
  for (auto [name, field] :
       {std::pair<const char*, Field>{"--max_connection_idle", &ServerOptions::max_connection_idle},
        {"--max_connection_age", &ServerOptions::max_connection_age},
        {"--max_connection_age_grace", &ServerOptions::max_connection_age_grace},
        {"--keepalive_time", &ServerOptions::keepalive_time},
        {"--keepalive_timeout", &ServerOptions::keepalive_timeout},
        {"--min_client_ping_interval", &ServerOptions::min_client_ping_interval}}) {
    ServerOptions o = TestOptions();
    o.*field = absl::InfiniteDuration();
    EXPECT_TRUE(server::CheckOptions(o).ok()) << name;
    for (absl::Duration bad : {absl::ZeroDuration(), absl::Seconds(-1)}) {
      o.*field = bad;
      absl::Status s = server::CheckOptions(o);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << name;
      EXPECT_TRUE(absl::StrContains(s.message(), name)) << s;
    }
  }
  for (int64_t bad : {int64_t{0}, int64_t{-3}, int64_t{INT32_MAX} + 1}) {
    ServerOptions o = TestOptions();
    o.max_concurrent_streams = bad;
    absl::Status s = server::CheckOptions(o);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(absl::StrContains(s.message(), "--max_concurrent_streams")) << s;
  }
}

TEST(ServerFlagsTest, BadConnectionFlagsStopTheBinary) {
  for (const char* flag :
       {"--max_connection_idle=0s", "--max_connection_age=-5m", "--keepalive_timeout=soon",
        "--max_concurrent_streams=0", "--min_client_ping_interval=0"}) {
    ServerProcess process({flag});
    EXPECT_EQ(process.WaitForExit(absl::Seconds(20)), 2) << flag;
    const std::string name = std::string(flag).substr(2, std::string(flag).find('=') - 2);
    EXPECT_TRUE(absl::StrContains(process.Log(), name)) << process.Log();
  }
}

// The start-up lines give the connection limits in force.
TEST(ServerFlagsTest, StartUpLinesGiveTheConnectionLimits) {
  ServerProcess process({"--max_connection_idle=90s", "--max_connection_age=inf",
                         "--max_concurrent_streams=7", "--min_client_ping_interval=2s"});
  ASSERT_GT(process.WaitForPort(absl::Seconds(30)), 0) << process.Log();
  const std::string log = process.Log();
  EXPECT_TRUE(absl::StrContains(log,
                                "connections: idle ones closed after 1m30s, aged out after "
                                "inf (grace 1m), keepalive ping after 1m (timeout 20s), "
                                "client pings at most every 2s, 7 streams each"))
      << log;
  EXPECT_TRUE(absl::StrContains(log, "open files: soft limit ")) << log;
}

// Note [Flag spelling] (program/flag_arguments.h): --grace-period is --grace_period; a name
// that is no flag either way still stops the server, named as typed.
TEST(ServerFlagsTest, FlagNamesMayBeWrittenWithHyphens) {
  {
    ServerProcess process({"--max-inline-cost=0", "--grace-period=1s", "--log-requests=all"});
    const int port = process.WaitForPort(absl::Seconds(30));
    ASSERT_GT(port, 0) << process.Log();
    std::unique_ptr<client::Client> client =
        client::Client::Connect(absl::StrCat("127.0.0.1:", port));
    EXPECT_TRUE(CheckSquareWorks(*client).ok());
  }
  {
    ServerProcess process({"--max-inline-cost=-5"});
    EXPECT_EQ(process.WaitForExit(absl::Seconds(20)), 2);
    EXPECT_TRUE(absl::StrContains(process.Log(), "--max_inline_cost")) << process.Log();
  }
  {
    ServerProcess process({"--no-such-flag=1"});
    EXPECT_EQ(process.WaitForExit(absl::Seconds(20)), 2);  // Note [Flags checked first]
    EXPECT_TRUE(absl::StrContains(process.Log(), "no-such-flag")) << process.Log();
  }
}

TEST(ServerFlagsTest, HelpListsTheServersFlags) {
  ServerProcess process({"--help"});
  EXPECT_EQ(process.WaitForExit(absl::Seconds(20)), 1);  // absl's exit code for --help
  for (const char* flag :
       {"--listen", "--max_in_flight", "--log_requests", "--max_inline_cost", "--grace_period",
        "--devices", "--simulated_devices", "--max_connection_idle", "--max_connection_age",
        "--max_connection_age_grace", "--keepalive_time", "--keepalive_timeout",
        "--min_client_ping_interval", "--max_concurrent_streams"}) {
    EXPECT_TRUE(absl::StrContains(process.Log(), flag)) << flag << "\n" << process.Log();
  }
}

// Sends one good and one bad request to a server started with flags; returns its log.
std::string LogOfOneGoodAndOneBadRequest(std::vector<std::string> flags) {
  ServerProcess process(std::move(flags));
  const int port = process.WaitForPort(absl::Seconds(20));
  EXPECT_GT(port, 0) << process.Log();
  if (port == 0) return "";
  std::unique_ptr<client::Client> client =
      client::Client::Connect(absl::StrCat("127.0.0.1:", port));
  EXPECT_TRUE(CheckSquareWorks(*client).ok());
  v1::GradRequest bad = SquareRequest();
  bad.set_request_id("bad");
  bad.mutable_graph()->mutable_ops(0)->set_op("frobnicate");
  EXPECT_EQ(client->ComputeGradients(bad).status().code(), absl::StatusCode::kInvalidArgument);
  // Each line is written before the call's status is sent.
  return process.Log();
}

TEST(ServerFlagsTest, LogRequestsChoosesWhichRequestsAreLogged) {
  std::string log = LogOfOneGoodAndOneBadRequest({});  // errors by default
  EXPECT_FALSE(absl::StrContains(log, "request id=square")) << log;
  EXPECT_TRUE(absl::StrContains(log, "request id=bad rpc=unary status=INVALID_ARGUMENT")) << log;

  for (const char* inline_flag : {"--max_inline_cost=0", "--max_inline_cost=16384"}) {
    log = LogOfOneGoodAndOneBadRequest({"--log_requests=all", inline_flag});
    EXPECT_TRUE(absl::StrContains(log, "request id=square rpc=unary status=OK duration_ms="))
        << log;
    EXPECT_TRUE(absl::StrContains(log, "request id=bad rpc=unary status=INVALID_ARGUMENT")) << log;
  }

  log = LogOfOneGoodAndOneBadRequest({"--log_requests=none"});
  EXPECT_FALSE(absl::StrContains(log, "request id=")) << log;
  EXPECT_TRUE(absl::StrContains(log, "listening on")) << log;
}

// A full server refuses a unary call before parsing it, and its log line names the request id
// read from the first bytes (UnaryMessages::PeekRequestId); so does the line of a request that
// does not parse (the README's paragraph on admission). The bytes: a request id, then garbage.
TEST(ServerFlagsTest, RefusedAndMalformedCallsAreLoggedWithTheirIds) {
  const std::string id_then_garbage = std::string("\x0a\x07refused", 9) + "\xff\xff\xff";
  ServerProcess process({"--max_in_flight=1"});
  const int port = process.WaitForPort(absl::Seconds(20));
  ASSERT_GT(port, 0) << process.Log();
  std::unique_ptr<client::Client> client =
      client::Client::Connect(absl::StrCat("127.0.0.1:", port));
  auto slow = std::make_unique<SlowCallInFlight>(*client);
  ASSERT_TRUE(WaitForInFlight(*client, 1, absl::Seconds(10)));
  // Refused, not found malformed: admission comes before the parse.
  EXPECT_EQ(SendUnaryBytes(client->channel(), id_then_garbage).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  slow.reset();  // cancels the slow call and waits for it
  ASSERT_TRUE(WaitForInFlight(*client, 0, absl::Seconds(10)));
  EXPECT_EQ(SendUnaryBytes(client->channel(), id_then_garbage).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  // Bytes that do not start with a request id are logged as id=-.
  EXPECT_EQ(SendUnaryBytes(client->channel(), "\xff\xff").error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  const std::string log = process.Log();
  EXPECT_TRUE(absl::StrContains(log, "request id=refused rpc=unary status=RESOURCE_EXHAUSTED"))
      << log;
  EXPECT_TRUE(absl::StrContains(log, "request id=refused rpc=unary status=INVALID_ARGUMENT"))
      << log;
  EXPECT_TRUE(absl::StrContains(log, "request id=- rpc=unary status=INVALID_ARGUMENT")) << log;
}

// Note [The server's malloc]: the start-up line names the malloc, and a build that found
// mimalloc has it loaded in the server's process.
TEST(ServerFlagsTest, StartUpLineNamesTheMallocInUse) {
  ServerProcess process(std::vector<std::string>{});
  ASSERT_GT(process.WaitForPort(absl::Seconds(30)), 0) << process.Log();
  const char* expected = GRADSERVE_SERVER_MIMALLOC ? ", malloc mimalloc)" : ", malloc glibc)";
  EXPECT_TRUE(absl::StrContains(process.Log(), expected)) << process.Log();
  EXPECT_EQ(absl::StrContains(MappedFiles(process.pid()), "libmimalloc"),
            GRADSERVE_SERVER_MIMALLOC);
}

// Note [cuBLAS loaded on first use] (engine/device/cuda/cublas_library.h): with or without a
// GPU, a server that has only worked on the CPU, matrix products included, has not loaded
// cuBLAS and the 150 MiB it brings.
TEST(ServerFlagsTest, CublasIsNotLoadedByCpuWork) {
  ServerProcess process(std::vector<std::string>{});
  const int port = process.WaitForPort(absl::Seconds(30));
  ASSERT_GT(port, 0) << process.Log();
  std::unique_ptr<client::Client> client =
      client::Client::Connect(absl::StrCat("127.0.0.1:", port));
  client::CallOptions options;
  options.timeout = absl::Seconds(30);
  absl::StatusOr<client::GradResult> r = client->Grad(SlowRequest(/*steps=*/3, /*n=*/16), options);
  ASSERT_TRUE(r.ok()) << r.status();
  const std::string mapped = MappedFiles(process.pid());
  ASSERT_TRUE(absl::StrContains(mapped, "gradserve-server")) << "cannot read the maps";
  EXPECT_FALSE(absl::StrContains(mapped, "libcublas")) << mapped;
}

// --- --devices and --simulated_devices ---

TEST(ServerFlagsTest, DevicesFlagParses) {
  absl::StatusOr<server::DeviceSelection> all = server::ParseDevicesFlag("all");
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_TRUE(all->all_gpus);
  EXPECT_FALSE(all->gpus_required);

  absl::StatusOr<server::DeviceSelection> cpu = server::ParseDevicesFlag("cpu");
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_FALSE(cpu->all_gpus);
  EXPECT_TRUE(cpu->gpus.empty());

  absl::StatusOr<server::DeviceSelection> cuda = server::ParseDevicesFlag("cpu,cuda");
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  EXPECT_TRUE(cuda->all_gpus);
  EXPECT_TRUE(cuda->gpus_required);

  absl::StatusOr<server::DeviceSelection> two = server::ParseDevicesFlag("cuda:1,cuda:0");
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->gpus, (std::vector<int>{1, 0}));

  for (const char* bad :
       {"", "gpu", "cuda:x", "cuda:-1", "cuda:0,cuda:0", "all,cpu", "cuda,cuda:0", "sim:0"}) {
    absl::StatusOr<server::DeviceSelection> s = server::ParseDevicesFlag(bad);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(absl::StrContains(s.status().message(), "--devices")) << s.status();
  }
}

TEST(ServerFlagsTest, AGpuThatDoesNotExistStopsTheServer) {
  std::string why;
  const int gpus = CudaDeviceCount(&why);
  std::vector<std::string> missing = {absl::StrCat("cuda:", gpus)};
  if (gpus == 0) missing.push_back("cuda");
  for (const std::string& device : missing) {
    ServerProcess process({absl::StrCat("--devices=cpu,", device)});
    EXPECT_EQ(process.WaitForExit(absl::Seconds(20)), 2) << device;
    const std::string log = process.Log();
    EXPECT_TRUE(absl::StrContains(log, "--devices")) << log;
    EXPECT_TRUE(absl::StrContains(log, device)) << log;
    EXPECT_TRUE(absl::StrContains(log, "does not exist")) << log;
    if (gpus == 0) {
      EXPECT_TRUE(absl::StrContains(log, why)) << log;
    }
  }
}

TEST(ServerFlagsTest, BadDevicesFlagStopsTheServer) {
  ServerProcess process({"--devices=tpu"});
  EXPECT_EQ(process.WaitForExit(absl::Seconds(20)), 2);
  EXPECT_TRUE(absl::StrContains(process.Log(), "--devices: unknown device 'tpu'")) << process.Log();
}

TEST(ServerFlagsTest, CpuOnlyAndDefaultDevicesServe) {
  for (std::vector<std::string> flags :
       {std::vector<std::string>{"--devices=cpu"}, std::vector<std::string>{}}) {
    ServerProcess process(flags);
    const int port = process.WaitForPort(absl::Seconds(20));
    ASSERT_GT(port, 0) << process.Log();
    std::unique_ptr<client::Client> client =
        client::Client::Connect(absl::StrCat("127.0.0.1:", port));
    EXPECT_TRUE(CheckSquareWorks(*client).ok());
    absl::StatusOr<v1::ServerInfo> info = client->GetServerInfo();
    ASSERT_TRUE(info.ok()) << info.status();
    ASSERT_GE(info->devices_size(), 1);
    EXPECT_EQ(info->devices(0).name(), "cpu");
    if (!flags.empty()) {
      EXPECT_EQ(info->devices_size(), 1);
    }
    // The default registers every GPU found, each with its description.
    const int gpus = flags.empty() ? CudaDeviceCount() : 0;
    EXPECT_EQ(info->devices_size(), 1 + gpus);
    for (int i = 1; i < info->devices_size(); ++i) {
      EXPECT_EQ(info->devices(i).name(), absl::StrCat("cuda:", i - 1));
      EXPECT_FALSE(info->devices(i).description().empty());
    }
  }
}

TEST(ServerFlagsTest, SimulatedDevicesAreListedAndServeRequests) {
  ServerProcess process({"--devices=cpu", "--simulated_devices=2"});
  const int port = process.WaitForPort(absl::Seconds(20));
  ASSERT_GT(port, 0) << process.Log();
  std::unique_ptr<client::Client> client =
      client::Client::Connect(absl::StrCat("127.0.0.1:", port));
  absl::StatusOr<v1::ServerInfo> info = client->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  std::vector<std::string> names;
  for (const v1::DeviceInfo& d : info->devices()) {
    names.push_back(d.name());
    EXPECT_FALSE(d.description().empty()) << d.name();
  }
  EXPECT_EQ(names, (std::vector<std::string>{"cpu", "sim:0", "sim:1"}));

  // A leaf on sim:1: the gradient is computed there and comes back as host bytes, labelled.
  v1::GradRequest request = SquareRequest();
  request.mutable_graph()->mutable_leaves(0)->mutable_value()->set_device("sim:1");
  client::CallOptions options;
  options.timeout = absl::Seconds(30);
  absl::StatusOr<client::GradResult> r = client->Grad(request, options);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->calls.size(), 1u);
  ASSERT_EQ(r->calls[0].gradients.size(), 1u);
  ASSERT_TRUE(r->calls[0].gradients[0].value);
  EXPECT_EQ(r->calls[0].gradients[0].value->ToDoubles(), (std::vector<double>{2, 4, 6}));
  EXPECT_EQ(r->calls[0].gradients[0].value->device, "sim:1");
}

// Note [Bare device names]: requests whose tensors name "sim" without an index spread over the
// simulated devices, least loaded first (here one at a time, so in turn), and a session's later
// calls keep its Forward's device.
TEST(ServerFlagsTest, BareDeviceNamesSpreadOverTheDevices) {
  ServerProcess process({"--devices=cpu", "--simulated_devices=2"});
  const int port = process.WaitForPort(absl::Seconds(20));
  ASSERT_GT(port, 0) << process.Log();
  std::unique_ptr<client::Client> client =
      client::Client::Connect(absl::StrCat("127.0.0.1:", port));
  client::CallOptions options;
  options.timeout = absl::Seconds(30);
  v1::GradRequest request = SquareRequest();
  request.mutable_graph()->mutable_leaves(0)->mutable_value()->set_device("sim");
  std::set<std::string> used;
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<client::GradResult> r = client->Grad(request, options);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->calls[0].gradients[0].value);
    EXPECT_EQ(r->calls[0].gradients[0].value->ToDoubles(), (std::vector<double>{2, 4, 6}));
    used.insert(r->calls[0].gradients[0].value->device);
  }
  EXPECT_EQ(used, (std::set<std::string>{"sim:0", "sim:1"}));

  // A session: its Extend's new leaf on "sim" joins the Forward's device. One more request
  // first, so that the Forward gets sim:1, where an unscoped "sim" would mean sim:0.
  ASSERT_TRUE(client->Grad(request, options).ok());
  v1::GradRequest forward = request;
  forward.clear_calls();
  absl::StatusOr<std::unique_ptr<client::Session>> session = client->Forward(forward, options);
  ASSERT_TRUE(session.ok()) << session.status();
  // Two more requests: a fresh choice now would be the other device than the Forward's.
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(client->Grad(request, options).ok());
  v1::Graph more;
  v1::Leaf* z = more.add_leaves();
  z->set_name("z");
  client::HostTensor::Float32({1, 1, 1}, {3}).ToProto(z->mutable_value());
  z->mutable_value()->set_device("sim");
  v1::Op* op = more.add_ops();
  op->set_op("mul");
  op->add_inputs("y");
  op->add_inputs("z");
  op->add_outputs("yz");
  absl::StatusOr<std::vector<std::pair<std::string, client::HostTensor>>> extended =
      (*session)->Extend(more, {"yz"}, options);
  ASSERT_TRUE(extended.ok()) << extended.status();
  ASSERT_EQ(extended->size(), 1u);
  absl::StatusOr<std::vector<client::CallGradients>> grads =
      (*session)->Backward({request.calls(0)}, options);
  ASSERT_TRUE(grads.ok()) << grads.status();
  EXPECT_EQ((*extended)[0].second.device, "sim:1");
  EXPECT_EQ((*grads)[0].gradients[0].value->device, "sim:1");
}

}  // namespace
}  // namespace gradserve::testing
