// gradserve info: the server's version, limits, devices, ops and counters.

#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_join.h"
#include "client/cli/command.h"
#include "google/protobuf/util/json_util.h"

ABSL_FLAG(bool, json, false, "Print the ServerInfo message as protobuf JSON.");
ABSL_FLAG(bool, ops, false, "List every op with its inputs and attributes.");

namespace gradserve::cli {
namespace {

const char* DTypeShortName(int dtype) {
  switch (dtype) {
    case client::v1::DTYPE_FLOAT32:
      return "float32";
    case client::v1::DTYPE_FLOAT64:
      return "float64";
    case client::v1::DTYPE_INT64:
      return "int64";
    case client::v1::DTYPE_BOOL:
      return "bool";
    default:
      return "?";
  }
}

void PrintInfo(const client::v1::ServerInfo& info) {
  const client::v1::Limits& l = info.limits();
  std::printf("gradserve-server %s\n", info.version().c_str());
  std::printf(
      "limits: message %lld B, request %lld B, ops %lld, leaves %lld, tensor %lld "
      "elements, memory %lld B per request, nesting %lld, backward calls %lld, in flight "
      "%lld, names %lld B\n",
      static_cast<long long>(l.max_message_bytes()), static_cast<long long>(l.max_request_bytes()),
      static_cast<long long>(l.max_ops()), static_cast<long long>(l.max_leaves()),
      static_cast<long long>(l.max_tensor_elements()), static_cast<long long>(l.max_memory_bytes()),
      static_cast<long long>(l.max_nesting()), static_cast<long long>(l.max_backward_calls()),
      static_cast<long long>(l.max_in_flight()), static_cast<long long>(l.max_name_bytes()));
  std::printf("devices:\n");
  for (const auto& d : info.devices()) {
    std::printf("  %-8s %s\n", d.name().c_str(), d.description().c_str());
  }
  const client::v1::Counters& c = info.counters();
  std::printf(
      "requests: %lld total, %lld ok, %lld failed, %lld rejected, %lld in flight; "
      "uptime %.1f s\n",
      static_cast<long long>(c.requests_total()), static_cast<long long>(c.requests_ok()),
      static_cast<long long>(c.requests_failed()), static_cast<long long>(c.requests_rejected()),
      static_cast<long long>(c.in_flight()), c.uptime_us() / 1e6);
  if (!absl::GetFlag(FLAGS_ops)) {
    std::vector<std::string> names;
    for (const auto& op : info.ops()) names.push_back(op.name());
    std::printf("ops (%d): %s\n", info.ops_size(), absl::StrJoin(names, " ").c_str());
    return;
  }
  for (const auto& op : info.ops()) {
    std::vector<std::string> dtypes;
    for (int d : op.dtypes()) dtypes.push_back(DTypeShortName(d));
    std::printf("%s(%s%s) [%s]: %s\n", op.name().c_str(), absl::StrJoin(op.inputs(), ", ").c_str(),
                op.variadic() ? "..." : "", absl::StrJoin(dtypes, ", ").c_str(), op.doc().c_str());
    for (const auto& a : op.attrs()) {
      std::printf("    %s: %s%s  %s\n", a.name().c_str(), a.type().c_str(),
                  a.required() ? " (required)" : "", a.doc().c_str());
    }
  }
}

int RunInfo(const std::vector<std::string>& args) {
  if (!args.empty()) {
    std::fprintf(stderr, "gradserve info: takes no arguments; see --help\n");
    return kExitUsage;
  }
  std::unique_ptr<client::Client> client = ConnectFromFlags("info");
  if (client == nullptr) return kExitUsage;
  absl::StatusOr<client::v1::ServerInfo> info = client->GetServerInfo(CallOptionsFromFlags());
  if (!info.ok()) return ReportError("info", info.status());
  if (absl::GetFlag(FLAGS_json)) {
    std::string text;
    google::protobuf::util::JsonPrintOptions options;
    options.add_whitespace = true;
    options.preserve_proto_field_names = true;
    (void)google::protobuf::util::MessageToJsonString(*info, &text, options);
    std::fwrite(text.data(), 1, text.size(), stdout);
    return kExitOk;
  }
  PrintInfo(*info);
  return kExitOk;
}

}  // namespace

Command InfoCommand() {
  return Command{"info", "print the server's version, limits, devices, ops and counters",
                 "Usage: gradserve info [--target=HOST:PORT] [--ops] [--json]",
                 ConnectionFlags({"ops", "json"}), RunInfo};
}

}  // namespace gradserve::cli
