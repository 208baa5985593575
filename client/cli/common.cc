#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/cli/command.h"
#include "client/library/channel_credentials.h"
#include "client/library/channel_target.h"
#include "google/protobuf/util/json_util.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051",
          "The server: host:port; or several, as a comma-separated list of IP:PORT or "
          "[IPV6]:PORT, or dns:///NAME:PORT for a name that resolves to every replica. Calls "
          "are spread over the addresses (round_robin) and a call that finds one unavailable "
          "is retried on another, up to 4 attempts (Note [Several replicas] in "
          "client/library/channel_target.h).");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(60),
          "Deadline of each call (e.g. 500ms, 30s, 5m); the server stops the work when it "
          "passes. 'inf' for none.");
ABSL_FLAG(bool, tls, false,
          "Connect with TLS, checking the server's certificate against the system's CAs (or "
          "--tls_ca's). Implied by --tls_ca, --tls_cert and --tls_key.");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM file of the CA(s) the server's certificate must chain to (TLS).");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM file of this client's certificate chain, for a server that requires client "
          "certificates (mutual TLS); with --tls_key.");
ABSL_FLAG(std::string, tls_key, "", "PEM file of --tls_cert's private key.");
ABSL_FLAG(std::string, trace_id, "",
          "A trace id for the call: a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>) is sent as "
          "'traceparent', anything else as 'x-request-id'; the server logs it and echoes it "
          "back. Empty: none.");
ABSL_FLAG(int, max_elements, 16, "Elements of each tensor to print.");
ABSL_FLAG(std::string, token_file, "",
          "File whose first line is this client's bearer token, sent as 'authorization: "
          "Bearer TOKEN' (TLS only). Empty: the environment variable GRADSERVE_TOKEN, if set.");

namespace gradserve::cli {

std::vector<std::string> ConnectionFlags(std::vector<std::string> own) {
  for (const char* flag :
       {"target", "timeout", "tls", "tls_ca", "tls_cert", "tls_key", "token_file", "trace_id"}) {
    own.push_back(flag);
  }
  return own;
}

absl::StatusOr<client::ClientOptions> ClientOptionsFromFlags() {
  client::ChannelSecurity security;
  security.tls = absl::GetFlag(FLAGS_tls);
  security.tls_ca_file = absl::GetFlag(FLAGS_tls_ca);
  security.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  security.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  if (const std::string file = absl::GetFlag(FLAGS_token_file); !file.empty()) {
    absl::StatusOr<std::string> token = client::ReadTokenFile(file, "--token_file");
    if (!token.ok()) return token.status();
    security.token = *std::move(token);
  } else if (const char* env = std::getenv("GRADSERVE_TOKEN"); env != nullptr && *env != 0) {
    security.token = env;
    if (!client::IsValidToken(security.token)) {
      return absl::InvalidArgumentError("GRADSERVE_TOKEN must be printable ASCII without spaces");
    }
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      client::MakeChannelCredentials(security);
  if (!credentials.ok()) return credentials.status();
  client::ClientOptions options;
  options.credentials = *std::move(credentials);
  return options;
}

std::unique_ptr<client::Client> ConnectFromFlags(const std::string& command,
                                                 const std::string& target) {
  absl::StatusOr<client::ClientOptions> options = ClientOptionsFromFlags();
  const std::string chosen = target.empty() ? absl::GetFlag(FLAGS_target) : target;
  const absl::Status checked =
      options.ok() ? client::GrpcTarget(chosen).status() : options.status();
  if (!checked.ok()) {
    std::fprintf(stderr, "gradserve %s: %s\n", command.c_str(),
                 std::string(checked.message()).c_str());
    return nullptr;
  }
  return client::Client::Connect(chosen, *std::move(options));
}

client::CallOptions CallOptionsFromFlags() {
  client::CallOptions options;
  options.timeout = absl::GetFlag(FLAGS_timeout);
  options.trace_id = absl::GetFlag(FLAGS_trace_id);
  return options;
}

void PrintCalls(const std::vector<client::CallGradients>& calls) {
  const int max_elements = absl::GetFlag(FLAGS_max_elements);
  for (size_t c = 0; c < calls.size(); ++c) {
    std::printf("call %zu:\n", c);
    for (const client::Gradient& g : calls[c].gradients) {
      std::printf("  d/d %s%s: %s\n", g.name.c_str(), g.connected ? "" : " (not connected)",
                  g.value ? client::FormatTensor(*g.value, max_elements).c_str() : "none");
    }
  }
}

void PrintValues(const std::vector<std::pair<std::string, client::HostTensor>>& values) {
  const int max_elements = absl::GetFlag(FLAGS_max_elements);
  for (const auto& [name, value] : values) {
    std::printf("value %s: %s\n", name.c_str(), client::FormatTensor(value, max_elements).c_str());
  }
}

int ReadRequestFile(const std::string& command, const std::string& path,
                    client::v1::GradRequest* request) {
  std::stringstream buffer;
  if (path == "-") {
    buffer << std::cin.rdbuf();
  } else {
    std::ifstream in(path, std::ios::binary);
    if (!in) return ReportError(command, absl::NotFoundError(absl::StrCat("cannot open ", path)));
    buffer << in.rdbuf();
  }
  if (auto s = google::protobuf::util::JsonStringToMessage(buffer.str(), request); !s.ok()) {
    std::fprintf(stderr, "gradserve %s: %s is not a GradRequest in protobuf JSON: %s\n",
                 command.c_str(), path.c_str(), s.ToString().c_str());
    return kExitUsage;
  }
  return kExitOk;
}

int ReportError(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "gradserve %s: %s: %s\n", what.c_str(),
               absl::StatusCodeToString(status.code()).c_str(),
               std::string(status.message()).c_str());
  return kExitFailure;
}

}  // namespace gradserve::cli
