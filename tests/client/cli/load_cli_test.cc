// `gradserve load` end to end: the binary against local servers, its exit codes, its stdout in
// each format, its HTML file, its refusal of unbounded settings, and no progress line when
// stderr is not a terminal.

#include <dirent.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/client/load_test_util.h"

namespace gradserve::load {
namespace {

using ::gradserve::testing::CliRun;
using ::gradserve::testing::LocalServer;
using ::gradserve::testing::ReadAll;
using ::gradserve::testing::RunGradserve;
using ::gradserve::testing::TestTempPath;

// Runs `gradserve load ARGS` with stdout and stderr in files (so stderr is not a terminal).
CliRun RunCli(const std::string& args) { return RunGradserve(absl::StrCat("load ", args)); }

TEST(LoadCliTest, JsonAndHtmlAgainstTwoServersOpenLoop) {
  LocalServer a, b;
  const std::string html = TestTempPath("load_report.html");
  std::remove(html.c_str());
  CliRun run = RunCli(absl::StrCat("--target=", a.target(), ",", b.target(),
                                   " --balance=per_target --scenario=grad_tiny --rate=200 "
                                   "--requests=50 "
                                   "--concurrency=4 --format=json --html=",
                                   html));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.err, "");  // no progress line: stderr is not a terminal
  google::protobuf::Struct parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(run.out, &parsed).ok()) << run.out;
  EXPECT_EQ(parsed.fields().at("count").number_value(), 50);
  EXPECT_EQ(parsed.fields().at("open_loop_rate").number_value(), 200);
  EXPECT_EQ(parsed.fields().at("targets").list_value().values_size(), 2);
  EXPECT_EQ(a.server().service().counters().requests_total(), 25);
  EXPECT_EQ(b.server().service().counters().requests_total(), 25);
  const std::string page = ReadAll(html);
  EXPECT_EQ(page.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(page.find("<svg"), std::string::npos);
  std::remove(html.c_str());
}

TEST(LoadCliTest, SummaryAndCsv) {
  LocalServer server;
  CliRun summary = RunCli(absl::StrCat("--target=", server.target(),
                                       " --scenario=ping --payload_bytes=64 --requests=20"));
  ASSERT_EQ(summary.exit_code, 0) << summary.err;
  EXPECT_NE(summary.out.find("p99.9"), std::string::npos) << summary.out;
  EXPECT_NE(summary.out.find("[OK] 20"), std::string::npos) << summary.out;
  CliRun csv = RunCli(absl::StrCat("--target=", server.target(),
                                   " --scenario=ping --duration=200ms --format=csv --quiet"));
  ASSERT_EQ(csv.exit_code, 0) << csv.err;
  EXPECT_EQ(csv.out.rfind("metric,value\n", 0), 0u) << csv.out;
}

// Objects in /dev/shm whose names start with prefix (without the leading '/').
int SharedMemoryObjects(const std::string& prefix) {
  int n = 0;
  if (DIR* dir = opendir("/dev/shm")) {
    while (const dirent* entry = readdir(dir)) {
      if (std::string(entry->d_name).rfind(prefix, 0) == 0) ++n;
    }
    closedir(dir);
  }
  return n;
}

TEST(LoadCliTest, PayloadShmRegistersItsRegionsForTheRunOnly) {
  LocalServer server("/gradserve_ltest");
  CliRun run = RunCli(absl::StrCat("--target=", server.target(),
                                   " --scenario=payload_shm --payload_bytes=1048576 "
                                   "--requests=5 --warmup=1 --quiet"));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.out.find("[OK] 5"), std::string::npos) << run.out;
  EXPECT_EQ(server.server().service().counters().requests_ok(), 6);
  // Unregistered and unlinked when the run ends.
  EXPECT_EQ(server.server().service().shared_memory().size(), 0);
  EXPECT_EQ(SharedMemoryObjects("gradserve_ltest"), 0);

  LocalServer off;  // shared memory off: refused before any call, naming the flag
  CliRun refused = RunCli(absl::StrCat(
      "--target=", off.target(), " --scenario=payload_shm --payload_bytes=1024 --requests=1"));
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.err.find("--shared_memory_prefix"), std::string::npos) << refused.err;
  EXPECT_EQ(off.server().service().counters().requests_total(), 0);
}

TEST(LoadCliTest, RefusesBadAndUnboundedSettings) {
  CliRun unbounded = RunCli("--target=127.0.0.1:1 --scenario=ping");
  EXPECT_EQ(unbounded.exit_code, 2);
  EXPECT_NE(unbounded.err.find("unbounded"), std::string::npos) << unbounded.err;
  EXPECT_EQ(RunCli("--target=127.0.0.1:1 --scenario=ping --duration=5h").exit_code, 2);
  EXPECT_EQ(RunCli("--target=127.0.0.1:1 --scenario=nope --requests=1").exit_code, 2);
  EXPECT_EQ(RunCli("--target=127.0.0.1:1 --scenario=ping --requests=1 --format=xml").exit_code, 2);
  CliRun down = RunCli("--target=127.0.0.1:1 --scenario=ping --requests=1 --max_duration=2s");
  EXPECT_EQ(down.exit_code, 1);
  EXPECT_NE(down.err.find("UNAVAILABLE"), std::string::npos) << down.err;
}

// Note [Flag spelling] (program/flag_arguments.h): hyphens or underscores in flag names.
TEST(LoadCliTest, FlagNamesMayBeWrittenWithHyphens) {
  LocalServer server;
  CliRun run = RunCli(absl::StrCat("--target=", server.target(),
                                   " --scenario=ping --payload-bytes=64 --requests=5 "
                                   "--max-duration=20s --format=csv --quiet"));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.out.rfind("metric,value\n", 0), 0u) << run.out;
  // A name that is no flag either way is reported as it was typed.
  CliRun unknown = RunCli("--target=127.0.0.1:1 --scenario=ping --requests=1 --no-such-flag=1");
  EXPECT_EQ(unknown.exit_code, 2) << unknown.err;
  EXPECT_NE(unknown.err.find("no-such-flag"), std::string::npos) << unknown.err;
}

// Note [Flags checked first] (program/flag_arguments.h): a bad flag is a usage error, exit
// status 2, named, before any call is made; so is another command's flag.
TEST(LoadCliTest, BadFlagsExitTwoNamingThem) {
  const struct {
    const char* arguments;
    const char* message;
  } cases[] = {
      {"--scenario=ping --requests=1 --concurrency=abc",
       "Illegal value 'abc' specified for flag 'concurrency'"},
      {"--scenario=ping --requests", "flag '--requests' is missing its value"},
      {"--scenario=ping --requests=1 --count=3", "'--count=3' is not a flag of this command"},
      {"--scenario=ping --requests=1 --noquiet=1", "the negative form of a bool flag"},
  };
  for (const auto& c : cases) {
    CliRun run = RunCli(absl::StrCat("--target=127.0.0.1:1 ", c.arguments));
    EXPECT_EQ(run.exit_code, 2) << c.arguments << "\n" << run.err;
    EXPECT_NE(run.err.find(c.message), std::string::npos) << run.err;
    EXPECT_NE(run.err.find("'gradserve load --help' lists its flags"), std::string::npos)
        << run.err;
    EXPECT_EQ(run.out, "") << c.arguments;
  }
}

TEST(LoadCliTest, FailedCallsExitOneWithTheReport) {
  LocalServer server;
  const std::string path = TestTempPath("unknown_op.json");
  std::ofstream(path) << R"({"graph": {"ops": [{"op": "no_such_op", "outputs": ["y"]}]},
      "calls": [{"roots": ["y"]}]})";
  CliRun run = RunCli(absl::StrCat("--target=", server.target(), " --request_file=", path,
                                   " --requests=5 --format=csv"));
  EXPECT_EQ(run.exit_code, 1) << run.err;
  EXPECT_NE(run.out.find("status_INVALID_ARGUMENT,5"), std::string::npos) << run.out;
  std::remove(path.c_str());
}

}  // namespace
}  // namespace gradserve::load
