// gradserve ping: round trips of the cheapest call.

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/time/clock.h"
#include "client/cli/command.h"

ABSL_FLAG(int, count, 3, "Pings to send, one after another.");
ABSL_FLAG(int, payload_bytes, 0, "Bytes of payload each ping carries (and gets back).");

namespace gradserve::cli {
namespace {

int RunPing(const std::vector<std::string>& args) {
  if (!args.empty()) {
    std::fprintf(stderr, "gradserve ping: takes no arguments; see --help\n");
    return kExitUsage;
  }
  const int count = absl::GetFlag(FLAGS_count);
  const int payload_bytes = absl::GetFlag(FLAGS_payload_bytes);
  if (count < 1 || payload_bytes < 0) {
    std::fprintf(stderr, "gradserve ping: --count must be positive, --payload_bytes >= 0\n");
    return kExitUsage;
  }
  std::unique_ptr<client::Client> client = ConnectFromFlags("ping");
  if (client == nullptr) return kExitUsage;
  const std::string payload(payload_bytes, 'x');
  std::vector<double> ms;
  for (int i = 0; i < count; ++i) {
    const absl::Time start = absl::Now();
    absl::StatusOr<std::string> echo = client->Ping(payload, CallOptionsFromFlags());
    if (!echo.ok()) return ReportError("ping", echo.status());
    if (*echo != payload) {
      return ReportError("ping",
                         absl::DataLossError("the echoed payload differs from the one sent"));
    }
    ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
    std::printf("ping %d: %.3f ms\n", i, ms.back());
  }
  std::sort(ms.begin(), ms.end());
  std::printf("%d pings: min %.3f ms, median %.3f ms, max %.3f ms\n", count, ms.front(),
              ms[ms.size() / 2], ms.back());
  return kExitOk;
}

}  // namespace

Command PingCommand() {
  return Command{"ping", "measure round trips of the cheapest call",
                 "Usage: gradserve ping [--target=HOST:PORT] [--count=N] [--payload_bytes=N]\n\n"
                 "The first ping includes connecting.",
                 ConnectionFlags({"count", "payload_bytes"}), RunPing};
}

}  // namespace gradserve::cli
