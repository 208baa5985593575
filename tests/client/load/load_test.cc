// The load generator against real servers: closed and open loop, count, duration and time
// bounds, warm-up, round-robin over two servers, streamed requests, errors by status code,
// graph sessions.

#include <cstdio>
#include <fstream>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/load/latency_histogram.h"
#include "client/load/load_generator.h"
#include "client/load/load_options.h"
#include "client/load/workload.h"
#include "gtest/gtest.h"
#include "tests/client/load_test_util.h"

namespace gradserve::load {
namespace {

using ::gradserve::testing::LocalServer;

Workload MakeOrDie(const WorkloadSpec& spec) {
  absl::StatusOr<Workload> w = MakeWorkload(spec);
  EXPECT_TRUE(w.ok()) << w.status();
  return *w;
}

Workload Scenario(const std::string& name, int64_t payload_bytes = 0) {
  WorkloadSpec spec;
  spec.scenario = name;
  spec.payload_bytes = payload_bytes;
  return MakeOrDie(spec);
}

LoadOptions Options(const std::string& target) {
  LoadOptions o;
  o.targets = {target};
  o.max_duration = absl::Seconds(30);
  o.call_timeout = absl::Seconds(20);
  return o;
}

TEST(LoadOptionsTest, RefusesUnboundedAndOutOfRangeSettings) {
  LoadOptions o;
  o.targets = {"127.0.0.1:1"};
  o.requests = 10;
  EXPECT_TRUE(ValidateLoadOptions(o).ok());

  LoadOptions unbounded = o;
  unbounded.requests = 0;
  EXPECT_EQ(ValidateLoadOptions(unbounded).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ValidateLoadOptions(unbounded).message().find("unbounded"), std::string::npos);

  LoadOptions too_long = o;
  too_long.duration = absl::Hours(2);
  EXPECT_FALSE(ValidateLoadOptions(too_long).ok());
  LoadOptions limit_too_long = o;
  limit_too_long.max_duration = absl::Hours(2);
  EXPECT_FALSE(ValidateLoadOptions(limit_too_long).ok());
  LoadOptions too_many = o;
  too_many.requests = kMaxRequests + 1;
  EXPECT_FALSE(ValidateLoadOptions(too_many).ok());
  LoadOptions no_concurrency = o;
  no_concurrency.concurrency = 0;
  EXPECT_FALSE(ValidateLoadOptions(no_concurrency).ok());
  LoadOptions negative_rate = o;
  negative_rate.rate = -1;
  EXPECT_FALSE(ValidateLoadOptions(negative_rate).ok());
  LoadOptions bad_target = o;
  bad_target.targets = {"localhost"};
  EXPECT_FALSE(ValidateLoadOptions(bad_target).ok());
  LoadOptions no_target = o;
  no_target.targets.clear();
  EXPECT_FALSE(ValidateLoadOptions(no_target).ok());
}

TEST(LatencyHistogramTest, QuantilesWithinPrecisionAndExactExtremes) {
  LatencyHistogram h;
  for (int64_t v = 1; v <= 10'000; ++v) h.Record(v * 1000);  // 1 us .. 10 ms
  EXPECT_EQ(h.count(), 10'000);
  EXPECT_EQ(h.min_ns(), 1000);
  EXPECT_EQ(h.max_ns(), 10'000'000);
  EXPECT_NEAR(h.mean_ns(), 5'000'500, 1);
  EXPECT_NEAR(static_cast<double>(h.Quantile(0.5)), 5e6, 5e6 * 0.01);
  EXPECT_NEAR(static_cast<double>(h.Quantile(0.99)), 9.9e6, 9.9e6 * 0.01);
  EXPECT_EQ(h.Quantile(1), 10'000'000);
  int64_t total = 0;
  for (const HistogramBin& b : DisplayBins(h, 10)) total += b.count;
  EXPECT_EQ(total, h.count());
}

TEST(WorkloadTest, ScenariosAndErrors) {
  Workload ping = Scenario("ping", 100);
  EXPECT_EQ(ping.method, kPingMethod);
  EXPECT_FALSE(ping.streamed);
  Workload echo = Scenario("echo", 100);
  EXPECT_EQ(echo.method, kEchoMethod);
  EXPECT_EQ(echo.request, ping.request);  // the same wire format
  Workload tiny = Scenario("grad_tiny");
  EXPECT_EQ(tiny.method, kGradMethod);
  v1::GradRequest request;
  ASSERT_TRUE(request.ParseFromString(tiny.request));
  EXPECT_EQ(request.graph().ops_size(), 10);
  EXPECT_EQ(request.graph().leaves(0).value().shape(0), 8);

  WorkloadSpec big;
  big.scenario = "payload";
  big.payload_bytes = 8 << 20;  // more than the 4 MiB limit assumed below
  big.max_message_bytes = 4 << 20;
  big.chunk_bytes = 1 << 20;
  Workload streamed = MakeOrDie(big);
  EXPECT_TRUE(streamed.streamed);
  EXPECT_GE(streamed.chunks.size(), 8u);
  EXPECT_EQ(streamed.chunks[0].total_bytes(), streamed.request_bytes);

  WorkloadSpec bad;
  bad.scenario = "nope";
  EXPECT_EQ(MakeWorkload(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad.scenario = "payload";
  bad.payload_bytes = 3;
  EXPECT_EQ(MakeWorkload(bad).status().code(), absl::StatusCode::kInvalidArgument);
  WorkloadSpec missing;
  missing.request_file = "/nonexistent/request.json";
  EXPECT_EQ(MakeWorkload(missing).status().code(), absl::StatusCode::kNotFound);
}

TEST(LoadGeneratorTest, ClosedLoopByCountLeavesWarmupOut) {
  LocalServer server;
  LoadOptions o = Options(server.target());
  o.concurrency = 4;
  o.requests = 200;
  o.warmup = 20;
  Workload w = Scenario("grad_tiny");
  absl::StatusOr<LoadResult> r = RunLoad(o, w);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->count, 200);
  EXPECT_EQ(r->ok, 200);
  EXPECT_EQ(r->warmup_calls, 20);
  EXPECT_EQ(r->status_counts.at("OK"), 200);
  EXPECT_EQ(r->latency.count(), 200);
  EXPECT_EQ(r->bytes_up, 200 * w.request_bytes);
  EXPECT_GT(r->bytes_down, 200 * 32);  // at least the [8] float32 gradient each
  EXPECT_GT(r->rate(), 0);
  EXPECT_FALSE(r->cut_short);
  // The server saw every call, warm-up included.
  EXPECT_EQ(server.server().service().counters().requests_ok(), 220);
}

// 40 grad_tiny calls and 4 of warm-up over servers a and b, spread as `balance` says.
absl::StatusOr<LoadResult> LoadOverTwo(LocalServer& a, LocalServer& b,
                                       LoadOptions::Balance balance) {
  LoadOptions o = Options(a.target());
  o.targets = {a.target(), b.target()};
  o.balance = balance;
  o.connections = 2;
  o.concurrency = 3;
  o.requests = 40;
  o.warmup = 4;
  return RunLoad(o, Scenario("grad_tiny"));
}

// Per target, the shares are exact: calls are dealt to the targets' channels in turn.
TEST(LoadGeneratorTest, PerTargetDealsCallsInTurn) {
  LocalServer a, b;
  absl::StatusOr<LoadResult> r = LoadOverTwo(a, b, LoadOptions::Balance::kPerTarget);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ok, 40);
  EXPECT_EQ(a.server().service().counters().requests_total(), 22);
  EXPECT_EQ(b.server().service().counters().requests_total(), 22);
}

// round_robin (the default) deals calls per channel over the targets that channel has ready,
// so the shares are near even but not exact (a target whose connection comes up later misses
// the first calls): each server gets some. ReplicasCliTest checks the spread over 3000 calls.
TEST(LoadGeneratorTest, RoundRobinOverTwoServers) {
  LocalServer a, b;
  absl::StatusOr<LoadResult> r = LoadOverTwo(a, b, LoadOptions::Balance::kRoundRobin);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ok, 40);
  const int64_t on_a = a.server().service().counters().requests_total();
  const int64_t on_b = b.server().service().counters().requests_total();
  EXPECT_EQ(on_a + on_b, 44);
  EXPECT_GT(on_a, 0);
  EXPECT_GT(on_b, 0);
}

// Note [Session load]: Forward and Backward calls, each timed, over two servers; every
// session's calls reach the server that holds it (no NOT_FOUND), and none is left held.
TEST(LoadGeneratorTest, SessionScenarioKeepsSessionsOnTheirServerAndReleasesThem) {
  LocalServer a, b;
  LoadOptions o = Options(a.target());
  o.targets = {a.target(), b.target()};
  o.connections = 2;
  o.concurrency = 3;
  o.requests = 60;
  o.warmup = 4;
  WorkloadSpec spec;
  spec.scenario = "session";
  spec.session_backward_calls = 4;
  absl::StatusOr<LoadResult> r = RunLoad(o, MakeOrDie(spec));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ok, 60) << (r->status_counts.empty() ? "" : r->status_counts.begin()->first);
  for (LocalServer* s : {&a, &b}) {
    EXPECT_EQ(s->server().service().sessions().size(), 0);
    EXPECT_EQ(s->server().service().memory()->used(), 0);
  }
  spec.session_backward_calls = 0;
  EXPECT_EQ(MakeWorkload(spec).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(LoadGeneratorTest, ClosedLoopByDuration) {
  LocalServer server;
  LoadOptions o = Options(server.target());
  o.concurrency = 2;
  o.duration = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  absl::StatusOr<LoadResult> r = RunLoad(o, Scenario("ping"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_GT(r->count, 0);
  EXPECT_EQ(r->errors(), 0);
  EXPECT_GE(r->elapsed, absl::Milliseconds(250));
  EXPECT_LT(r->elapsed, absl::Seconds(5));
}

TEST(LoadGeneratorTest, OpenLoopKeepsItsRate) {
  LocalServer server;
  LoadOptions o = Options(server.target());
  o.rate = 200;
  o.concurrency = 8;
  o.duration = absl::Milliseconds(500);
  absl::StatusOr<LoadResult> r = RunLoad(o, Scenario("ping"));
  ASSERT_TRUE(r.ok()) << r.status();
  // Calls are due at 0, 5, ..., 495 ms: exactly 100 of them.
  EXPECT_EQ(r->count, 100);
  EXPECT_EQ(r->errors(), 0);
  // The schedule alone takes 0.5 s (the last call is due at 0.495 s); the upper bound is loose
  // so that a busy machine cannot fail it.
  EXPECT_GE(absl::ToDoubleSeconds(r->elapsed), 0.45);
  EXPECT_LT(absl::ToDoubleSeconds(r->elapsed), 5.0);
}

TEST(LoadGeneratorTest, OpenLoopLatencyCountsTheWaitForAStalledServer) {
  LocalServer server;
  LoadOptions o = Options(server.target());
  // Ten calls due 1 ms apart, one in flight at a time, each taking several ms on the server:
  // they queue, and the last one's latency runs from its intended send time (9 ms) to the end.
  o.rate = 1000;
  o.concurrency = 1;
  o.requests = 10;
  absl::StatusOr<LoadResult> r = RunLoad(o, Scenario("fanin_2k"));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->ok, 10);
  const int64_t elapsed_ns = absl::ToInt64Nanoseconds(r->elapsed);
  // The last call ends the run; its latency is elapsed - 9 ms (within histogram precision).
  EXPECT_GE(static_cast<double>(r->latency.max_ns()), (elapsed_ns - 9'000'000) * 0.99);
  // One call in flight at a time: a closed loop's latencies add up to about the elapsed time.
  // Here each call also waits for those before it (all are due within 9 ms), so they add up to
  // several times that, however fast or slow the server is.
  EXPECT_GT(r->latency.mean_ns() * r->latency.count(), 2.0 * static_cast<double>(elapsed_ns));
}

TEST(LoadGeneratorTest, StreamedPayload) {
  LocalServer server;
  LoadOptions o = Options(server.target());
  o.requests = 3;
  WorkloadSpec spec;
  spec.scenario = "payload";
  spec.payload_bytes = 1 << 20;
  spec.transport = "stream";
  spec.chunk_bytes = 256 << 10;
  Workload w = MakeOrDie(spec);
  ASSERT_TRUE(w.streamed);
  absl::StatusOr<LoadResult> r = RunLoad(o, w);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ok, 3);
  int64_t chunk_bytes = 0;  // the messages sent: each chunk as serialized
  for (const v1::Chunk& chunk : w.chunks) chunk_bytes += static_cast<int64_t>(chunk.ByteSizeLong());
  EXPECT_EQ(r->bytes_up, 3 * chunk_bytes);
  EXPECT_GE(r->bytes_up, 3 * (int64_t{1} << 20));
  EXPECT_GE(r->bytes_down, 3 * (int64_t{1} << 20));  // the gradient is as large as x
}

TEST(LoadGeneratorTest, ErrorsAreCountedByStatusCode) {
  LocalServer server;
  const std::string path = ::gradserve::testing::TestTempPath("bad_request.json");
  std::ofstream(path) << R"({"graph": {"leaves": [{"name": "x", "value": {"dtype": "DTYPE_FLOAT32",
      "shape": [1], "values": {"doubles": [1]}}, "requires_grad": true}],
      "ops": [{"op": "no_such_op", "inputs": ["x"], "outputs": ["y"]}]},
      "calls": [{"roots": ["y"], "inputs": ["x"]}]})";
  WorkloadSpec spec;
  spec.request_file = path;
  LoadOptions o = Options(server.target());
  o.requests = 10;
  o.concurrency = 2;
  absl::StatusOr<LoadResult> r = RunLoad(o, MakeOrDie(spec));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->count, 10);
  EXPECT_EQ(r->ok, 0);
  EXPECT_EQ(r->status_counts.at("INVALID_ARGUMENT"), 10);
  EXPECT_EQ(r->latency.count(), 0);
  std::remove(path.c_str());
}

TEST(LoadGeneratorTest, MaxDurationCutsTheRunShort) {
  LocalServer server;
  LoadOptions o = Options(server.target());
  o.requests = 100'000;
  o.concurrency = 2;
  o.max_duration = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  absl::StatusOr<LoadResult> r = RunLoad(o, Scenario("chain_10k"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->cut_short);
  EXPECT_LT(r->count, 100'000);
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
}

TEST(LoadGeneratorTest, UnreachableTargetIsUnavailable) {
  LoadOptions o = Options("127.0.0.1:1");
  o.requests = 1;
  o.max_duration = absl::Seconds(2);
  absl::StatusOr<LoadResult> r = RunLoad(o, Scenario("ping"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace gradserve::load
