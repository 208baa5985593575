#include "client/load/text_reports.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/load/units.h"

namespace gradserve::load {
namespace {

constexpr int kDisplayBins = 10;
constexpr int kBarWidth = 40;

double Us(int64_t ns) { return static_cast<double>(ns) / 1e3; }

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppendFormat(&out, "\\u%04x", static_cast<unsigned char>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string Bounds(const LoadOptions& o) {
  std::string bounds;
  if (o.requests > 0) bounds = absl::StrCat(o.requests, " requests");
  if (o.duration > absl::ZeroDuration()) {
    absl::StrAppend(&bounds, bounds.empty() ? "" : " or ", absl::FormatDuration(o.duration),
                    o.requests > 0 ? ", whichever comes first" : "");
  }
  if (o.warmup > 0) absl::StrAppend(&bounds, ", after ", o.warmup, " warm-up calls");
  return bounds;
}

std::string Summary(const LoadResult& r) {
  const LoadOptions& o = r.options;
  std::string s;
  absl::StrAppendFormat(&s, "Scenario:     %s (request %s)\n", r.scenario,
                        FormatBytes(static_cast<double>(r.request_bytes)));
  absl::StrAppendFormat(&s, "Targets:      %s, %d connection(s) each\n",
                        absl::StrJoin(o.targets, ", "), o.connections);
  absl::StrAppendFormat(&s, "Load:         %s; %s\n", DescribeLoad(o), Bounds(o));
  if (r.cut_short) {
    absl::StrAppendFormat(&s,
                          "Cut short:    the run reached its limit of %s; calls in flight "
                          "were cancelled\n",
                          absl::FormatDuration(o.max_duration));
  }
  s += "\nSummary:\n";
  absl::StrAppendFormat(&s, "  Count:        %d (%d ok, %d errors)\n", r.count, r.ok, r.errors());
  absl::StrAppendFormat(&s, "  Time:         %.3f s\n", absl::ToDoubleSeconds(r.elapsed));
  absl::StrAppendFormat(&s, "  Rate:         %.2f calls/s\n", r.rate());
  const double seconds = std::max(absl::ToDoubleSeconds(r.elapsed), 1e-9);
  absl::StrAppendFormat(&s, "  Bytes:        %s up, %s down; %s/s up+down (message bytes)\n",
                        FormatBytes(static_cast<double>(r.bytes_up)),
                        FormatBytes(static_cast<double>(r.bytes_down)),
                        FormatBytes(static_cast<double>(r.bytes_up + r.bytes_down) / seconds));

  s += "\nLatency of successful calls:\n";
  if (r.latency.count() == 0) {
    s += "  (none)\n";
  } else {
    absl::StrAppendFormat(&s, "  %-7s %s\n", "min", FormatLatency(r.latency.min_ns()));
    absl::StrAppendFormat(&s, "  %-7s %s\n", "mean",
                          FormatLatency(static_cast<int64_t>(r.latency.mean_ns())));
    for (const ReportedQuantile& q : ReportedQuantiles()) {
      absl::StrAppendFormat(&s, "  %-7s %s\n", q.label, FormatLatency(r.latency.Quantile(q.q)));
    }
    absl::StrAppendFormat(&s, "  %-7s %s\n", "max", FormatLatency(r.latency.max_ns()));

    s += "\nHistogram:\n";
    const std::vector<HistogramBin> bins = DisplayBins(r.latency, kDisplayBins);
    int64_t most = 1;
    for (const HistogramBin& b : bins) most = std::max(most, b.count);
    for (const HistogramBin& b : bins) {
      const auto bar = static_cast<size_t>((b.count * kBarWidth + most - 1) / most);
      absl::StrAppendFormat(&s, "  %12s [%d]\t|%s\n", FormatLatency(b.from_ns), b.count,
                            std::string(bar, '#'));
    }
  }

  s += "\nStatus codes:\n";
  for (const auto& [code, n] : r.status_counts) {
    absl::StrAppendFormat(&s, "  [%s] %d\n", code, n);
  }
  if (r.status_counts.empty()) s += "  (no calls finished)\n";
  return s;
}

std::string Json(const LoadResult& r) {
  const LoadOptions& o = r.options;
  std::vector<std::string> targets;
  for (const std::string& t : o.targets) targets.push_back(JsonString(t));
  std::string s = "{\n";
  absl::StrAppendFormat(&s, "  \"scenario\": %s,\n", JsonString(r.scenario));
  absl::StrAppendFormat(&s, "  \"request_bytes\": %d,\n", r.request_bytes);
  absl::StrAppendFormat(&s, "  \"targets\": [%s],\n", absl::StrJoin(targets, ", "));
  absl::StrAppendFormat(&s, "  \"concurrency\": %d,\n  \"connections\": %d,\n", o.concurrency,
                        o.connections);
  absl::StrAppendFormat(
      &s, "  \"balance\": \"%s\",\n",
      o.balance == LoadOptions::Balance::kPerTarget ? "per_target" : "round_robin");
  absl::StrAppendFormat(&s, "  \"open_loop_rate\": %.6g,\n", o.rate);
  absl::StrAppendFormat(&s, "  \"requests\": %d,\n  \"duration_s\": %.6g,\n  \"warmup\": %d,\n",
                        o.requests, absl::ToDoubleSeconds(o.duration), o.warmup);
  absl::StrAppendFormat(&s, "  \"cut_short\": %s,\n", r.cut_short ? "true" : "false");
  absl::StrAppendFormat(&s, "  \"count\": %d,\n  \"ok\": %d,\n  \"errors\": %d,\n", r.count, r.ok,
                        r.errors());
  absl::StrAppendFormat(&s, "  \"elapsed_s\": %.6f,\n  \"rate\": %.6g,\n",
                        absl::ToDoubleSeconds(r.elapsed), r.rate());
  absl::StrAppendFormat(&s, "  \"bytes_up\": %d,\n  \"bytes_down\": %d,\n", r.bytes_up,
                        r.bytes_down);
  absl::StrAppendFormat(&s, "  \"bytes_per_second\": %.6g,\n", r.bytes_per_second());
  absl::StrAppendFormat(&s, "  \"latency_us\": {\"min\": %.3f, \"mean\": %.3f",
                        Us(r.latency.min_ns()), r.latency.mean_ns() / 1e3);
  for (const ReportedQuantile& q : ReportedQuantiles()) {
    absl::StrAppendFormat(&s, ", \"%s\": %.3f", q.label, Us(r.latency.Quantile(q.q)));
  }
  absl::StrAppendFormat(&s, ", \"max\": %.3f},\n", Us(r.latency.max_ns()));
  std::vector<std::string> bins;
  for (const HistogramBin& b : DisplayBins(r.latency, kDisplayBins)) {
    bins.push_back(absl::StrFormat("{\"from_us\": %.3f, \"to_us\": %.3f, \"count\": %d}",
                                   Us(b.from_ns), Us(b.to_ns), b.count));
  }
  absl::StrAppendFormat(&s, "  \"histogram\": [%s],\n", absl::StrJoin(bins, ", "));
  std::vector<std::string> codes;
  for (const auto& [code, n] : r.status_counts) {
    codes.push_back(absl::StrFormat("%s: %d", JsonString(code), n));
  }
  absl::StrAppendFormat(&s, "  \"status_codes\": {%s},\n", absl::StrJoin(codes, ", "));
  std::vector<std::string> slices;
  const std::vector<Timeline::Slice>& timeline = r.timeline.slices();
  for (size_t i = 0; i < timeline.size(); ++i) {
    const Timeline::Slice& t = timeline[i];
    slices.push_back(absl::StrFormat(
        "{\"t_s\": %.3f, \"count\": %d, \"errors\": %d, \"p50_us\": %.3f, \"p99_us\": %.3f, "
        "\"max_us\": %.3f}",
        static_cast<double>(i) * static_cast<double>(r.timeline.slice_ns()) / 1e9, t.count,
        t.errors, Us(t.latency.Quantile(0.5)), Us(t.latency.Quantile(0.99)),
        Us(t.latency.max_ns())));
  }
  absl::StrAppendFormat(&s, "  \"timeline\": [%s]\n}\n", absl::StrJoin(slices, ",\n    "));
  return s;
}

std::string Csv(const LoadResult& r) {
  std::string s = "metric,value\n";
  auto row = [&s](const std::string& metric, const std::string& value) {
    absl::StrAppend(&s, metric, ",", value, "\n");
  };
  row("scenario", r.scenario);
  row("concurrency", absl::StrCat(r.options.concurrency));
  row("connections", absl::StrCat(r.options.connections));
  row("open_loop_rate", absl::StrFormat("%.6g", r.options.rate));
  row("count", absl::StrCat(r.count));
  row("ok", absl::StrCat(r.ok));
  row("errors", absl::StrCat(r.errors()));
  row("elapsed_s", absl::StrFormat("%.6f", absl::ToDoubleSeconds(r.elapsed)));
  row("rate", absl::StrFormat("%.6g", r.rate()));
  row("bytes_up", absl::StrCat(r.bytes_up));
  row("bytes_down", absl::StrCat(r.bytes_down));
  row("bytes_per_second", absl::StrFormat("%.6g", r.bytes_per_second()));
  row("latency_min_us", absl::StrFormat("%.3f", Us(r.latency.min_ns())));
  row("latency_mean_us", absl::StrFormat("%.3f", r.latency.mean_ns() / 1e3));
  for (const ReportedQuantile& q : ReportedQuantiles()) {
    row(absl::StrCat("latency_", q.label, "_us"),
        absl::StrFormat("%.3f", Us(r.latency.Quantile(q.q))));
  }
  row("latency_max_us", absl::StrFormat("%.3f", Us(r.latency.max_ns())));
  for (const auto& [code, n] : r.status_counts) row(absl::StrCat("status_", code), absl::StrCat(n));
  row("cut_short", r.cut_short ? "true" : "false");
  return s;
}

}  // namespace

absl::StatusOr<ReportFormat> ParseReportFormat(const std::string& name) {
  if (name == "summary") return ReportFormat::kSummary;
  if (name == "json") return ReportFormat::kJson;
  if (name == "csv") return ReportFormat::kCsv;
  return absl::InvalidArgumentError(
      absl::StrCat("format must be summary, json or csv; got '", name, "'"));
}

std::string DescribeLoad(const LoadOptions& o) {
  if (o.rate > 0) {
    return absl::StrFormat("open loop at %.6g calls/s, at most %d in flight", o.rate,
                           o.concurrency);
  }
  return absl::StrFormat("closed loop, concurrency %d", o.concurrency);
}

std::string FormatReport(const LoadResult& result, ReportFormat format) {
  switch (format) {
    case ReportFormat::kSummary:
      return Summary(result);
    case ReportFormat::kJson:
      return Json(result);
    case ReportFormat::kCsv:
      return Csv(result);
  }
  return "";
}

}  // namespace gradserve::load
