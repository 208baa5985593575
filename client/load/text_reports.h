// The end-of-run reports of `gradserve load` on stdout: a summary for people, JSON and CSV for
// scripts (bench/run reads the JSON). The HTML report is in html_report.h.

#ifndef GRADSERVE_CLIENT_LOAD_TEXT_REPORTS_H_
#define GRADSERVE_CLIENT_LOAD_TEXT_REPORTS_H_

#include <string>

#include "absl/status/statusor.h"
#include "client/load/load_result.h"

namespace gradserve::load {

enum class ReportFormat { kSummary, kJson, kCsv };

// "summary", "json" or "csv"; INVALID_ARGUMENT otherwise.
absl::StatusOr<ReportFormat> ParseReportFormat(const std::string& name);

std::string FormatReport(const LoadResult& result, ReportFormat format);

// "closed loop, concurrency 16" or "open loop at 500 calls/s, at most 16 in flight".
std::string DescribeLoad(const LoadOptions& options);

}  // namespace gradserve::load

#endif  // GRADSERVE_CLIENT_LOAD_TEXT_REPORTS_H_
