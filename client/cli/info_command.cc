// gradserve info: the server's version, limits, devices, ops and counters.

#include <cstdio>
#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "client/cli/command.h"
#include "google/protobuf/util/json_util.h"

ABSL_FLAG(bool, json, false, "Print the ServerInfo message as protobuf JSON.");
ABSL_FLAG(bool, ops, false, "List every op with its inputs and attributes.");
// Shared with gradserve load (load_command.cc), whose default "summary" is info's plain text.
ABSL_DECLARE_FLAG(std::string, format);

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
  const client::v1::Counters& counters = info.counters();
  if (l.shared_memory_prefix().empty()) {
    std::printf("shared memory: off (--shared_memory_prefix)\n");
  } else {
    std::printf(
        "shared memory: keys %s*, %lld regions per tenant, idle TTL %lld ms; %lld regions "
        "(%lld B) registered now\n",
        l.shared_memory_prefix().c_str(), static_cast<long long>(l.max_shared_memory_regions()),
        static_cast<long long>(l.shared_memory_idle_ttl_ms()),
        static_cast<long long>(counters.shared_memory_regions()),
        static_cast<long long>(counters.shared_memory_bytes()));
  }
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

// A table cell's text: `|` would end the cell.
std::string Cell(const std::string& text) { return absl::StrReplaceAll(text, {{"|", "\\|"}}); }

std::string MarkdownInputs(const client::v1::OpInfo& op) {
  std::vector<std::string> inputs;
  for (int i = 0; i < op.inputs_size(); ++i) {
    std::string input = absl::StrCat("`", op.inputs(i), "`");
    if (op.variadic()) absl::StrAppend(&input, " (one or more)");
    if (i >= op.inputs_size() - op.optional_inputs()) absl::StrAppend(&input, " (optional)");
    inputs.push_back(std::move(input));
  }
  return inputs.empty() ? "none" : absl::StrJoin(inputs, ", ");
}

std::string MarkdownOutputs(const client::v1::OpInfo& op) {
  if (op.num_outputs() < 0) return "as its attributes say";
  return absl::StrCat(op.num_outputs());
}

std::string MarkdownDTypes(const client::v1::OpInfo& op) {
  std::vector<std::string> dtypes;
  for (int d : op.dtypes()) dtypes.push_back(DTypeShortName(d));
  return absl::StrJoin(dtypes, ", ");
}

// docs/ops.md: what the test docs_ops_md compares with the committed file.
void PrintOpsMarkdown(const client::v1::ServerInfo& info) {
  std::string out = absl::StrCat(
      "# Ops\n\n"
      "<!-- Generated by `gradserve info --ops --format=markdown` from the server's op "
      "registry; do not edit.\n"
      "     Regenerate with scripts/generate_ops_md; ctest docs_ops_md checks it. -->\n\n"
      "Every op a graph may name (",
      info.ops_size(),
      " ops), with PyTorch's names, argument names and semantics. An op reads its inputs by "
      "value name in the order listed; optional inputs may be left out from the end. "
      "Attributes are `Op.attrs` entries. float32 and float64 are differentiable; int64 and "
      "bool serve as indices, targets and masks. A live server lists the same with "
      "`gradserve info --ops`.\n\n"
      "| op | PyTorch | inputs | outputs | dtypes |\n"
      "| --- | --- | --- | --- | --- |\n");
  for (const auto& op : info.ops()) {
    absl::StrAppend(&out, "| [", op.name(), "](#", op.name(), ") | `", op.torch(), "` | ",
                    MarkdownInputs(op), " | ", MarkdownOutputs(op), " | ", MarkdownDTypes(op),
                    " |\n");
  }
  for (const auto& op : info.ops()) {
    const std::string& doc = op.doc();
    const char* period = !doc.empty() && doc.back() == '.' ? "" : ".";
    absl::StrAppend(&out, "\n## ", op.name(), "\n\n", doc, period, "\n\n- PyTorch: `", op.torch(),
                    "`\n- inputs: ", MarkdownInputs(op), "\n- outputs: ", MarkdownOutputs(op),
                    "\n- dtypes: ", MarkdownDTypes(op), "\n");
    if (op.attrs_size() == 0) continue;
    absl::StrAppend(&out,
                    "\n| attribute | type | required | meaning |\n"
                    "| --- | --- | --- | --- |\n");
    for (const auto& a : op.attrs()) {
      absl::StrAppend(&out, "| `", a.name(), "` | ", a.type(), " | ", a.required() ? "yes" : "no",
                      " | ", Cell(a.doc()), " |\n");
    }
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
}

int RunInfo(const std::vector<std::string>& args) {
  if (!args.empty()) {
    std::fprintf(stderr, "gradserve info: takes no arguments; see --help\n");
    return kExitUsage;
  }
  std::string format = absl::GetFlag(FLAGS_format);
  if (format == "summary") format = "text";
  if (format != "text" && format != "markdown") {
    std::fprintf(stderr, "gradserve info: --format must be text or markdown, not '%s'\n",
                 format.c_str());
    return kExitUsage;
  }
  if (format == "markdown" && (!absl::GetFlag(FLAGS_ops) || absl::GetFlag(FLAGS_json))) {
    std::fprintf(stderr, "gradserve info: --format=markdown needs --ops and not --json\n");
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
  if (format == "markdown") {
    PrintOpsMarkdown(*info);
  } else {
    PrintInfo(*info);
  }
  return kExitOk;
}

}  // namespace

Command InfoCommand() {
  return Command{"info", "print the server's version, limits, devices, ops and counters",
                 "Usage: gradserve info [--target=HOST:PORT] [--ops [--format=markdown]] [--json]",
                 ConnectionFlags({"ops", "json", "format"}), RunInfo};
}

}  // namespace gradserve::cli
