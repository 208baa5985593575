// gradserve load: the load tester. Sends a built-in scenario or a GradRequest from a JSON file
// to one or several servers, closed or open loop, bounded in count and time, and reports
// latency percentiles, a histogram, rate, bytes and errors (summary, JSON, CSV, HTML).

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "client/cli/command.h"
#include "client/load/html_report.h"
#include "client/load/load_generator.h"
#include "client/load/load_options.h"
#include "client/load/load_regions.h"
#include "client/load/progress_line.h"
#include "client/load/text_reports.h"
#include "client/load/workload.h"

ABSL_DECLARE_FLAG(std::string, target);
ABSL_DECLARE_FLAG(absl::Duration, timeout);
ABSL_DECLARE_FLAG(int, payload_bytes);

ABSL_FLAG(std::string, scenario, "",
          "Built-in request: ping, echo (the bare gRPC echo server of bench/), grad_tiny, "
          "session (grad_tiny's graph as graph sessions: a Forward, then "
          "--session_backward_calls Backward calls with retain_graph, each call timed), "
          "chain_10k, fanin_2k, mlp, payload (a gradient of --payload_bytes bytes), payload_shm "
          "(payload's leaf and gradient in POSIX shared memory, registered with each target for "
          "the run: the server must be on this host, with --shared_memory_prefix).");
ABSL_FLAG(int64_t, session_backward_calls, 10,
          "Scenario session: Backward calls per session before it is released and the next "
          "call makes a new Forward (docs/sessions.md). A run holds up to --concurrency "
          "sessions per connection, which the server's --max_sessions_per_tenant must allow.");
ABSL_FLAG(std::string, request_file, "",
          "Send this GradRequest, written in protobuf JSON, instead of a scenario.");
ABSL_FLAG(int, concurrency, 1,
          "Closed loop: calls kept in flight. Open loop: the most in flight at once.");
ABSL_FLAG(std::string, balance, "round_robin",
          "How calls are spread over several --target addresses. round_robin: each connection "
          "is one gRPC channel to all of them (round_robin, UNAVAILABLE retried on another), so "
          "a server that fails or drains gets no more calls; per_target: each connection goes "
          "to one target and calls are dealt to the targets strictly in turn, so each gets an "
          "exact share and a server that fails fails its share.");
ABSL_FLAG(int, connections, 1,
          "TCP connections: gRPC channels, each to every target with --balance=round_robin, "
          "or per target with --balance=per_target; calls are spread over them in turn.");
ABSL_FLAG(double, rate, 0,
          "Open loop: start calls at this fixed rate per second, measuring latency from each "
          "call's intended send time. 0: closed loop.");
ABSL_FLAG(int64_t, requests, 0, "Measured calls to make (0: bounded by --duration only).");
ABSL_FLAG(absl::Duration, duration, absl::ZeroDuration(),
          "How long to measure (0: bounded by --requests only; at most 1h).");
ABSL_FLAG(int64_t, warmup, 0, "Calls made first and left out of every figure.");
ABSL_FLAG(absl::Duration, max_duration, absl::Minutes(10),
          "Hard limit of the whole run, warm-up included: calls still in flight then are "
          "cancelled (at most 1h).");
ABSL_FLAG(std::string, transport, "auto",
          "How grad requests travel: unary, stream (ComputeGradientsStream), or auto (stream "
          "those too large for one message).");
// Shared with `gradserve graph` (graph_command.cc), which reads the default as its own, svg,
// and with `gradserve info --ops`.
ABSL_FLAG(std::string, format, "summary",
          "load: the report on stdout: summary, json or csv. graph: svg (the default there), "
          "png or dot. info --ops: text (the default, also 'summary') or markdown, the op "
          "reference docs/ops.md.");
ABSL_FLAG(std::string, trace_prefix, "",
          "Send each call with 'x-request-id: PREFIX-N' (N: the call's number), which the "
          "server writes in its log line and echoes back. Empty: none.");
ABSL_FLAG(std::string, html, "",
          "Also write a self-contained HTML report (histogram, latency over time) here.");
ABSL_FLAG(bool, quiet, false, "No live progress line on stderr.");

namespace gradserve::cli {
namespace {

int UsageError(const std::string& message) {
  std::fprintf(stderr, "gradserve load: %s\n", message.c_str());
  return kExitUsage;
}

std::vector<std::string> Targets() {
  return absl::StrSplit(absl::GetFlag(FLAGS_target), ',', absl::SkipWhitespace());
}

// The one-message limit of a server of target, for --transport=auto; gRPC's default 4 MiB if
// none can say.
int64_t ServerMaxMessageBytes(const std::string& target,
                              const client::ClientOptions& client_options) {
  client::CallOptions options;
  options.timeout = absl::Seconds(10);
  absl::StatusOr<client::v1::ServerInfo> info =
      client::Client::Connect(target, client_options)->GetServerInfo(options);
  if (info.ok() && info->limits().max_message_bytes() > 0) {
    return info->limits().max_message_bytes();
  }
  return int64_t{4} << 20;
}

int RunLoadCommand(const std::vector<std::string>& args) {
  if (!args.empty()) return UsageError("takes no arguments; see --help");
  load::LoadOptions options;
  options.targets = Targets();
  options.concurrency = absl::GetFlag(FLAGS_concurrency);
  options.connections = absl::GetFlag(FLAGS_connections);
  if (const std::string balance = absl::GetFlag(FLAGS_balance); balance == "per_target") {
    options.balance = load::LoadOptions::Balance::kPerTarget;
  } else if (balance != "round_robin") {
    return UsageError(
        absl::StrCat("--balance must be round_robin or per_target, not '", balance, "'"));
  }
  options.rate = absl::GetFlag(FLAGS_rate);
  options.requests = absl::GetFlag(FLAGS_requests);
  options.duration = absl::GetFlag(FLAGS_duration);
  options.warmup = absl::GetFlag(FLAGS_warmup);
  options.call_timeout = absl::GetFlag(FLAGS_timeout);
  options.max_duration = absl::GetFlag(FLAGS_max_duration);
  options.trace_prefix = absl::GetFlag(FLAGS_trace_prefix);
  absl::StatusOr<client::ClientOptions> client_options = ClientOptionsFromFlags();
  if (!client_options.ok()) return UsageError(std::string(client_options.status().message()));
  options.credentials = client_options->credentials;
  if (absl::Status s = load::ValidateLoadOptions(options); !s.ok()) {
    return UsageError(std::string(s.message()));
  }
  absl::StatusOr<load::ReportFormat> format = load::ParseReportFormat(absl::GetFlag(FLAGS_format));
  if (!format.ok()) return UsageError(std::string(format.status().message()));

  load::WorkloadSpec spec;
  spec.scenario = absl::GetFlag(FLAGS_scenario);
  spec.request_file = absl::GetFlag(FLAGS_request_file);
  spec.payload_bytes = absl::GetFlag(FLAGS_payload_bytes);
  spec.transport = absl::GetFlag(FLAGS_transport);
  spec.session_backward_calls = absl::GetFlag(FLAGS_session_backward_calls);
  const bool grad = spec.scenario != "ping" && spec.scenario != "echo";
  if (grad && spec.transport == "auto") {
    spec.max_message_bytes = ServerMaxMessageBytes(absl::GetFlag(FLAGS_target), *client_options);
  }
  // Scenario payload_shm's regions, registered for the run and unregistered after it.
  std::unique_ptr<load::LoadRegions> regions;
  if (spec.scenario == "payload_shm") {
    absl::StatusOr<std::unique_ptr<load::LoadRegions>> made =
        load::LoadRegions::Create(options.targets, *client_options, spec.payload_bytes);
    if (!made.ok()) return ReportError("load", made.status());
    regions = *std::move(made);
    spec.shm_in_region = regions->in();
    spec.shm_out_region = regions->out();
  }
  absl::StatusOr<load::Workload> workload = load::MakeWorkload(spec);
  if (!workload.ok()) return UsageError(std::string(workload.status().message()));

  load::ProgressLine progress(stderr, load::ProgressLine::ShouldShow(absl::GetFlag(FLAGS_quiet)));
  absl::StatusOr<load::LoadResult> result =
      load::RunLoad(options, *workload,
                    [&progress](absl::Duration elapsed, const load::ProgressSnapshot& snapshot) {
                      progress.Update(elapsed, snapshot);
                    });
  progress.Finish();
  if (!result.ok()) return ReportError("load", result.status());

  const std::string report = load::FormatReport(*result, *format);
  std::fwrite(report.data(), 1, report.size(), stdout);
  std::fflush(stdout);
  if (const std::string path = absl::GetFlag(FLAGS_html); !path.empty()) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << load::HtmlReport(*result);
    out.close();
    if (!out) {
      return ReportError("load", absl::PermissionDeniedError(absl::StrCat("cannot write ", path)));
    }
  }
  return result->errors() == 0 && !result->cut_short ? kExitOk : kExitFailure;
}

}  // namespace

Command LoadCommand() {
  return Command{
      "load", "load-test servers: latency percentiles, rate, bytes, errors",
      absl::StrCat(
          "Usage: gradserve load --scenario=NAME | --request_file=FILE.json\n"
          "         [--target=HOST:PORT[,IP:PORT...]|dns:///NAME:PORT] [--concurrency=N]\n"
          "         [--balance=round_robin|per_target] [--connections=N]\n"
          "         [--rate=PER_SECOND] --requests=N | --duration=D [--warmup=N]\n"
          "         [--format=summary|json|csv] [--html=FILE] [--quiet]\n\n"
          "Sends the same request over and over, round-robin over the targets, and reports\n"
          "count, rate, latency min/mean/p50/p90/p95/p99/p99.9/max, a histogram, message bytes\n"
          "up and down, and calls by status code. Closed loop by default; --rate makes it an\n"
          "open loop whose latencies run from each call's intended send time. Scenarios: ",
          absl::StrJoin(load::ScenarioNames(), ", "),
          ".\nEvery run is bounded: --requests and/or --duration, and --max_duration.\n"
          "A live progress line is drawn on stderr when it is a terminal (not with --quiet).\n"
          "Exit code 0 when every measured call succeeded, 1 when some failed or the run was\n"
          "cut short (the report is printed either way), 2 for bad arguments."),
      ConnectionFlags({"scenario", "session_backward_calls", "request_file", "payload_bytes",
                       "concurrency", "balance", "connections", "rate", "requests", "duration",
                       "warmup", "max_duration", "transport", "format", "html", "quiet",
                       "trace_prefix"}),
      RunLoadCommand};
}

}  // namespace gradserve::cli
