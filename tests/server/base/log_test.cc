// The log line and the rate limit on refusals' lines (Note [Refusals logged at a bounded
// rate]), with a clock and a sink of the test's own, so that the counts are exact.

#include "server/base/log.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace gradserve::server {
namespace {

// A RateLimitedLog whose clock the test moves and whose lines it keeps.
struct FakeLog {
  explicit FakeLog(int64_t per_second)
      : log(
            per_second, absl::Seconds(1), [this] { return now; },
            [this](absl::string_view line) { lines.emplace_back(line); }) {}

  // The number the summaries say were left out, summed.
  int64_t Summarized() const {
    int64_t total = 0;
    for (const std::string& line : lines) {
      if (!absl::StrContains(line, "refusals not logged")) continue;
      int64_t n = 0;
      EXPECT_TRUE(absl::SimpleAtoi(line.substr(0, line.find(' ')), &n)) << line;
      total += n;
    }
    return total;
  }
  int64_t Refusals() const {
    int64_t n = 0;
    for (const std::string& line : lines) n += absl::StartsWith(line, "refused ");
    return n;
  }

  absl::Time now = absl::FromUnixSeconds(1'000'000);
  std::vector<std::string> lines;
  RateLimitedLog log;
};

TEST(RateLimitedLogTest, ABurstIsCutToTheRateAndSummed) {
  FakeLog f(10);
  // 10,000 refusals in 2.5 s of the fake clock: 4 per millisecond.
  int made = 0;
  for (int i = 0; i < 10'000; ++i) {
    f.log.Log([&] {
      ++made;
      return absl::StrCat("refused ", i);
    });
    if (i % 4 == 3) f.now += absl::Milliseconds(1);
  }
  // Three windows began (at 0, 1 and 2 s): ten lines each, and a summary before the first
  // line of the second and third.
  EXPECT_EQ(f.Refusals(), 30);
  EXPECT_EQ(made, 30);  // lines left out are never formatted
  EXPECT_EQ(f.lines.size(), 32u);
  EXPECT_EQ(f.lines[0], "refused 0");
  EXPECT_TRUE(absl::StartsWith(f.lines[10], "3990 refusals not logged in the last 1.0s"))
      << f.lines[10];
  EXPECT_EQ(f.lines[11], "refused 4000");
  // The rest is summed up when the log is flushed (the service stopping).
  f.log.Flush();
  ASSERT_EQ(f.lines.size(), 33u);
  EXPECT_TRUE(absl::StartsWith(f.lines.back(), "1990 refusals not logged in the last 0.5s"))
      << f.lines.back();
  EXPECT_EQ(f.Refusals() + f.Summarized(), 10'000);
  EXPECT_EQ(f.log.lines_left_out(), 9970);
  f.log.Flush();  // nothing more to say
  EXPECT_EQ(f.lines.size(), 33u);
}

TEST(RateLimitedLogTest, AQuietLogWritesEveryLineAndNoSummary) {
  FakeLog f(2);
  for (int i = 0; i < 20; ++i) {
    EXPECT_TRUE(f.log.Log([&] { return absl::StrCat("refused ", i); }));
    f.now += absl::Milliseconds(600);
  }
  f.log.Flush();
  EXPECT_EQ(f.lines.size(), 20u);
  EXPECT_EQ(f.log.lines_left_out(), 0);
}

TEST(RateLimitedLogTest, TheClockGoingBackStartsAWindow) {
  FakeLog f(1);
  EXPECT_TRUE(f.log.Log([] { return "refused a"; }));
  EXPECT_FALSE(f.log.Log([] { return "refused b"; }));
  f.now -= absl::Seconds(5);
  EXPECT_TRUE(f.log.Log([] { return "refused c"; }));
  EXPECT_EQ(f.lines,
            (std::vector<std::string>{
                "refused a", "1 refusals not logged in the last 0.0s (at most 1 lines per 1s)",
                "refused c"}));
}

// A line is one line, whatever bytes it carries.
TEST(LogLineTest, ControlBytesAreEscaped) {
  ::testing::internal::CaptureStderr();
  LogLine(std::string("id=a\nb\r\x1b[2J\0z", 13));
  const std::string out = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(absl::EndsWith(out, "gradserve-server: id=a\\nb\\r\\x1b[2J\\x00z\n")) << out;
  EXPECT_EQ(out.find('\n'), out.size() - 1) << out;
}

// Note [JSON log lines]: the same record in both formats; the format is the process's, so each
// test sets it back.
class LogRecordTest : public ::testing::Test {
 protected:
  void TearDown() override { SetLogFormat(LogFormat::kText); }

  static LogRecord Record() {
    LogRecord record("request");
    record.Client("id", "a\"b\n\xff")
        .Word("rpc", "unary")
        .Millis("duration_ms", 1234)
        .Number("nodes", 7)
        .Message("error", "bad 'op'");
    return record;
  }
};

TEST_F(LogRecordTest, TextIsKeyValue) {
  SetLogFormat(LogFormat::kText);
  const std::string line = Record().Line();
  EXPECT_TRUE(absl::StartsWith(line, "request id=")) << line;
  EXPECT_TRUE(absl::StrContains(line, " rpc=unary duration_ms=1.234 nodes=7 error=bad 'op'"))
      << line;
  EXPECT_FALSE(absl::StrContains(line, "\n")) << line;
}

TEST_F(LogRecordTest, JsonIsOneObjectWithEveryByteEscaped) {
  SetLogFormat(LogFormat::kJson);
  const std::string line = Record().Line();
  EXPECT_TRUE(absl::StartsWith(line, "{\"time\":\"")) << line;
  EXPECT_TRUE(absl::StrContains(
      line,
      "\"source\":\"gradserve-server\",\"msg\":\"request\",\"id\":\"a\\\"b\\u000a\\u00ff\","
      "\"rpc\":\"unary\",\"duration_ms\":1.234,\"nodes\":7,\"error\":\"bad 'op'\"}"))
      << line;
}

TEST_F(LogRecordTest, ParsesTheFlag) {
  LogFormat format = LogFormat::kText;
  EXPECT_TRUE(ParseLogFormat("json", &format).ok());
  EXPECT_EQ(format, LogFormat::kJson);
  EXPECT_TRUE(ParseLogFormat("text", &format).ok());
  EXPECT_EQ(format, LogFormat::kText);
  EXPECT_EQ(ParseLogFormat("xml", &format).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gradserve::server
