// Honest clients keep being served while every kind of hostile or careless client the server
// guards against (issue 24) works on it at once: stalled uploads, requests over the memory
// budgets, responses bigger than their budget, ops whose work outlasts their deadline, names
// of a hundred kilobytes, connections opened and dropped. Bounded: GRADSERVE_SOAK_SECONDS
// (default 30) of attack, then the checks; every attacker's own answer must be a clear status,
// never INTERNAL or UNKNOWN.

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/test_util.h"

namespace gradserve::testing {
namespace {

absl::Duration SoakDuration() {
  const char* env = std::getenv("GRADSERVE_SOAK_SECONDS");
  return absl::Seconds(env != nullptr ? std::atoi(env) : 30);
}

// The statuses the attackers got, for the checks; INTERNAL or UNKNOWN fail the test.
class Outcomes {
 public:
  void Add(const std::string& attack, const absl::Status& status) {
    absl::MutexLock lock(&mutex_);
    ++counts_[absl::StrCat(attack, " ", absl::StatusCodeToString(status.code()))];
    if (status.code() == absl::StatusCode::kInternal ||
        status.code() == absl::StatusCode::kUnknown) {
      ADD_FAILURE() << attack << ": " << status;
    }
  }
  std::string Summary() {
    absl::MutexLock lock(&mutex_);
    std::string out;
    for (const auto& [what, n] : counts_) absl::StrAppend(&out, "  ", what, ": ", n, "\n");
    return out;
  }

 private:
  absl::Mutex mutex_;
  std::map<std::string, int64_t> counts_ ABSL_GUARDED_BY(mutex_);
};

v1::GradRequest BigLeafRequest(int64_t n) {
  RequestBuilder b;
  b.Leaf("x", HostTensor::Float32(std::vector<float>(n, 1.0f), {n}), true)
      .Op("exp", {"x"}, {"y"})
      .Op("mul", {"y", "y"}, {"z"})
      .Op("sum", {"z"}, {"loss"});
  b.Grad({"loss"}, {"x"});
  return b.request();
}

v1::GradRequest ResponseBomb() {
  RequestBuilder b;
  b.Leaf("x", HostTensor::Float32({1.0f}, {1, 1}), true);
  b.Op("expand", {"x"}, {"y"}, {{"size", client::IntsAttr({4096, 4096})}});
  for (int i = 0; i < 8; ++i) b.ReturnValue("y");
  return b.request();
}

v1::GradRequest LongNames() {
  const std::string name(100 << 10, 'n');
  RequestBuilder b;
  b.Leaf(name, HostTensor::Float32({1.0f, 2.0f}, {2}), true)
      .Op("mul", {name, name}, {name + "\n forged log line"})
      .Op("sum", {name + "\n forged log line"}, {"loss"});
  b.Grad({"loss"}, {name});
  return b.request();
}

TEST(HostileSoakTest, HonestCallsKeepSucceedingUnderEveryAttackAtOnce) {
  server::ServerOptions options = TestOptions();
  options.worker_threads = 2;
  options.max_in_flight = 16;
  options.max_uploads = 512;
  options.upload_idle_timeout = absl::Seconds(2);
  options.max_server_memory_bytes = 256 << 20;
  options.limits.max_memory_bytes = 64 << 20;
  options.log_requests = server::ServerOptions::LogRequests::kNone;
  TestServer server(options);
  const std::string target = server.target();
  const absl::Time end = absl::Now() + SoakDuration();
  std::atomic<bool> stop{false};
  Outcomes outcomes;
  std::vector<std::thread> attackers;

  // Stalled uploads, replaced as the server ends them.
  attackers.emplace_back([&] {
    std::vector<std::shared_ptr<grpc::Channel>> channels = Channels(target, 4);
    std::vector<std::unique_ptr<StalledUpload>> open;
    int next = 0;
    while (!stop) {
      while (open.size() < 300) {
        open.push_back(std::make_unique<StalledUpload>(channels[next++ % channels.size()]));
      }
      for (auto it = open.begin(); it != open.end();) {
        if (std::optional<grpc::Status> s = (*it)->Wait(absl::ZeroDuration())) {
          outcomes.Add(
              "stalled upload",
              absl::Status(static_cast<absl::StatusCode>(s->error_code()), s->error_message()));
          it = open.erase(it);
        } else {
          ++it;
        }
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
  });
  // Requests over the budgets: 16 MiB leaves whose intermediates need far more, streamed.
  for (int t = 0; t < 2; ++t) {
    attackers.emplace_back([&] {
      client::Client c(Channels(target, 1)[0]);
      const v1::GradRequest request = BigLeafRequest(4 << 20);
      while (!stop) outcomes.Add("memory hog", c.ComputeGradients(request).status());
    });
  }
  // A response far over the request's budget from a tiny request.
  attackers.emplace_back([&] {
    client::Client c(Channels(target, 1)[0]);
    const v1::GradRequest request = ResponseBomb();
    while (!stop) outcomes.Add("response bomb", c.ComputeGradients(request).status());
  });
  // Long work with a short deadline.
  attackers.emplace_back([&] {
    client::Client c(Channels(target, 1)[0]);
    const v1::GradRequest request = SlowRequest(400, 1024);
    client::CallOptions o;
    while (!stop) {
      o.timeout = absl::Milliseconds(300);
      outcomes.Add("deadline", c.ComputeGradients(request, o).status());
    }
  });
  // Names of 100 KiB with a newline in them.
  attackers.emplace_back([&] {
    client::Client c(Channels(target, 1)[0]);
    const v1::GradRequest request = LongNames();
    while (!stop) outcomes.Add("long names", c.ComputeGradients(request).status());
  });
  // Connections opened, used once and dropped.
  attackers.emplace_back([&] {
    while (!stop) {
      client::Client c(Channels(target, 1)[0]);
      outcomes.Add("churn", c.Ping("x").status());
    }
  });

  // The honest client: small requests, a retry on a full server as a gRPC client's retry
  // policy would, and every answer checked.
  int64_t honest_ok = 0, honest_full = 0;
  absl::Duration worst_gap;
  absl::Time last_ok = absl::Now();
  client::Client honest(Channels(target, 1)[0]);
  while (absl::Now() < end) {
    const absl::Status s = CheckSquareWorks(honest);
    if (s.ok()) {
      ++honest_ok;
      worst_gap = std::max(worst_gap, absl::Now() - last_ok);
      last_ok = absl::Now();
    } else {
      ASSERT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
      ASSERT_THAT(s.message(), ::testing::HasSubstr("--max_in_flight")) << s;
      ++honest_full;
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  stop = true;
  for (std::thread& t : attackers) t.join();
  std::cerr << "honest: " << honest_ok << " OK, " << honest_full
            << " refused as full and retried; longest gap between answers "
            << absl::FormatDuration(worst_gap) << "\nattackers:\n"
            << outcomes.Summary();
  EXPECT_GT(honest_ok, 100);
  EXPECT_LT(worst_gap, absl::Seconds(5));
  EXPECT_LT(honest_full, honest_ok / 10 + 1);
  // The attacks leave nothing behind.
  const absl::Time settle = absl::Now() + absl::Seconds(10);
  while ((server.server().service().memory()->used() != 0 ||
          server.server().service().counters().in_flight() != 0 ||
          server.server().service().uploads().open() != 0) &&
         absl::Now() < settle) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(server.server().service().memory()->used(), 0);
  EXPECT_EQ(server.server().service().counters().in_flight(), 0);
  EXPECT_EQ(server.server().service().uploads().open(), 0);
  EXPECT_TRUE(CheckSquareWorks(server.client()).ok());
}

}  // namespace
}  // namespace gradserve::testing
