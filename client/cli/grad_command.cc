// gradserve grad FILE.json: sends a GradRequest written in protobuf JSON.

#include <cstdio>
#include <fstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "client/cli/command.h"
#include "google/protobuf/util/json_util.h"

ABSL_FLAG(std::string, output, "",
          "Write the whole GradResponse as protobuf JSON to this file ('-' for stdout) instead "
          "of printing the gradients.");
ABSL_FLAG(std::string, request_id, "", "Overrides the request's request_id.");

namespace gradserve::cli {
namespace {

absl::Status WriteFile(const std::string& path, const std::string& text) {
  if (path == "-") {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return absl::OkStatus();
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

void PrintResult(const client::GradResult& r) {
  PrintCalls(r.calls);
  PrintValues(r.values);
  std::printf(
      "nodes %lld; server time: queue %.3f ms, forward %.3f ms, backward %.3f ms, "
      "total %.3f ms\n",
      static_cast<long long>(r.num_nodes), r.timings.queue_us() / 1e3, r.timings.forward_us() / 1e3,
      r.timings.backward_us() / 1e3, r.timings.total_us() / 1e3);
}

int RunGrad(const std::vector<std::string>& args) {
  if (args.size() != 1) {
    std::fprintf(stderr, "gradserve grad: expected one FILE.json ('-' for stdin); see --help\n");
    return kExitUsage;
  }
  client::v1::GradRequest request;
  if (int code = ReadRequestFile("grad", args[0], &request); code != kExitOk) return code;
  if (const std::string id = absl::GetFlag(FLAGS_request_id); !id.empty()) {
    request.set_request_id(id);
  }

  std::unique_ptr<client::Client> client = ConnectFromFlags("grad");
  if (client == nullptr) return kExitUsage;
  absl::StatusOr<client::v1::GradResponse> response =
      client->ComputeGradients(request, CallOptionsFromFlags());
  if (!response.ok()) return ReportError("grad", response.status());

  if (const std::string output = absl::GetFlag(FLAGS_output); !output.empty()) {
    std::string text;
    google::protobuf::util::JsonPrintOptions print_options;
    print_options.add_whitespace = true;
    print_options.preserve_proto_field_names = true;
    if (auto s = google::protobuf::util::MessageToJsonString(*response, &text, print_options);
        !s.ok()) {
      return ReportError("grad", absl::InternalError(s.ToString()));
    }
    if (absl::Status s = WriteFile(output, text); !s.ok()) return ReportError("grad", s);
    return kExitOk;
  }
  absl::StatusOr<client::GradResult> result = client::FromProto(*response);
  if (!result.ok()) return ReportError("grad", result.status());
  PrintResult(*result);
  return kExitOk;
}

}  // namespace

Command GradCommand() {
  return Command{
      "grad", "send a GradRequest written in protobuf JSON; print the gradients",
      "Usage: gradserve grad [--target=HOST:PORT] [--output=FILE.json] FILE.json\n\n"
      "Sends the GradRequest in FILE.json ('-' for stdin; protobuf JSON, see examples/ and\n"
      "proto/gradserve/v1/) and prints each call's gradients, or with --output writes the\n"
      "GradResponse as JSON. Requests too large for one message are streamed. Exit code 0 on\n"
      "success, 1 when the call fails (its gRPC status is printed), 2 for bad arguments.",
      ConnectionFlags({"output", "max_elements", "request_id"}), RunGrad};
}

}  // namespace gradserve::cli
