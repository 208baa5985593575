#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/time/time.h"
#include "client/cli/command.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "The server, host:port.");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(60),
          "Deadline of each call (e.g. 500ms, 30s, 5m); the server stops the work when it "
          "passes. 'inf' for none.");

namespace gradserve::cli {

std::unique_ptr<client::Client> ConnectFromFlags() {
  return client::Client::Connect(absl::GetFlag(FLAGS_target));
}

client::CallOptions CallOptionsFromFlags() {
  client::CallOptions options;
  options.timeout = absl::GetFlag(FLAGS_timeout);
  return options;
}

int ReportError(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "gradserve %s: %s: %s\n", what.c_str(),
               absl::StatusCodeToString(status.code()).c_str(),
               std::string(status.message()).c_str());
  return kExitFailure;
}

}  // namespace gradserve::cli
