// RequestMetrics: counts from many threads at once add up, labels come only from the
// server's own sets and the tenants' names (Note [Label values]), and the tenants beyond
// kMaxTenants share one series.

#include "server/metrics/request_metrics.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace gradserve::server::metrics {
namespace {

std::string Render(const RequestMetrics& m) {
  TextWriter out;
  m.Write(&out, [](int slot) { return absl::StrCat("tenant-", slot); });
  return out.Take();
}

TEST(RequestMetricsTest, CountsFromManyThreadsAddUp) {
  RequestMetrics m;
  constexpr int kThreads = 24;  // more than kShards: some share a shard
  constexpr int kCalls = 2000;
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&m] {
      CallTimes times;
      times.total_us = 30;
      times.ran = true;
      times.forward_us = 10;
      times.backward_us = 15;
      for (int c = 0; c < kCalls; ++c) {
        m.Ended(Rpc::kComputeGradients, 0, absl::StatusCode::kOk, times, 10, 100, 50);
      }
      m.Ended(Rpc::kComputeGradients, 0, absl::StatusCode::kInvalidArgument, CallTimes{}, 0, 7, 0);
      m.Rejected(Rpc::kComputeGradientsStream, 0, RejectReason::kServerFull);
    });
  }
  for (std::thread& t : threads) t.join();
  const std::string text = Render(m);
  const int64_t ok = int64_t{kThreads} * kCalls;
  EXPECT_TRUE(absl::StrContains(
      text, absl::StrCat("gradserve_requests_total{rpc=\"ComputeGradients\",status=\"OK\","
                         "tenant=\"\"} ",
                         ok, "\n")))
      << text;
  EXPECT_TRUE(absl::StrContains(
      text, absl::StrCat("gradserve_requests_total{rpc=\"ComputeGradients\",status=\"INVALID_"
                         "ARGUMENT\",tenant=\"\"} ",
                         kThreads, "\n")));
  EXPECT_TRUE(absl::StrContains(
      text, absl::StrCat("gradserve_request_duration_seconds_count{rpc=\"ComputeGradients\","
                         "tenant=\"\"} ",
                         ok + kThreads, "\n")));
  // Only the calls that reached the engine are in its stages.
  EXPECT_TRUE(absl::StrContains(
      text, absl::StrCat("gradserve_forward_duration_seconds_count{rpc=\"ComputeGradients\","
                         "tenant=\"\"} ",
                         ok, "\n")));
  EXPECT_TRUE(absl::StrContains(
      text,
      absl::StrCat("gradserve_nodes_total{rpc=\"ComputeGradients\",tenant=\"\"} ", ok * 10, "\n")));
  EXPECT_TRUE(absl::StrContains(
      text, absl::StrCat("gradserve_received_bytes_total{rpc=\"ComputeGradients\",tenant=\"\"} ",
                         ok * 100 + 7 * kThreads, "\n")));
  EXPECT_TRUE(absl::StrContains(
      text, absl::StrCat("gradserve_rejected_total{rpc=\"ComputeGradientsStream\","
                         "reason=\"server_full\",tenant=\"\"} ",
                         kThreads, "\n")));
}

TEST(RequestMetricsTest, TenantsBeyondTheBoundShareOneSeries) {
  RequestMetrics m;
  for (int tenant = 0; tenant < RequestMetrics::kMaxTenants + 10; ++tenant) {
    m.Ended(Rpc::kComputeGradients, RequestMetrics::TenantSlot(tenant), absl::StatusCode::kOk,
            CallTimes{}, 1, 1, 1);
  }
  const std::string text = Render(m);
  EXPECT_TRUE(absl::StrContains(text, "tenant=\"tenant-1\"}"));
  EXPECT_TRUE(absl::StrContains(
      text, absl::StrCat("tenant=\"tenant-", RequestMetrics::kMaxTenants, "\"}")));
  EXPECT_FALSE(absl::StrContains(
      text, absl::StrCat("tenant=\"tenant-", RequestMetrics::kMaxTenants + 1, "\"}")));
  EXPECT_TRUE(absl::StrContains(
      text,
      "gradserve_requests_total{rpc=\"ComputeGradients\",status=\"OK\",tenant=\"_other\"} 10\n"))
      << text;
}

TEST(RequestMetricsTest, NothingCountedWritesOnlyTheFamilies) {
  RequestMetrics m;
  const std::string text = Render(m);
  EXPECT_TRUE(absl::StrContains(text, "# TYPE gradserve_requests_total counter\n"));
  EXPECT_FALSE(absl::StrContains(text, "{"));
}

}  // namespace
}  // namespace gradserve::server::metrics
