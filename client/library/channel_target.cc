#include "client/library/channel_target.h"

#include <arpa/inet.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "grpcpp/create_channel.h"

namespace gradserve::client {
namespace {

enum class Family { kNone, kIpv4, kIpv6 };

bool IsPort(absl::string_view port) {
  return !port.empty() && port.size() <= 5 && absl::c_all_of(port, absl::ascii_isdigit);
}

// The family of "A.B.C.D:PORT" or "[V6]:PORT"; kNone for anything else.
Family AddressFamily(absl::string_view entry) {
  const size_t colon = entry.rfind(':');
  if (colon == absl::string_view::npos || !IsPort(entry.substr(colon + 1))) return Family::kNone;
  absl::string_view host = entry.substr(0, colon);
  unsigned char bytes[16];
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) {
    const std::string inner(host.substr(1, host.size() - 2));
    return inet_pton(AF_INET6, inner.c_str(), bytes) == 1 ? Family::kIpv6 : Family::kNone;
  }
  return inet_pton(AF_INET, std::string(host).c_str(), bytes) == 1 ? Family::kIpv4 : Family::kNone;
}

}  // namespace

absl::StatusOr<std::string> GrpcTarget(const std::string& target) {
  const std::string trimmed(absl::StripAsciiWhitespace(target));
  if (trimmed.empty()) return absl::InvalidArgumentError("the target is empty");
  // A gRPC URI ("dns:///h:p", "ipv4:a,b", "unix:/path") or a single address: as it is.
  if (!absl::StrContains(trimmed, ',') || absl::StrContains(trimmed, "://") ||
      absl::StartsWith(trimmed, "ipv4:") || absl::StartsWith(trimmed, "ipv6:")) {
    return trimmed;
  }
  std::vector<std::string> entries;
  Family family = Family::kNone;
  for (absl::string_view raw : absl::StrSplit(trimmed, ',')) {
    const std::string entry(absl::StripAsciiWhitespace(raw));
    const Family f = AddressFamily(entry);
    if (f == Family::kNone) {
      return absl::InvalidArgumentError(absl::StrCat(
          "target list entry '", entry,
          "' is not IP:PORT or [IPV6]:PORT; a list holds IP addresses (for a name whose "
          "addresses are the servers, use dns:///NAME:PORT)"));
    }
    if (family != Family::kNone && f != family) {
      return absl::InvalidArgumentError(
          absl::StrCat("target list '", trimmed, "' mixes IPv4 and IPv6 addresses"));
    }
    family = f;
    entries.push_back(entry);
  }
  return absl::StrCat(family == Family::kIpv4 ? "ipv4:" : "ipv6:", absl::StrJoin(entries, ","));
}

namespace {

// A channel to target (GrpcTarget's rules) with credentials, args and service_config, which
// no resolver replaces.
std::shared_ptr<grpc::Channel> CreateChannel(
    const std::string& target, const std::shared_ptr<grpc::ChannelCredentials>& credentials,
    grpc::ChannelArguments args, const char* service_config) {
  const absl::StatusOr<std::string> grpc_target = GrpcTarget(target);
  args.SetServiceConfigJSON(service_config);
  args.SetInt(GRPC_ARG_SERVICE_CONFIG_DISABLE_RESOLUTION, 1);
  return grpc::CreateCustomChannel(
      grpc_target.ok() ? *grpc_target : target,
      credentials != nullptr ? credentials : grpc::InsecureChannelCredentials(), args);
}

}  // namespace

std::shared_ptr<grpc::Channel> CreateClientChannel(
    const std::string& target, const std::shared_ptr<grpc::ChannelCredentials>& credentials,
    grpc::ChannelArguments args) {
  args.SetInt(GRPC_ARG_PER_RPC_RETRY_BUFFER_SIZE, kRetryBufferBytes);
  return CreateChannel(target, credentials, std::move(args), kServiceConfigJson);
}

std::shared_ptr<grpc::Channel> CreateSessionChannel(
    const std::string& target, const std::shared_ptr<grpc::ChannelCredentials>& credentials,
    grpc::ChannelArguments args) {
  return CreateChannel(target, credentials, std::move(args), kSessionServiceConfigJson);
}

}  // namespace gradserve::client
