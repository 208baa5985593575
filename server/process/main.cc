// gradserve-server: computes gradients for gRPC clients. See --help.

#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "engine/device/device_registry.h"
#include "program/flag_arguments.h"
#include "program/host_malloc.h"
#include "program/process_start.h"
#include "server/base/log.h"
#include "server/process/devices_flag.h"
#include "server/service/grad_server.h"
#include "server/service/server_info.h"
#include "server/service/server_options.h"

namespace {
const gradserve::server::ServerOptions kDefaults;
}  // namespace

ABSL_FLAG(std::string, listen, kDefaults.listen_address,
          "Address to listen on, host:port. Port 0 picks a free port (logged at start).");
ABSL_FLAG(int, worker_threads, kDefaults.worker_threads,
          "Engine CPU worker threads, i.e. requests computed at once. 0: one per core.");
ABSL_FLAG(int64_t, max_message_bytes, kDefaults.max_message_bytes,
          "Largest gRPC message received: a unary request or one chunk of a stream. Larger "
          "requests must use ComputeGradientsStream (the C++ client does so by itself).");
ABSL_FLAG(int64_t, max_request_bytes, kDefaults.max_request_bytes,
          "Largest serialized request, streamed in chunks.");
ABSL_FLAG(int64_t, chunk_bytes, kDefaults.chunk_bytes,
          "Size of the chunks a streamed response is cut into; below --max_message_bytes.");
ABSL_FLAG(int64_t, max_in_flight, kDefaults.max_in_flight,
          "Requests admitted at once (running or queued for a worker); more are refused with "
          "RESOURCE_EXHAUSTED.");
ABSL_FLAG(int64_t, max_inline_cost, kDefaults.max_inline_cost,
          "Unary grad requests whose estimated cost is at most this run at once on gRPC's "
          "thread instead of queuing for a worker thread: cheaper for small requests. The cost "
          "is (leaves + ops + names) x (backward calls + 1) x the largest possible tensor's "
          "elements (at least 64) + the request's bytes, for requests of elementwise ops and "
          "reductions on the CPU; see Note [Inline or pool] in server/run/dispatch.h. 0: every "
          "request uses the workers.");
ABSL_FLAG(std::string, log_requests, gradserve::server::LogRequestsName(kDefaults.log_requests),
          "Which grad requests get a line on stderr (id, status, duration, sizes): all, errors "
          "(failed or refused ones only) or none. A line per request costs a write to stderr, "
          "a noticeable share of a small request's cost, hence the default.");
ABSL_FLAG(int64_t, max_ops, kDefaults.limits.max_ops,
          "Ops per request graph, sub-graphs included.");
ABSL_FLAG(int64_t, max_leaves, kDefaults.limits.max_leaves, "Leaf tensors per request graph.");
ABSL_FLAG(int64_t, max_tensor_elements, kDefaults.limits.max_tensor_elements,
          "Elements of any one tensor, given or computed.");
ABSL_FLAG(int64_t, max_memory_bytes, kDefaults.limits.max_memory_bytes,
          "Bytes of all tensors of one request at once.");
ABSL_FLAG(int64_t, max_nesting, kDefaults.limits.max_nesting,
          "Depth of checkpoint bodies within checkpoint bodies.");
ABSL_FLAG(int64_t, max_backward_calls, kDefaults.limits.max_backward_calls,
          "Backward calls per request.");
ABSL_FLAG(int64_t, max_name_bytes, kDefaults.limits.max_name_bytes,
          "Bytes of any one string of a request: request id, value, leaf, op and attribute "
          "names, string attributes, device names. Longer ones are refused (INVALID_ARGUMENT).");
ABSL_FLAG(int64_t, log_refusals_per_second, kDefaults.log_refusals_per_second,
          "At most this many log lines a second for failed and refused requests; the others are "
          "counted in a summary line.");
ABSL_FLAG(std::string, devices, "all",
          "Devices requests may name besides the CPU (which is always there): 'all' (the CPU "
          "and every GPU found, none being fine), or a comma-separated list of 'cpu', 'cuda' "
          "(every GPU; at least one must exist) and 'cuda:N' (GPU N, as numbered by the CUDA "
          "driver). GPUs named by index are renumbered in the order given, as with "
          "CUDA_VISIBLE_DEVICES: --devices=cuda:1 serves physical GPU 1 as cuda:0. A GPU that "
          "does not exist stops the server at start. Simulated devices: --simulated_devices.");
ABSL_FLAG(int, simulated_devices, 0,
          "Simulated accelerators to register (sim:0 ...): host memory behind a device's "
          "interface, with their own worker threads.");
ABSL_FLAG(absl::Duration, grace_period, absl::Seconds(25),
          "On SIGTERM or SIGINT: how long calls in flight may take to finish before they are "
          "cancelled. Keep below Kubernetes' terminationGracePeriodSeconds.");

namespace gradserve::server {
namespace {

absl::StatusOr<ServerOptions> OptionsFromFlags() {
  ServerOptions o;
  o.listen_address = absl::GetFlag(FLAGS_listen);
  o.worker_threads = absl::GetFlag(FLAGS_worker_threads);
  o.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  o.max_request_bytes = absl::GetFlag(FLAGS_max_request_bytes);
  o.chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
  o.max_in_flight = absl::GetFlag(FLAGS_max_in_flight);
  o.max_inline_cost = absl::GetFlag(FLAGS_max_inline_cost);
  if (absl::Status s = ParseLogRequests(absl::GetFlag(FLAGS_log_requests), &o.log_requests);
      !s.ok()) {
    return s;
  }
  o.limits.max_ops = absl::GetFlag(FLAGS_max_ops);
  o.limits.max_leaves = absl::GetFlag(FLAGS_max_leaves);
  o.limits.max_tensor_elements = absl::GetFlag(FLAGS_max_tensor_elements);
  o.limits.max_memory_bytes = absl::GetFlag(FLAGS_max_memory_bytes);
  o.limits.max_nesting = absl::GetFlag(FLAGS_max_nesting);
  o.limits.max_backward_calls = absl::GetFlag(FLAGS_max_backward_calls);
  o.limits.max_name_bytes = absl::GetFlag(FLAGS_max_name_bytes);
  o.log_refusals_per_second = absl::GetFlag(FLAGS_log_refusals_per_second);
  return o;
}

int Main() {
  // Block the stop signals in every thread (threads inherit the mask), so that this thread
  // alone takes them, with sigwait, outside any signal handler.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  absl::StatusOr<DeviceSelection> selection = ParseDevicesFlag(absl::GetFlag(FLAGS_devices));
  if (!selection.ok()) {
    std::fprintf(stderr, "gradserve-server: %s\n",
                 std::string(selection.status().message()).c_str());
    return 2;
  }
  std::vector<std::string> gpus;
  if (absl::Status s = RegisterSelectedDevices(*selection, &gpus); !s.ok()) {
    std::fprintf(stderr, "gradserve-server: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  for (const std::string& line : gpus) LogLine(line);
  if (const int n = absl::GetFlag(FLAGS_simulated_devices); n > 0) {
    if (absl::Status s = RegisterSimulatedDevices(n); !s.ok()) {
      std::fprintf(stderr, "gradserve-server: --simulated_devices: %s\n", s.ToString().c_str());
      return 2;
    }
  }
  const absl::StatusOr<ServerOptions> parsed = OptionsFromFlags();
  if (absl::Status s = parsed.ok() ? CheckOptions(*parsed) : parsed.status(); !s.ok()) {
    std::fprintf(stderr, "gradserve-server: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  const ServerOptions& options = *parsed;
  absl::StatusOr<std::unique_ptr<GradServer>> server = GradServer::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "gradserve-server: %s\n", std::string(server.status().message()).c_str());
    return 1;
  }
  std::string host = options.listen_address.substr(0, options.listen_address.rfind(':'));
  LogLine(absl::StrCat("listening on ", host, ":", (*server)->port(), " (version ", ServerVersion(),
                       ", malloc ", gradserve::kProcessMallocName, ")"));
  LogLine(absl::StrCat("limits: ", DescribeLimits(DescribeServer(options).limits())));

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  const absl::Duration grace = absl::GetFlag(FLAGS_grace_period);
  LogLine(absl::StrCat("got signal ", signal_number, "; draining for up to ",
                       absl::FormatDuration(grace)));
  const bool drained = (*server)->Shutdown(grace);
  LogLine(drained ? "every call in flight finished; exiting"
                  : "grace period over; calls still in flight were cancelled; exiting");
  server->reset();
  return 0;
}

}  // namespace
}  // namespace gradserve::server

int main(int argc, char** argv) {
  gradserve::StartProcess();  // Note [The server's malloc], Note [Mutex deadlock detection]
  absl::SetProgramUsageMessage(
      "Computes gradients for gRPC clients (service gradserve.v1.GradService, plus "
      "grpc.health.v1 and server reflection).\n"
      "Usage: gradserve-server [--listen=127.0.0.1:50051] [--flags...]\n"
      "Stops on SIGTERM or SIGINT: health turns NOT_SERVING, new calls get UNAVAILABLE, calls "
      "in flight finish within --grace_period, then it exits 0.");
  // --help lists this file's flags: absl's default looks for a file named after the program,
  // and would list none.
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view path) {
    return absl::EndsWith(path, "server/process/main.cc");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  absl::SetFlagsUsageConfig(usage);
  // Note [Flag spelling], Note [Flags checked first]
  if (!gradserve::ParseFlags(argc, argv, "gradserve-server").has_value()) return 2;
  return gradserve::server::Main();
}
