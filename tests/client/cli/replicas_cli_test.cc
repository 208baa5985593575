// Note [Several replicas] with the `gradserve` tool: a list of servers in --target spreads the
// calls of `gradserve load` over all of them (round_robin), `gradserve grad` takes a list and
// dns:///, and calls keep succeeding when a server of the list is killed (SIGKILL: its calls
// in flight fail UNAVAILABLE and are retried on another) or drained (SIGTERM: GOAWAY, it gets
// no new calls). Real gradserve-server processes on loopback ports; each test under 30 s.

#include <signal.h>

#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/client/load_test_util.h"
#include "tests/server/test_util.h"

namespace gradserve::testing {
namespace {

using ::testing::HasSubstr;

// The "count", "ok" and "errors" of a `gradserve load --format=json` report.
struct LoadCounts {
  double count = -1, ok = -1, errors = -1;
};

LoadCounts ParseReport(const std::string& json) {
  google::protobuf::Struct parsed;
  LoadCounts counts;
  if (!google::protobuf::util::JsonStringToMessage(json, &parsed).ok()) return counts;
  counts.count = parsed.fields().at("count").number_value();
  counts.ok = parsed.fields().at("ok").number_value();
  counts.errors = parsed.fields().at("errors").number_value();
  return counts;
}

// round_robin deals calls to the servers whose connections are up: until the others connect,
// the first takes every call (179 of 300 once in CI, where 300 calls took 85 ms). So the run is
// long enough for that start to weigh little.
TEST(ReplicasCliTest, LoadSpreadsCallsOverEveryServerOfTheList) {
  constexpr int kCalls = 3000;
  LocalServer servers[3];
  std::vector<std::string> targets;
  for (LocalServer& s : servers) targets.push_back(s.target());
  const CliRun run = RunGradserve(
      absl::StrCat("load --target=", absl::StrJoin(targets, ","), " --scenario=grad_tiny ",
                   "--requests=", kCalls, " --concurrency=4 --format=json --quiet"));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.out, HasSubstr("\"balance\": \"round_robin\""));
  EXPECT_EQ(ParseReport(run.out).ok, kCalls) << run.out;
  int64_t total = 0;
  for (LocalServer& s : servers) {
    const int64_t calls = s.server().service().counters().requests_total();
    std::printf("%s: %lld calls\n", s.target().c_str(), static_cast<long long>(calls));
    EXPECT_GE(calls, kCalls / 3 * 8 / 10) << s.target();  // within 20% of even
    total += calls;
  }
  EXPECT_EQ(total, kCalls);
}

TEST(ReplicasCliTest, GradTakesAListAndDns) {
  LocalServer a, b;
  const std::string example = absl::StrCat(GRADSERVE_EXAMPLES_DIR, "/mlp.json");
  CliRun run =
      RunGradserve(absl::StrCat("grad ", example, " --target=", a.target(), ",", b.target()));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  run = RunGradserve(absl::StrCat("grad ", example, " --target=dns:///", a.target()));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(a.server().service().counters().requests_total() +
                b.server().service().counters().requests_total(),
            2);
  // A list of names cannot be one channel: refused before any call, pointing at dns:///.
  run = RunGradserve(absl::StrCat("grad ", example, " --target=a.example:1,b.example:1"));
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.err, HasSubstr("dns:///NAME:PORT"));
  run = RunGradserve("load --target=a.example:1,b.example:1 --scenario=ping --requests=1");
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.err, HasSubstr("dns:///NAME:PORT"));
}

// Three gradserve-server processes; `gradserve load` over them for 6 s, during which one is
// stopped by `stop`; every call must succeed. With 6 calls always outstanding, about 2 are
// on their way to or in the stopped server when the signal comes.
void LoadWhileOneServerStops(int stop) {
  std::vector<std::unique_ptr<ServerProcess>> servers;
  std::vector<std::string> targets;
  for (int i = 0; i < 3; ++i) {
    servers.push_back(std::make_unique<ServerProcess>(
        std::vector<std::string>{"--worker_threads=1", "--blas_threads=1", "--grace_period=5s"}));
  }
  for (auto& s : servers) {
    const int port = s->WaitForPort(absl::Seconds(20));
    ASSERT_GT(port, 0) << s->Log();
    targets.push_back(absl::StrCat("127.0.0.1:", port));
  }
  std::future<CliRun> load = std::async(std::launch::async, [&] {
    return RunGradserve(absl::StrCat("load --target=", absl::StrJoin(targets, ","),
                                     " --scenario=grad_tiny --duration=6s --concurrency=6 "
                                     "--format=json --quiet --timeout=20s"));
  });
  absl::SleepFor(absl::Seconds(2));
  servers[1]->Signal(stop);
  const CliRun run = load.get();
  const LoadCounts counts = ParseReport(run.out);
  std::printf("after %s: %.0f calls, %.0f failed\n", stop == SIGKILL ? "SIGKILL" : "SIGTERM",
              counts.count, counts.errors);
  EXPECT_EQ(run.exit_code, 0) << run.out << run.err;
  EXPECT_GT(counts.count, 100) << run.out;
  EXPECT_EQ(counts.errors, 0) << run.out;
  if (stop == SIGTERM) {
    EXPECT_EQ(servers[1]->WaitForExit(absl::Seconds(10)), 0) << servers[1]->Log();
  }
}

TEST(ReplicasCliTest, CallsKeepSucceedingWhenAServerIsKilled) { LoadWhileOneServerStops(SIGKILL); }

TEST(ReplicasCliTest, CallsKeepSucceedingWhenAServerDrains) { LoadWhileOneServerStops(SIGTERM); }

}  // namespace
}  // namespace gradserve::testing
