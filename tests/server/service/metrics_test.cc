// The metrics address (Note [The metrics address]): a real server on loopback, real clients,
// GET /metrics with cpp-httplib's client, and Debian's Prometheus scraping it and answering
// PromQL about known traffic.

#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "engine/device/device_registry.h"
#include "gradserve/v1/gradserve.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/server/security/test_pki.h"
#include "tests/server/test_util.h"

namespace gradserve::testing {
namespace {

constexpr char kPrometheus[] = "/usr/bin/prometheus";

server::ServerOptions MetricsOptions() {
  server::ServerOptions options = TestOptions();
  options.metrics_listen = "127.0.0.1:0";
  return options;
}

// GET path on 127.0.0.1:port: the status and body (status -1 if no answer).
std::pair<int, std::string> Get(int port, const std::string& path) {
  httplib::Client http("127.0.0.1", port);
  http.set_connection_timeout(5);
  http.set_read_timeout(5);
  httplib::Result result = http.Get(path);
  if (!result) return {-1, ""};
  return {result->status, result->body};
}

// The value of the sample `series` (name and labels exactly as written) in text, if there.
std::optional<double> Sample(const std::string& text, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, series + " ")) {
      double value = 0;
      if (absl::SimpleAtod(line.substr(series.size() + 1), &value)) return value;
    }
  }
  return std::nullopt;
}

v1::GradRequest UnknownOp() {
  v1::GradRequest r = SquareRequest();
  r.mutable_graph()->mutable_ops(0)->set_op("frobnicate");
  return r;
}

// More ops than TestOptions' max_ops (5000): RESOURCE_EXHAUSTED.
v1::GradRequest TooManyOps() {
  RequestBuilder b;
  b.Leaf("x", HostTensor::Float32({1}, {1}), true);
  std::string h = "x";
  for (int i = 0; i < 5001; ++i) {
    b.Op("neg", {h}, {absl::StrCat("n", i)});
    h = absl::StrCat("n", i);
  }
  b.Op("sum", {h}, {"loss"});
  b.Grad({"loss"}, {"x"});
  return b.request();
}

// The known traffic: 5 OK (3 unary, 2 streamed), 2 INVALID_ARGUMENT, 1 RESOURCE_EXHAUSTED.
void SendKnownTraffic(client::Client& client) {
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(client.ComputeGradients(SquareRequest()).ok());
  client::CallOptions streamed;
  streamed.transport = client::CallOptions::Transport::kStream;
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(client.ComputeGradients(SquareRequest(), streamed).ok());
  v1::GradRequest hostile = UnknownOp();
  hostile.set_request_id("req-\"}\n# TYPE evil counter\nevil 1");  // never a label
  EXPECT_EQ(client.ComputeGradients(hostile).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client.ComputeGradients(UnknownOp()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client.ComputeGradients(TooManyOps()).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(MetricsEndpointTest, OffByDefault) {
  TestServer s;
  EXPECT_EQ(s.server().metrics_port(), 0);
}

TEST(MetricsEndpointTest, CountsKnownTraffic) {
  TestServer s(MetricsOptions());
  ASSERT_GT(s.server().metrics_port(), 0);
  SendKnownTraffic(s.client());
  auto [status, text] = Get(s.server().metrics_port(), "/metrics");
  ASSERT_EQ(status, 200);
  const std::string unary = "rpc=\"ComputeGradients\"";
  EXPECT_EQ(Sample(text, "gradserve_requests_total{" + unary + ",status=\"OK\",tenant=\"\"}"), 3)
      << text;
  EXPECT_EQ(Sample(text,
                   "gradserve_requests_total{rpc=\"ComputeGradientsStream\",status=\"OK\","
                   "tenant=\"\"}"),
            2);
  EXPECT_EQ(Sample(text, "gradserve_requests_total{" + unary +
                             ",status=\"INVALID_ARGUMENT\",tenant=\"\"}"),
            2);
  EXPECT_EQ(Sample(text, "gradserve_requests_total{" + unary +
                             ",status=\"RESOURCE_EXHAUSTED\",tenant=\"\"}"),
            1);
  for (const char* histogram :
       {"gradserve_request_duration_seconds", "gradserve_queue_duration_seconds",
        "gradserve_forward_duration_seconds", "gradserve_backward_duration_seconds"}) {
    EXPECT_EQ(Sample(text, absl::StrCat(histogram, "_count{", unary, ",tenant=\"\"}")), 6)
        << histogram;
    EXPECT_EQ(Sample(text, absl::StrCat(histogram, "_bucket{", unary, ",tenant=\"\",le=\"+Inf\"}")),
              6)
        << histogram;
  }
  EXPECT_GT(*Sample(text, "gradserve_nodes_total{" + unary + ",tenant=\"\"}"), 0);
  EXPECT_GT(*Sample(text, "gradserve_received_bytes_total{" + unary + ",tenant=\"\"}"), 0);
  EXPECT_GT(*Sample(text, "gradserve_sent_bytes_total{" + unary + ",tenant=\"\"}"), 0);
  EXPECT_EQ(Sample(text, "gradserve_in_flight"), 0);
  EXPECT_EQ(Sample(text, "gradserve_max_in_flight"), 16);
  EXPECT_EQ(Sample(text, "gradserve_sessions"), 0);
  EXPECT_EQ(Sample(text, "gradserve_shared_memory_regions"), 0);
  EXPECT_GT(*Sample(text, "gradserve_memory_limit_bytes"), 0);
  EXPECT_TRUE(absl::StrContains(text, "gradserve_build_info{version=\"")) << text;
  // The request id went nowhere near the text.
  EXPECT_FALSE(absl::StrContains(text, "evil")) << text;
  EXPECT_FALSE(absl::StrContains(text, "req-")) << text;

  EXPECT_EQ(Get(s.server().metrics_port(), "/").first, 404);
  EXPECT_EQ(Get(s.server().metrics_port(), "/metrics/../etc/passwd").first, 404);
}

TEST(MetricsEndpointTest, CountsTheCheapCallsUnderTheirOwnRpc) {
  TestServer s(MetricsOptions());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(s.client().Ping("hello").ok());
  ASSERT_TRUE(s.client().GetServerInfo().ok());
  // A session nobody holds: NOT_FOUND, counted all the same.
  auto stub =
      v1::GradService::NewStub(grpc::CreateChannel(s.target(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  v1::ReleaseRequest release;
  release.set_session_id("no-such-session");
  v1::ReleaseResponse released;
  EXPECT_EQ(stub->Release(&context, release, &released).error_code(), grpc::StatusCode::NOT_FOUND);

  const std::string text = Get(s.server().metrics_port(), "/metrics").second;
  EXPECT_EQ(Sample(text, R"(gradserve_requests_total{rpc="Ping",status="OK",tenant=""})"), 3)
      << text;
  EXPECT_EQ(Sample(text, R"(gradserve_requests_total{rpc="GetServerInfo",status="OK",tenant=""})"),
            1);
  EXPECT_EQ(Sample(text, R"(gradserve_requests_total{rpc="Release",status="NOT_FOUND",tenant=""})"),
            1);
  EXPECT_EQ(Sample(text, R"(gradserve_request_duration_seconds_count{rpc="Ping",tenant=""})"), 3);
  // They never reach the engine: no engine stage, no refusal, no grad call counted.
  EXPECT_FALSE(absl::StrContains(text, R"(gradserve_queue_duration_seconds_count{rpc="Ping")"));
  EXPECT_FALSE(absl::StrContains(text, R"(gradserve_requests_total{rpc="ComputeGradients")"));
}

// Memory by device and the Engine threads' busy time, read from the engine at the scrape.
TEST(MetricsEndpointTest, ReportsMemoryByDeviceAndEngineBusyTime) {
  const absl::Status registered = RegisterSimulatedDevices(1);
  ASSERT_TRUE(registered.ok() || absl::IsAlreadyExists(registered)) << registered;
  TestServer s(MetricsOptions());
  const int port = s.server().metrics_port();
  auto busy = [](const std::string& text, const char* thread) {
    return Sample(text,
                  absl::StrCat("gradserve_engine_busy_seconds_total{thread=\"", thread, "\"}"));
  };
  const std::string before = Get(port, "/metrics").second;
  for (const char* thread : {"owner", "device", "reentrant"}) {
    ASSERT_TRUE(busy(before, thread).has_value()) << thread << "\n" << before;
    EXPECT_GE(*busy(before, thread), 0) << thread;
  }
  // A 4 MiB gradient on the CPU, a small one on the simulated device (its worker thread runs
  // it).
  constexpr int kElements = 1 << 20;
  RequestBuilder b;
  b.Leaf("x", HostTensor::Float32(std::vector<float>(kElements, 1.0f), {kElements}), true);
  b.Op("mul", {"x", "x"}, {"y"});
  b.Op("sum", {"y"}, {"loss"});
  b.Grad({"loss"}, {"x"});
  ASSERT_TRUE(s.client().ComputeGradients(b.request()).ok());
  v1::GradRequest on_sim = SquareRequest();
  on_sim.mutable_graph()->mutable_leaves(0)->mutable_value()->set_device("sim:0");
  ASSERT_TRUE(s.client().ComputeGradients(on_sim).ok());

  // A device thread adds its busy stretch when it next waits, just after it hands the pass
  // back (Note [Engine busy time]): wait for that.
  std::string after = Get(port, "/metrics").second;
  for (int i = 0; i < 500 && !(*busy(after, "device") > *busy(before, "device")); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
    after = Get(port, "/metrics").second;
  }
  const std::optional<double> allocated =
      Sample(after, R"(gradserve_device_memory_allocated_bytes{device="cpu"})");
  const std::optional<double> reserved =
      Sample(after, R"(gradserve_device_memory_reserved_bytes{device="cpu"})");
  ASSERT_TRUE(allocated.has_value() && reserved.has_value()) << after;
  EXPECT_GE(*allocated, 0);
  EXPECT_LT(*allocated, 1 << 30);  // the test's own tensors, not gigabytes
  EXPECT_GE(*reserved, *allocated);
  // The 4 MiB blocks came back to the allocator's cache of big blocks (Note [Big host
  // blocks]), which reserved counts.
  EXPECT_GE(*reserved - *allocated, 4 << 20) << after;
  // The simulated device's memory is host memory, counted once, as the CPU's; the CPU keeps
  // no peak (its count is sharded by thread).
  EXPECT_FALSE(absl::StrContains(after, "device=\"sim:0\"")) << after;
  EXPECT_FALSE(
      absl::StrContains(after, "gradserve_device_memory_peak_allocated_bytes{device=\"cpu\"}"));
  EXPECT_GT(*busy(after, "owner"), *busy(before, "owner")) << after;
  EXPECT_GT(*busy(after, "device"), *busy(before, "device")) << after;
  EXPECT_LT(*busy(after, "owner"), 600);  // seconds: sane, not nanoseconds
}

TEST(MetricsEndpointTest, CountsRejectionsByReason) {
  server::ServerOptions options = MetricsOptions();
  options.max_in_flight = 1;
  TestServer s(options);
  {
    SlowCallInFlight slow(s.client());
    ASSERT_TRUE(WaitForInFlight(s.client(), 1, absl::Seconds(30)));
    EXPECT_EQ(s.client().ComputeGradients(SquareRequest()).status().code(),
              absl::StatusCode::kResourceExhausted);
    auto [status, text] = Get(s.server().metrics_port(), "/metrics");
    ASSERT_EQ(status, 200);
    EXPECT_EQ(Sample(text, "gradserve_in_flight"), 1) << text;
    EXPECT_EQ(Sample(text,
                     "gradserve_rejected_total{rpc=\"ComputeGradients\",reason=\"server_"
                     "full\",tenant=\"\"}"),
              1)
        << text;
  }
}

TEST(MetricsEndpointTest, TenantsFromTheTokenFileNeverTheirTokens) {
  constexpr char kToken[] = "alice-token-Secret42";
  TestPki pki;
  pki.Write("tokens", absl::StrCat("alice acme ", TokenDigest(kToken), "\n"));
  server::ServerOptions options = MetricsOptions();
  pki.ServeTlsWithTokens(options);
  absl::StatusOr<std::unique_ptr<server::GradServer>> server = server::GradServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<client::Client> client = pki.TokenClient((*server)->port(), kToken);
  ASSERT_TRUE(client->ComputeGradients(SquareRequest()).ok());
  auto [status, text] = Get((*server)->metrics_port(), "/metrics");
  ASSERT_EQ(status, 200);
  EXPECT_EQ(Sample(text,
                   "gradserve_requests_total{rpc=\"ComputeGradients\",status=\"OK\","
                   "tenant=\"acme\"}"),
            1)
      << text;
  EXPECT_EQ(Sample(text, "gradserve_tenant_in_flight{tenant=\"acme\"}"), 0) << text;
  EXPECT_FALSE(absl::StrContains(text, kToken));
  EXPECT_FALSE(absl::StrContains(text, TokenDigest(kToken)));
  EXPECT_FALSE(absl::StrContains(text, "alice"));  // the client's name is not a label either
}

// A free loopback port for Prometheus, which cannot be told port 0 and say which it took.
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

// Debian's prometheus as a child process scraping 127.0.0.1:target_port every second, its
// data and log in a temporary folder. Stopped (SIGTERM, then SIGKILL) when destroyed.
class PrometheusProcess {
 public:
  explicit PrometheusProcess(int target_port) {
    char dir[] = "/tmp/gradserve-prometheus-XXXXXX";
    dir_ = mkdtemp(dir);
    std::ofstream(dir_ + "/prometheus.yml")
        << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        << "scrape_configs:\n  - job_name: gradserve\n    static_configs:\n"
        << "      - targets: ['127.0.0.1:" << target_port << "']\n";
    port_ = FreePort();
    const std::vector<std::string> args = {kPrometheus, "--config.file=" + dir_ + "/prometheus.yml",
                                           "--storage.tsdb.path=" + dir_ + "/data",
                                           absl::StrCat("--web.listen-address=127.0.0.1:", port_),
                                           "--log.level=warn"};
    const std::string log = dir_ + "/prometheus.log";
    pid_ = fork();
    if (pid_ == 0) {
      FILE* out = fopen(log.c_str(), "w");
      if (out != nullptr) {
        dup2(fileno(out), 1);
        dup2(fileno(out), 2);
      }
      std::vector<char*> argv;
      for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(kPrometheus, argv.data());
      _exit(127);
    }
  }

  ~PrometheusProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      for (int i = 0; i < 100 && waitpid(pid_, nullptr, WNOHANG) == 0; ++i) {
        absl::SleepFor(absl::Milliseconds(50));
      }
      if (waitpid(pid_, nullptr, WNOHANG) == 0) {
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
      }
    }
    std::system(absl::StrCat("rm -rf '", dir_, "'").c_str());
  }

  // The value of an instant PromQL query that returns one sample, if it does.
  std::optional<double> Query(const std::string& promql) const {
    httplib::Client http("127.0.0.1", port_);
    http.set_connection_timeout(2);
    http.set_read_timeout(5);
    httplib::Result result =
        http.Get("/api/v1/query", httplib::Params{{"query", promql}}, httplib::Headers{});
    if (!result || result->status != 200) return std::nullopt;
    // {"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[T,"V"]}]}}
    static const std::regex kValue(R"re("value":\[[0-9.e+]+,"([^"]*)"\])re");
    std::smatch match;
    if (!std::regex_search(result->body, match, kValue)) return std::nullopt;
    double value = 0;
    if (!absl::SimpleAtod(match[1].str(), &value)) return std::nullopt;
    return value;
  }

  // Whether Prometheus takes promql: a query it can parse and run (whatever it returns).
  bool Runs(const std::string& promql) const {
    httplib::Client http("127.0.0.1", port_);
    http.set_connection_timeout(2);
    http.set_read_timeout(5);
    httplib::Result result =
        http.Get("/api/v1/query", httplib::Params{{"query", promql}}, httplib::Headers{});
    return result && result->status == 200 &&
           absl::StrContains(result->body, "\"status\":\"success\"");
  }

  // Polls promql until it equals want, or timeout passes; the last value seen.
  std::optional<double> WaitFor(const std::string& promql, double want,
                                absl::Duration timeout) const {
    const absl::Time until = absl::Now() + timeout;
    std::optional<double> value;
    while (absl::Now() < until) {
      value = Query(promql);
      if (value == want) break;
      absl::SleepFor(absl::Milliseconds(250));
    }
    return value;
  }

  std::string Log() const {
    std::ifstream in(dir_ + "/prometheus.log");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

 private:
  std::string dir_;
  int port_ = 0;
  pid_t pid_ = -1;
};

TEST(PrometheusTest, ScrapesTheServerAndCountsKnownTraffic) {
  if (access(kPrometheus, X_OK) != 0) {
    GTEST_SKIP() << kPrometheus << " is not installed (scripts/lib/setup.sh installs it)";
  }
  TestServer s(MetricsOptions());
  ASSERT_GT(s.server().metrics_port(), 0);
  SendKnownTraffic(s.client());
  ASSERT_TRUE(s.client().Ping().ok());
  PrometheusProcess prometheus(s.server().metrics_port());
  const absl::Duration kWait = absl::Seconds(40);  // the first scrape lands after ~6 s

  EXPECT_EQ(prometheus.WaitFor(R"(up{job="gradserve"})", 1, kWait), 1) << prometheus.Log();
  // The grad calls; the Ping is counted under its own rpc.
  EXPECT_EQ(
      prometheus.WaitFor(R"(sum(gradserve_requests_total{rpc=~"ComputeGradients.*",status="OK"}))",
                         5, kWait),
      5)
      << prometheus.Log();
  EXPECT_EQ(prometheus.Query(R"(sum(gradserve_requests_total{status="INVALID_ARGUMENT"}))"), 2);
  EXPECT_EQ(prometheus.Query(R"(sum(gradserve_requests_total{status="RESOURCE_EXHAUSTED"}))"), 1);
  EXPECT_EQ(prometheus.Query(R"(sum(gradserve_requests_total{rpc="Ping"}))"), 1);
  EXPECT_GT(prometheus.Query(R"(gradserve_engine_busy_seconds_total{thread="owner"})"), 0);
  EXPECT_EQ(prometheus.Query(R"(count(gradserve_device_memory_reserved_bytes{device="cpu"}))"), 1);
  EXPECT_EQ(prometheus.Query(
                R"(sum(gradserve_requests_total{rpc="ComputeGradientsStream",status="OK"}))"),
            2);
  // Every histogram has one observation per request that reached it.
  for (const char* histogram :
       {"gradserve_request_duration_seconds", "gradserve_queue_duration_seconds",
        "gradserve_forward_duration_seconds", "gradserve_backward_duration_seconds"}) {
    const std::string grad = R"(rpc=~"ComputeGradients.*")";
    EXPECT_EQ(prometheus.Query(absl::StrCat("sum(", histogram, "_count{", grad,
                                            "}) - sum(gradserve_requests_total{", grad, "})")),
              0)
        << histogram;
    EXPECT_EQ(prometheus.Query(absl::StrCat("sum(", histogram, "_bucket{", grad, ",le=\"+Inf\"})")),
              8)
        << histogram;
  }
  EXPECT_EQ(prometheus.Query("gradserve_in_flight"), 0);
  EXPECT_EQ(prometheus.Query("count(gradserve_build_info)"), 1);

  // The Grafana dashboard's queries run, and name only metrics the server has.
  std::ifstream in(GRADSERVE_GRAFANA_DASHBOARD);
  const std::string dashboard((std::istreambuf_iterator<char>(in)), {});
  const std::string metrics = Get(s.server().metrics_port(), "/metrics").second;
  static const std::regex kExpr(R"re("expr": "((?:[^"\\]|\\.)*)")re");
  static const std::regex kName(R"re(gradserve_[a-z_]+)re");
  int queries = 0;
  for (auto it = std::sregex_iterator(dashboard.begin(), dashboard.end(), kExpr);
       it != std::sregex_iterator(); ++it) {
    std::string expr = (*it)[1].str();
    expr = std::regex_replace(expr, std::regex(R"re(\\")re"), "\"");  // JSON's \"
    expr = std::regex_replace(expr, std::regex(R"re(\$__rate_interval)re"), "1m");
    expr = std::regex_replace(expr, std::regex(R"re(\$(job|instance|tenant))re"), ".*");
    EXPECT_TRUE(prometheus.Runs(expr)) << expr;
    for (auto name = std::sregex_iterator(expr.begin(), expr.end(), kName);
         name != std::sregex_iterator(); ++name) {
      const std::string family =
          std::regex_replace(name->str(), std::regex("_(bucket|sum|count)$"), "");
      EXPECT_TRUE(absl::StrContains(metrics, "# TYPE " + family + " ")) << family;
    }
    ++queries;
  }
  EXPECT_GE(queries, 10);
}

}  // namespace
}  // namespace gradserve::testing
