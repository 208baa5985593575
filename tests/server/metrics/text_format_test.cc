// The Prometheus text format: label values bounded and escaped (Note [Label values]), and
// histograms cumulative with their sum in seconds.

#include "server/metrics/text_format.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "server/metrics/histogram.h"

namespace gradserve::server::metrics {
namespace {

TEST(EscapeLabelValueTest, EscapesWhatTheFormatSays) {
  EXPECT_EQ(EscapeLabelValue("plain-name_1"), "plain-name_1");
  EXPECT_EQ(EscapeLabelValue("a\\b"), "a\\\\b");
  EXPECT_EQ(EscapeLabelValue("say \"hi\""), "say \\\"hi\\\"");
  EXPECT_EQ(EscapeLabelValue("two\nlines"), "two\\nlines");
}

TEST(EscapeLabelValueTest, BytesOutsidePrintableAsciiBecomeUnderscores) {
  EXPECT_EQ(EscapeLabelValue(std::string("a\0b\r\t\x7f", 6)), "a_b___");
  EXPECT_EQ(EscapeLabelValue("caf\xc3\xa9 \xff"), "caf__ _");
}

TEST(EscapeLabelValueTest, BoundsTheValue) {
  const std::string escaped = EscapeLabelValue(std::string(100000, 'x'));
  EXPECT_EQ(escaped.size(), kMaxLabelValueBytes);
  // Cut before escaping: a value of quotes may double, never more.
  EXPECT_EQ(EscapeLabelValue(std::string(1000, '"')).size(), 2 * kMaxLabelValueBytes);
}

TEST(TextWriterTest, FamilyAndSamples) {
  TextWriter out;
  out.Family("gradserve_x_total", "counter", "Help with a \\ and a\nnewline.");
  out.Sample("gradserve_x_total", {{"rpc", "ComputeGradients"}, {"tenant", "t\"1"}}, int64_t{42});
  out.Sample("gradserve_x_total", {}, 0.5);
  EXPECT_EQ(out.text(),
            "# HELP gradserve_x_total Help with a \\\\ and a\\nnewline.\n"
            "# TYPE gradserve_x_total counter\n"
            "gradserve_x_total{rpc=\"ComputeGradients\",tenant=\"t\\\"1\"} 42\n"
            "gradserve_x_total 0.5\n");
}

TEST(TextWriterTest, HistogramIsCumulativeWithSumInSeconds) {
  int64_t buckets[kBuckets] = {};
  buckets[BucketOf(7)] += 1;                 // 10 µs bucket
  buckets[BucketOf(40)] += 2;                // 50 µs bucket
  buckets[BucketOf(3000000)] += 1;           // 5 s bucket
  buckets[BucketOf(int64_t{1} << 40)] += 1;  // +Inf
  TextWriter out;
  out.Histogram("h", {{"rpc", "r"}}, buckets, 1234567);
  const std::string& text = out.text();
  EXPECT_TRUE(absl::StrContains(text, "h_bucket{rpc=\"r\",le=\"1e-05\"} 1\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "h_bucket{rpc=\"r\",le=\"2.5e-05\"} 1\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "h_bucket{rpc=\"r\",le=\"5e-05\"} 3\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "h_bucket{rpc=\"r\",le=\"2.5\"} 3\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "h_bucket{rpc=\"r\",le=\"5\"} 4\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "h_bucket{rpc=\"r\",le=\"120\"} 4\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "h_bucket{rpc=\"r\",le=\"+Inf\"} 5\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "h_sum{rpc=\"r\"} 1.234567\n")) << text;
  EXPECT_TRUE(absl::StrContains(text, "h_count{rpc=\"r\"} 5\n")) << text;
  // Every line ends where it should: no label value broke one.
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    EXPECT_TRUE(absl::StartsWith(line, "h_")) << line;
  }
}

TEST(BucketOfTest, Bounds) {
  EXPECT_EQ(BucketOf(0), 0);
  EXPECT_EQ(BucketOf(10), 0);
  EXPECT_EQ(BucketOf(11), 1);
  EXPECT_EQ(BucketOf(kBucketBoundsUs.back()), kBuckets - 2);
  EXPECT_EQ(BucketOf(kBucketBoundsUs.back() + 1), kBuckets - 1);
}

}  // namespace
}  // namespace gradserve::server::metrics
