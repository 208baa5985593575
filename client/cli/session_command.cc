// gradserve session FORWARD.json: a graph session from files (docs/sessions.md): Forward, an
// optional Extend, then backward calls, then Release.

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "client/cli/command.h"

ABSL_FLAG(std::string, extend, "",
          "A GradRequest in protobuf JSON whose graph (leaves and ops that may read the "
          "session's values) is added to the session after the forward pass (Extend); its "
          "return_values are printed, and its calls run after FORWARD.json's.");
ABSL_FLAG(int, backward_calls, 1,
          "Backward calls to make on the session, each with every backward call of the files. "
          "More than one needs retain_graph in the calls, as in PyTorch.");

namespace gradserve::cli {
namespace {

// At most this many Backward calls: a typo (an extra zero) must not hold a server for hours.
constexpr int kMaxBackwardCalls = 100'000;

int RunSession(const std::vector<std::string>& args) {
  if (args.size() != 1) {
    std::fprintf(stderr,
                 "gradserve session: expected one FORWARD.json ('-' for stdin); see "
                 "--help\n");
    return kExitUsage;
  }
  const int repeats = absl::GetFlag(FLAGS_backward_calls);
  if (repeats < 0 || repeats > kMaxBackwardCalls) {
    std::fprintf(stderr, "gradserve session: --backward_calls=%d: use 0 to %d\n", repeats,
                 kMaxBackwardCalls);
    return kExitUsage;
  }
  client::v1::GradRequest forward;
  if (int code = ReadRequestFile("session", args[0], &forward); code != kExitOk) return code;
  client::v1::GradRequest extension;
  const std::string extend = absl::GetFlag(FLAGS_extend);
  if (!extend.empty()) {
    if (int code = ReadRequestFile("session", extend, &extension); code != kExitOk) return code;
  }
  std::vector<client::v1::BackwardCall> calls(forward.calls().begin(), forward.calls().end());
  calls.insert(calls.end(), extension.calls().begin(), extension.calls().end());

  std::unique_ptr<client::Client> client = ConnectFromFlags("session");
  if (client == nullptr) return kExitUsage;
  // Every call's own deadline; the session is released by its destructor on any return.
  absl::StatusOr<std::unique_ptr<client::Session>> session =
      client->Forward(forward, CallOptionsFromFlags());
  if (!session.ok()) return ReportError("session: forward", session.status());
  std::printf("session %s: %lld nodes\n", (*session)->id().c_str(),
              static_cast<long long>((*session)->num_nodes()));
  PrintValues((*session)->values());
  if (!extend.empty()) {
    absl::StatusOr<std::vector<std::pair<std::string, client::HostTensor>>> values =
        (*session)->Extend(extension.graph(),
                           {extension.return_values().begin(), extension.return_values().end()},
                           CallOptionsFromFlags());
    if (!values.ok()) return ReportError("session: extend", values.status());
    std::printf("extended\n");
    PrintValues(*values);
  }
  for (int k = 0; k < repeats; ++k) {
    absl::StatusOr<std::vector<client::CallGradients>> result =
        (*session)->Backward(calls, CallOptionsFromFlags());
    if (!result.ok()) return ReportError(absl::StrCat("session: backward ", k), result.status());
    std::printf("backward %d:\n", k);
    PrintCalls(*result);
  }
  if (absl::Status s = (*session)->Release(CallOptionsFromFlags()); !s.ok()) {
    return ReportError("session: release", s);
  }
  std::printf("released\n");
  return kExitOk;
}

}  // namespace

Command SessionCommand() {
  return Command{
      "session", "run a graph session from files: forward, extend, backward calls, release",
      "Usage: gradserve session [--target=HOST:PORT] [--extend=EXT.json] [--backward_calls=N]\n"
      "                         FORWARD.json\n\n"
      "Runs a graph session (docs/sessions.md) on one server: Forward with the graph of the\n"
      "GradRequest in FORWARD.json ('-' for stdin; protobuf JSON, as `gradserve grad` takes),\n"
      "printing the session id and its return_values; then, with --extend, Extend with the\n"
      "graph of EXT.json, printing its return_values; then N Backward calls, each running the\n"
      "backward calls of FORWARD.json and EXT.json in order, printing their gradients; then\n"
      "Release. All calls go over one connection, to the server that answered the Forward,\n"
      "even when --target names several. Exit code 0 on success, 1 when a call fails (its\n"
      "gRPC status is printed; the session is released), 2 for bad arguments.",
      ConnectionFlags({"extend", "backward_calls", "max_elements"}), RunSession};
}

}  // namespace gradserve::cli
