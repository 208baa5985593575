// gradserve health: the standard grpc.health.v1 check.

#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "client/cli/command.h"

ABSL_FLAG(std::string, service, "",
          "The service to ask about (e.g. gradserve.v1.GradService); empty for the server.");

namespace gradserve::cli {
namespace {

int RunHealth(const std::vector<std::string>& args) {
  if (!args.empty()) {
    std::fprintf(stderr, "gradserve health: takes no arguments; see --help\n");
    return kExitUsage;
  }
  std::unique_ptr<client::Client> client = ConnectFromFlags("health");
  if (client == nullptr) return kExitUsage;
  absl::StatusOr<std::string> status =
      client->CheckHealth(absl::GetFlag(FLAGS_service), CallOptionsFromFlags());
  if (!status.ok()) return ReportError("health", status.status());
  std::printf("%s\n", status->c_str());
  return *status == "SERVING" ? kExitOk : kExitFailure;
}

}  // namespace

Command HealthCommand() {
  return Command{"health", "ask the server's health service (exit 0 if SERVING)",
                 "Usage: gradserve health [--target=HOST:PORT] [--service=NAME]\n\n"
                 "Prints SERVING, NOT_SERVING or the call's error; exits 0 only if SERVING.",
                 ConnectionFlags({"service"}), RunHealth};
}

}  // namespace gradserve::cli
