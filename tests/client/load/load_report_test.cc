// The load tester's reports: summary, JSON (parsed back), CSV, the HTML page and the
// progress line, from a real run against a local server.

#include <string>

#include "client/load/html_report.h"
#include "client/load/load_generator.h"
#include "client/load/progress_line.h"
#include "client/load/text_reports.h"
#include "client/load/workload.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/client/load_test_util.h"

namespace gradserve::load {
namespace {

using ::gradserve::testing::LocalServer;

int Occurrences(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

class LoadReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WorkloadSpec spec;
    spec.scenario = "grad_tiny";
    absl::StatusOr<Workload> workload = MakeWorkload(spec);
    ASSERT_TRUE(workload.ok());
    workload_ = *workload;
    LoadOptions o;
    o.targets = {server_.target()};
    o.concurrency = 2;
    o.requests = 100;
    o.warmup = 5;
    o.max_duration = absl::Seconds(30);
    absl::StatusOr<LoadResult> r = RunLoad(o, workload_);
    ASSERT_TRUE(r.ok()) << r.status();
    result_ = *r;
  }

  LocalServer server_;
  Workload workload_;
  LoadResult result_;
};

TEST_F(LoadReportTest, SummaryHasEveryFigure) {
  const std::string s = FormatReport(result_, ReportFormat::kSummary);
  for (const char* label :
       {"Count:", "Rate:", "Bytes:", "min", "mean", "p50", "p90", "p95", "p99", "p99.9", "max",
        "Histogram:", "[OK] 100", "closed loop, concurrency 2", "100 requests, after 5 warm-up"}) {
    EXPECT_NE(s.find(label), std::string::npos) << label << " missing from:\n" << s;
  }
}

TEST_F(LoadReportTest, JsonParsesWithTheFigures) {
  const std::string json = FormatReport(result_, ReportFormat::kJson);
  google::protobuf::Struct parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &parsed).ok()) << json;
  const auto& f = parsed.fields();
  EXPECT_EQ(f.at("scenario").string_value(), "grad_tiny");
  EXPECT_EQ(f.at("count").number_value(), 100);
  EXPECT_EQ(f.at("errors").number_value(), 0);
  EXPECT_GT(f.at("rate").number_value(), 0);
  EXPECT_EQ(f.at("bytes_up").number_value(), 100.0 * workload_.request_bytes);
  const auto& latency = f.at("latency_us").struct_value().fields();
  for (const char* q : {"min", "mean", "p50", "p90", "p95", "p99", "p99.9", "max"}) {
    ASSERT_TRUE(latency.contains(q)) << q;
  }
  EXPECT_LE(latency.at("min").number_value(), latency.at("p50").number_value());
  EXPECT_LE(latency.at("p50").number_value(), latency.at("p99").number_value());
  EXPECT_LE(latency.at("p99").number_value(), latency.at("max").number_value());
  double in_histogram = 0;
  for (const auto& bin : f.at("histogram").list_value().values()) {
    in_histogram += bin.struct_value().fields().at("count").number_value();
  }
  EXPECT_EQ(in_histogram, 100);
  EXPECT_EQ(f.at("status_codes").struct_value().fields().at("OK").number_value(), 100);
  EXPECT_GT(f.at("timeline").list_value().values_size(), 0);
}

TEST_F(LoadReportTest, CsvHasOneMetricPerLine) {
  const std::string csv = FormatReport(result_, ReportFormat::kCsv);
  EXPECT_EQ(csv.rfind("metric,value\n", 0), 0u);
  EXPECT_NE(csv.find("\ncount,100\n"), std::string::npos) << csv;
  EXPECT_NE(csv.find("\nstatus_OK,100\n"), std::string::npos);
  EXPECT_NE(csv.find("\nlatency_p99.9_us,"), std::string::npos);
  EXPECT_EQ(Occurrences(csv, ","), Occurrences(csv, "\n"));
}

TEST_F(LoadReportTest, HtmlIsSelfContainedWithTwoCharts) {
  const std::string html = HtmlReport(result_);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_EQ(Occurrences(html, "<svg"), 2);
  EXPECT_EQ(Occurrences(html, "</svg>"), 2);
  EXPECT_NE(html.find("latency histogram"), std::string::npos);
  EXPECT_NE(html.find("latency over time"), std::string::npos);
  EXPECT_GT(Occurrences(html, "<rect class=\"bar\""), 0);
  EXPECT_EQ(Occurrences(html, "<polyline"), 3);  // p50, p99, max
  // No script, nothing fetched: the only URL is the SVG namespace.
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);
  EXPECT_EQ(html.find("src="), std::string::npos);
  EXPECT_EQ(Occurrences(html, "http"), Occurrences(html, "xmlns=\"http://www.w3.org/2000/svg\""));
  EXPECT_EQ(html.find("</html>"), html.size() - 8);
}

TEST(ProgressLineTest, TextAndRedraw) {
  ProgressSnapshot p;
  p.done = 1234;
  p.errors = 2;
  p.rate = 500.5;
  p.p99_ns = 1'500'000;
  const std::string text = ProgressLine::Text(absl::Seconds(3), p);
  for (const char* part : {"3.0s", "done 1234", "rate 500.5/s", "errors 2", "p99 1.500 ms"}) {
    EXPECT_NE(text.find(part), std::string::npos) << part << " missing from " << text;
  }
  char* buffer = nullptr;
  size_t size = 0;
  FILE* out = open_memstream(&buffer, &size);
  {
    ProgressLine line(out, /*enabled=*/true);
    line.Update(absl::Seconds(1), p);
    line.Update(absl::Seconds(2), p);
    line.Finish();
  }
  std::fclose(out);
  const std::string drawn(buffer, size);
  free(buffer);
  EXPECT_EQ(Occurrences(drawn, "\r"), 4);  // two redraws, then erased
  EXPECT_EQ(drawn.find('\n'), std::string::npos);
  FILE* quiet = open_memstream(&buffer, &size);
  {
    ProgressLine line(quiet, /*enabled=*/false);
    line.Update(absl::Seconds(1), p);
    line.Finish();
  }
  std::fclose(quiet);
  EXPECT_EQ(size, 0u);
  free(buffer);
}

}  // namespace
}  // namespace gradserve::load
