// The subcommands of the `gradserve` tool. Each lives in its own file and is listed in main.cc.

#ifndef GRADSERVE_CLIENT_CLI_COMMAND_H_
#define GRADSERVE_CLIENT_CLI_COMMAND_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/library/gradserve_client.h"

namespace gradserve::cli {

// Exit codes of every subcommand.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  // the call failed (its gRPC status is printed)
inline constexpr int kExitUsage = 2;    // bad arguments

struct Command {
  std::string name;     // "grad"
  std::string summary;  // one line for `gradserve --help`
  std::string usage;    // the head of `gradserve NAME --help`
  // The flags the command reads (without "--"), described by its --help. The flags every
  // command that calls the server reads (ConnectionFlags) are listed here too.
  std::vector<std::string> flags;
  // Runs with the positional arguments (flags already parsed); returns the exit code.
  std::function<int(const std::vector<std::string>& args)> run;
};

Command GradCommand();
Command InfoCommand();
Command HealthCommand();
Command PingCommand();
Command GraphCommand();
Command SessionCommand();

// Shared by the commands that call the server (common.cc).
// own plus the flags of the connection: --target, --timeout, --tls, --tls_ca, --tls_cert,
// --tls_key and --token_file.
std::vector<std::string> ConnectionFlags(std::vector<std::string> own);
// The credentials of the connection flags (and GRADSERVE_TOKEN when --token_file is not
// given): INVALID_ARGUMENT or NOT_FOUND naming the flag.
absl::StatusOr<client::ClientOptions> ClientOptionsFromFlags();
// A client for target (default --target) with ClientOptionsFromFlags; null after printing
// "gradserve COMMAND: <why>" when the connection flags are wrong (exit kExitUsage then).
std::unique_ptr<client::Client> ConnectFromFlags(const std::string& command,
                                                 const std::string& target = "");
// A deadline of --timeout.
client::CallOptions CallOptionsFromFlags();
// Prints each call's gradients ("call 0:", then "  d/d NAME: TENSOR"), and values ("value
// NAME: TENSOR"), with at most --max_elements elements each.
void PrintCalls(const std::vector<client::CallGradients>& calls);
void PrintValues(const std::vector<std::pair<std::string, client::HostTensor>>& values);
// Reads the GradRequest in protobuf JSON in path ('-': stdin) into *request. Returns kExitOk,
// or, after printing "gradserve COMMAND: <why>", kExitFailure when the file cannot be read
// and kExitUsage when it is not a GradRequest.
int ReadRequestFile(const std::string& command, const std::string& path,
                    client::v1::GradRequest* request);
// Prints "gradserve WHAT: CODE: message" to stderr; returns kExitFailure.
int ReportError(const std::string& what, const absl::Status& status);

}  // namespace gradserve::cli

#endif  // GRADSERVE_CLIENT_CLI_COMMAND_H_
