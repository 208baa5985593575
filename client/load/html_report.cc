#include "client/load/html_report.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/load/text_reports.h"
#include "client/load/units.h"

namespace gradserve::load {
namespace {

// Chart geometry, in SVG user units.
constexpr double kWidth = 760, kHeight = 300;
constexpr double kLeft = 70, kRight = 20, kTop = 20, kBottom = 45;
constexpr int kHistogramBins = 40;
constexpr int kTicks = 5;

std::string Escape(const std::string& text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// Maps data coordinates into the plot area of a chart.
struct Frame {
  double x_max, y_max;
  double X(double x) const { return kLeft + (kWidth - kLeft - kRight) * x / x_max; }
  double Y(double y) const { return kHeight - kBottom - (kHeight - kTop - kBottom) * y / y_max; }
};

// The axes with kTicks labelled ticks each; format_x and format_y write a tick's label.
template <typename FormatX, typename FormatY>
std::string Axes(const Frame& f, const std::string& x_label, const std::string& y_label,
                 FormatX format_x, FormatY format_y) {
  std::string s;
  absl::StrAppendFormat(&s,
                        "<line class=\"axis\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>"
                        "<line class=\"axis\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>",
                        kLeft, f.Y(0), kWidth - kRight, f.Y(0), kLeft, f.Y(0), kLeft, kTop);
  for (int i = 0; i <= kTicks; ++i) {
    const double x = f.x_max * i / kTicks, y = f.y_max * i / kTicks;
    absl::StrAppendFormat(&s,
                          "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" "
                          "text-anchor=\"middle\">%s</text>",
                          f.X(x), kHeight - kBottom + 16, Escape(format_x(x)));
    absl::StrAppendFormat(&s,
                          "<line class=\"grid\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>"
                          "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" "
                          "text-anchor=\"end\">%s</text>",
                          kLeft, f.Y(y), kWidth - kRight, f.Y(y), kLeft - 6, f.Y(y) + 4,
                          Escape(format_y(y)));
  }
  absl::StrAppendFormat(&s,
                        "<text class=\"label\" x=\"%.1f\" y=\"%.1f\" "
                        "text-anchor=\"middle\">%s</text>",
                        (kLeft + kWidth - kRight) / 2, kHeight - 8, Escape(x_label));
  absl::StrAppendFormat(&s,
                        "<text class=\"label\" x=\"14\" y=\"%.1f\" text-anchor=\"middle\" "
                        "transform=\"rotate(-90 14 %.1f)\">%s</text>",
                        (kTop + kHeight - kBottom) / 2, (kTop + kHeight - kBottom) / 2,
                        Escape(y_label));
  return s;
}

std::string SvgOpen(const std::string& title) {
  return absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 %.0f %.0f\" width=\"%.0f\" "
      "height=\"%.0f\" role=\"img\" aria-label=\"%s\">",
      kWidth, kHeight, kWidth, kHeight, Escape(title));
}

std::string HistogramSvg(const LatencyHistogram& latency) {
  const std::vector<HistogramBin> bins = DisplayBins(latency, kHistogramBins);
  if (bins.empty()) return "<p>No successful calls.</p>";
  int64_t most = 1;
  for (const HistogramBin& b : bins) most = std::max(most, b.count);
  const int64_t lo = bins.front().from_ns, hi = bins.back().to_ns;
  Frame f{static_cast<double>(hi - lo), static_cast<double>(most)};
  std::string s = SvgOpen("latency histogram");
  s += Axes(
      f, "latency", "calls", [lo](double x) { return FormatLatency(lo + static_cast<int64_t>(x)); },
      [](double y) { return absl::StrFormat("%.0f", y); });
  for (const HistogramBin& b : bins) {
    const double x0 = f.X(static_cast<double>(b.from_ns - lo));
    const double x1 = f.X(static_cast<double>(b.to_ns - lo));
    const double y = f.Y(static_cast<double>(b.count));
    absl::StrAppendFormat(&s,
                          "<rect class=\"bar\" x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" "
                          "height=\"%.2f\"><title>%s to %s: %d calls</title></rect>",
                          x0, y, std::max(x1 - x0 - 1, 0.5), f.Y(0) - y, FormatLatency(b.from_ns),
                          FormatLatency(b.to_ns), b.count);
  }
  return s + "</svg>";
}

std::string TimelineSvg(const Timeline& timeline) {
  const std::vector<Timeline::Slice>& slices = timeline.slices();
  const double slice_s = static_cast<double>(timeline.slice_ns()) / 1e9;
  int64_t top_ns = 1;
  for (const Timeline::Slice& t : slices) top_ns = std::max(top_ns, t.latency.max_ns());
  if (slices.empty()) return "<p>No calls.</p>";
  Frame f{std::max(slice_s * static_cast<double>(slices.size()), 1e-3),
          static_cast<double>(top_ns) * 1.05};
  std::string s = SvgOpen("latency over time");
  s += Axes(
      f, "time since measurement began (s)", "latency",
      [](double x) { return absl::StrFormat("%.2f", x); },
      [](double y) { return FormatLatency(static_cast<int64_t>(y)); });
  struct Series {
    const char* name;
    const char* css;
    double q;  // quantile; 1 is the max
  };
  const Series series[] = {{"p50", "p50", 0.5}, {"p99", "p99", 0.99}, {"max", "max", 1}};
  for (const Series& line : series) {
    std::vector<std::string> points;
    for (size_t i = 0; i < slices.size(); ++i) {
      if (slices[i].latency.count() == 0) continue;
      const double x = (static_cast<double>(i) + 0.5) * slice_s;
      const auto y = static_cast<double>(slices[i].latency.Quantile(line.q));
      points.push_back(absl::StrFormat("%.2f,%.2f", f.X(x), f.Y(y)));
    }
    absl::StrAppendFormat(&s, "<polyline class=\"%s\" points=\"%s\"/>", line.css,
                          absl::StrJoin(points, " "));
  }
  // Failed calls, as marks along the time axis.
  for (size_t i = 0; i < slices.size(); ++i) {
    if (slices[i].errors == 0) continue;
    absl::StrAppendFormat(&s,
                          "<circle class=\"error\" cx=\"%.2f\" cy=\"%.2f\" r=\"3\">"
                          "<title>%d failed calls</title></circle>",
                          f.X((static_cast<double>(i) + 0.5) * slice_s), f.Y(0), slices[i].errors);
  }
  s += "<g class=\"legend\">";
  for (int i = 0; i < 3; ++i) {
    const double x = kLeft + 12 + 70 * i;
    absl::StrAppendFormat(&s,
                          "<line class=\"%s\" x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\"/>"
                          "<text class=\"tick\" x=\"%.0f\" y=\"%.0f\">%s</text>",
                          series[i].css, x, kTop + 6, x + 18, kTop + 6, x + 22, kTop + 10,
                          series[i].name);
  }
  return s + "</g></svg>";
}

std::string Row(const std::string& name, const std::string& value) {
  return absl::StrCat("<tr><th>", Escape(name), "</th><td>", Escape(value), "</td></tr>\n");
}

}  // namespace

std::string HtmlReport(const LoadResult& r) {
  const LoadOptions& o = r.options;
  std::string figures;
  figures += Row("Scenario", r.scenario);
  figures += Row("Request size", FormatBytes(static_cast<double>(r.request_bytes)));
  figures += Row("Targets", absl::StrJoin(o.targets, ", "));
  figures += Row("Connections per target", absl::StrCat(o.connections));
  figures += Row("Load", DescribeLoad(o));
  figures += Row("Warm-up calls (left out)", absl::StrCat(r.warmup_calls));
  figures += Row("Calls", absl::StrFormat("%d (%d ok, %d errors)", r.count, r.ok, r.errors()));
  figures += Row("Time", absl::StrFormat("%.3f s", absl::ToDoubleSeconds(r.elapsed)));
  figures += Row("Rate", absl::StrFormat("%.2f calls/s", r.rate()));
  figures +=
      Row("Bytes up / down", absl::StrCat(FormatBytes(static_cast<double>(r.bytes_up)), " / ",
                                          FormatBytes(static_cast<double>(r.bytes_down))));
  figures += Row("Throughput (up + down)", absl::StrCat(FormatBytes(r.bytes_per_second()), "/s"));
  if (r.cut_short) figures += Row("Cut short", "yes: the run reached its time limit");

  std::string latency;
  latency += Row("min", FormatLatency(r.latency.min_ns()));
  latency += Row("mean", FormatLatency(static_cast<int64_t>(r.latency.mean_ns())));
  for (const ReportedQuantile& q : ReportedQuantiles()) {
    latency += Row(q.label, FormatLatency(r.latency.Quantile(q.q)));
  }
  latency += Row("max", FormatLatency(r.latency.max_ns()));

  std::string codes;
  for (const auto& [code, n] : r.status_counts) codes += Row(code, absl::StrCat(n));

  return absl::StrCat(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<title>gradserve load: ",
      Escape(r.scenario),
      "</title>\n<style>\n"
      "body{font-family:sans-serif;margin:2em;color:#222}"
      "table{border-collapse:collapse;margin-bottom:1.5em}"
      "th,td{border:1px solid #ccc;padding:3px 10px;text-align:left}"
      "th{background:#f3f3f3;font-weight:normal}"
      ".axis{stroke:#333}.grid{stroke:#e4e4e4}.tick{font-size:11px;fill:#444}"
      ".label{font-size:12px;fill:#222}.bar{fill:#4a7fb5}"
      ".p50,.p99,.max{fill:none;stroke-width:1.5}.p50{stroke:#2c7a2c}"
      ".p99{stroke:#c47a00}.max{stroke:#b22}.error{fill:#b22}\n"
      "</style>\n</head>\n<body>\n<h1>gradserve load: ",
      Escape(r.scenario),
      "</h1>\n"
      "<h2>Run</h2>\n<table>\n",
      figures,
      "</table>\n"
      "<h2>Latency of successful calls</h2>\n<table>\n",
      latency,
      "</table>\n"
      "<h2>Latency histogram</h2>\n",
      HistogramSvg(r.latency),
      "\n"
      "<h2>Latency over time</h2>\n<p>By intended send time; red dots mark failed calls.</p>\n",
      TimelineSvg(r.timeline), "\n<h2>Status codes</h2>\n<table>\n", codes,
      "</table>\n</body>\n</html>\n");
}

}  // namespace gradserve::load
