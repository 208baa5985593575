// gradserve-server: computes gradients for gRPC clients. See --help.

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/device/device_registry.h"
#include "engine/util/parallel.h"
#include "program/flag_arguments.h"
#include "program/host_malloc.h"
#include "program/process_start.h"
#include "server/base/cgroup.h"
#include "server/base/log.h"
#include "server/limits/server_memory.h"
#include "server/process/blas_threads.h"
#include "server/process/cpu_sizing.h"
#include "server/process/devices_flag.h"
#include "server/security/security_options.h"
#include "server/service/grad_server.h"
#include "server/service/server_info.h"
#include "server/service/server_options.h"

namespace {
const gradserve::server::ServerOptions kDefaults;
}  // namespace

ABSL_FLAG(std::string, listen, kDefaults.listen_address,
          "Address to listen on, host:port. Port 0 picks a free port (logged at start).");
// Note [Sizing the server's threads] in server/process/cpu_sizing.h.
ABSL_FLAG(int, worker_threads, kDefaults.worker_threads,
          "Engine CPU worker threads, i.e. requests computed at once. 0: one per CPU the "
          "process may use: its cgroup's CPU quota (cpu.max, or v1's cpu.cfs_quota_us), rounded "
          "up, at most the CPUs of its affinity mask. Printed at start.");
ABSL_FLAG(int, blas_threads, 0,
          "OpenBLAS's threads (shared by the workers for matmul and conv2d). 0: "
          "OPENBLAS_NUM_THREADS if set, else one per CPU the process may use, as for "
          "--worker_threads. The server re-executes itself once at start to apply it (Note "
          "[OpenBLAS's threads] in server/process/blas_threads.h). Printed at start.");
ABSL_FLAG(int, intra_op_threads, 0,
          "Threads that may share one long elementwise loop or sum of a request (Note "
          "[Intra-op parallelism] in engine/util/parallel.h), the worker running it included; "
          "helpers take a share only when idle. 1: off. 0: one per CPU the process may use, as "
          "for --worker_threads. Printed at start.");
ABSL_FLAG(std::string, cgroup_root, "/sys/fs/cgroup",
          "Where the cgroup filesystem is mounted, read for the CPU quota and memory limit that "
          "size the server (the process's cgroup is the one /proc/self/cgroup names). For "
          "tests: a directory of fake cgroup files.");
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
ABSL_FLAG(int64_t, max_uploads, kDefaults.max_uploads,
          "Streamed requests still arriving at once; more are refused with RESOURCE_EXHAUSTED. "
          "An upload takes no engine slot (--max_in_flight) until it has fully arrived.");
ABSL_FLAG(absl::Duration, upload_idle_timeout, kDefaults.upload_idle_timeout,
          "A streamed request whose client sends nothing for this long is ended with "
          "DEADLINE_EXCEEDED, so that stalled clients hold no memory or upload slot.");
ABSL_FLAG(absl::Duration, session_idle_ttl, kDefaults.session_idle_ttl,
          "A graph session (Forward, then Backward calls) that no call used for this long is "
          "ended and its memory freed.");
ABSL_FLAG(int64_t, max_sessions_per_tenant, kDefaults.max_sessions_per_tenant,
          "Graph sessions one tenant (all clients, without --auth_tokens_file) may hold at "
          "once; more Forward calls are refused with RESOURCE_EXHAUSTED.");
ABSL_FLAG(std::string, shared_memory_prefix, kDefaults.shared_memory.prefix,
          "Turns on shared memory for clients on this host (docs/shared_memory.md): they may "
          "register POSIX shared-memory objects whose names start with this prefix, e.g. "
          "/gradserve, and name ranges of them as tensors' values and gradients' destinations. "
          "Empty (the default): off, and RegisterSharedMemory is FAILED_PRECONDITION. Turn it on "
          "only where every client that can reach the port may read and write those objects.");
ABSL_FLAG(int64_t, max_shared_memory_regions, kDefaults.shared_memory.max_per_tenant,
          "Shared-memory regions one tenant may hold at once; more registrations are refused "
          "with RESOURCE_EXHAUSTED. Each region's mapped bytes count against the server's memory "
          "budget (and the tenant's share) while it is registered.");
ABSL_FLAG(absl::Duration, shared_memory_idle_ttl, kDefaults.shared_memory.idle_ttl,
          "A shared-memory region no request named for this long is unregistered and unmapped; "
          "also the longest idle TTL a client may ask for.");
ABSL_FLAG(int64_t, max_server_memory_bytes, kDefaults.max_server_memory_bytes,
          "Bytes all requests together may hold (tensors, autograd state, buffered uploads, "
          "responses); past it new work is refused with RESOURCE_EXHAUSTED, never killed by the "
          "kernel. 0: 60% of the container's memory limit (cgroup memory.max, or v1's "
          "memory.limit_in_bytes, under --cgroup_root), else of physical memory; the rest is "
          "for gRPC's buffers (--grpc_memory_bytes) and the process itself. Printed at start.");
ABSL_FLAG(int64_t, grpc_memory_bytes, kDefaults.grpc_memory_bytes,
          "gRPC's resource quota: bytes its transports may buffer before calls reach the "
          "service. 0: 15% of the container's memory limit, else of physical memory. Printed at "
          "start.");
ABSL_FLAG(bool, accept_compressed, kDefaults.accept_compressed,
          "Take gzip- and deflate-compressed requests (counted decompressed against every "
          "limit). --noaccept_compressed refuses them with UNIMPLEMENTED before decompressing.");
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
          "On SIGTERM, SIGINT or SIGHUP: how long calls in flight may take to finish before they "
          "are cancelled. Keep terminationGracePeriodSeconds above it plus the preStop sleep.");
// Note [Connection limits] in server/service/grad_server.h: what each does, why its default.
ABSL_FLAG(absl::Duration, max_connection_idle, kDefaults.max_connection_idle,
          "Closes (GOAWAY) a connection that has had no call for this long; its client "
          "reconnects on its next call. 'inf': never.");
ABSL_FLAG(absl::Duration, max_connection_age, kDefaults.max_connection_age,
          "Sends GOAWAY to a connection this old (gRPC varies it by +-10%), so that clients "
          "reconnect and spread over the replicas there are now; its calls go on. 'inf': never.");
ABSL_FLAG(absl::Duration, max_connection_age_grace, kDefaults.max_connection_age_grace,
          "How long calls on a connection aged out by --max_connection_age may still run before "
          "the connection is closed.");
ABSL_FLAG(absl::Duration, keepalive_time, kDefaults.keepalive_time,
          "Pings a connection that has been quiet this long, to find clients that vanished. "
          "'inf': never.");
ABSL_FLAG(absl::Duration, keepalive_timeout, kDefaults.keepalive_timeout,
          "Closes a connection whose ping is not answered within this long, cancelling its "
          "calls.");
ABSL_FLAG(absl::Duration, min_client_ping_interval, kDefaults.min_client_ping_interval,
          "How often a client may send keepalive pings, with or without calls; a client that "
          "pings sooner three times is disconnected (GOAWAY too_many_pings).");
ABSL_FLAG(int64_t, max_concurrent_streams, kDefaults.max_concurrent_streams,
          "Calls (HTTP/2 streams) at once on one connection, health watches included; a client "
          "queues more until one ends.");
// Note [Who may call] in server/security/token_auth.h, docs/security.md.
ABSL_FLAG(std::string, tls_cert, "",
          "PEM file of the server's certificate chain: TLS on the serving port (with "
          "--tls_key). Re-read when it changes (every --reload_interval), no restart needed. "
          "Empty: plaintext.");
ABSL_FLAG(std::string, tls_key, "", "PEM file of --tls_cert's private key (unencrypted).");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM file of the CAs that sign client certificates: mutual TLS, a connection without "
          "a client certificate signed by one of them is refused. Needs --tls_cert. Re-read "
          "when it changes.");
ABSL_FLAG(std::string, auth_tokens_file, "",
          "File of the clients' bearer tokens, one per line: NAME TENANT SHA256_HEX [METHODS] "
          "(METHODS: comma-separated grad, info, reflection or all; default grad), the SHA-256 "
          "as `printf %s TOKEN | sha256sum` prints it. Every call but health's then needs "
          "'authorization: Bearer TOKEN'. Reloaded when it changes. Needs --tls_cert. Empty: "
          "no tokens.");
ABSL_FLAG(absl::Duration, reload_interval, kDefaults.security.reload_interval,
          "How often the TLS files and --auth_tokens_file are checked for changes.");
ABSL_FLAG(int64_t, tenant_max_in_flight, kDefaults.security.tenant_max_in_flight,
          "With --auth_tokens_file: requests one tenant may have admitted at once; more are "
          "refused with RESOURCE_EXHAUSTED naming the tenant. 0: half of --max_in_flight.");
ABSL_FLAG(double, tenant_memory_share, kDefaults.security.tenant_memory_share,
          "With --auth_tokens_file: the share, in (0, 1], of --max_server_memory_bytes that one "
          "tenant's requests may hold together.");
ABSL_FLAG(std::string, admin_listen, "",
          "host:port of a plaintext admin address serving health, reflection and "
          "GetServerInfo (which then leaves the serving port unless tokens allow it there). "
          "Keep it on loopback or the pod's network. Empty: none.");
ABSL_FLAG(std::string, log_format, "text",
          "text: log lines as '<time> gradserve-server: <message> key=value ...'; json: one "
          "JSON object per line, with the request log's fields as members.");
ABSL_FLAG(std::string, metrics_listen, "",
          "host:port of a plaintext HTTP address serving Prometheus metrics at GET /metrics, "
          "part of the admin surface: keep it on loopback or the pod's network. Port 0 picks a "
          "free port. Empty: none.");

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
  o.max_uploads = absl::GetFlag(FLAGS_max_uploads);
  o.upload_idle_timeout = absl::GetFlag(FLAGS_upload_idle_timeout);
  o.session_idle_ttl = absl::GetFlag(FLAGS_session_idle_ttl);
  o.max_sessions_per_tenant = absl::GetFlag(FLAGS_max_sessions_per_tenant);
  o.shared_memory.prefix = absl::GetFlag(FLAGS_shared_memory_prefix);
  o.shared_memory.max_per_tenant = absl::GetFlag(FLAGS_max_shared_memory_regions);
  o.shared_memory.idle_ttl = absl::GetFlag(FLAGS_shared_memory_idle_ttl);
  o.max_server_memory_bytes = absl::GetFlag(FLAGS_max_server_memory_bytes);
  o.grpc_memory_bytes = absl::GetFlag(FLAGS_grpc_memory_bytes);
  o.accept_compressed = absl::GetFlag(FLAGS_accept_compressed);
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
  o.max_connection_idle = absl::GetFlag(FLAGS_max_connection_idle);
  o.max_connection_age = absl::GetFlag(FLAGS_max_connection_age);
  o.max_connection_age_grace = absl::GetFlag(FLAGS_max_connection_age_grace);
  o.keepalive_time = absl::GetFlag(FLAGS_keepalive_time);
  o.keepalive_timeout = absl::GetFlag(FLAGS_keepalive_timeout);
  o.min_client_ping_interval = absl::GetFlag(FLAGS_min_client_ping_interval);
  o.max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams);
  o.limits.max_name_bytes = absl::GetFlag(FLAGS_max_name_bytes);
  o.log_refusals_per_second = absl::GetFlag(FLAGS_log_refusals_per_second);
  o.security.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  o.security.tls_key = absl::GetFlag(FLAGS_tls_key);
  o.security.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  o.security.auth_tokens_file = absl::GetFlag(FLAGS_auth_tokens_file);
  o.security.reload_interval = absl::GetFlag(FLAGS_reload_interval);
  o.security.tenant_max_in_flight = absl::GetFlag(FLAGS_tenant_max_in_flight);
  o.security.tenant_memory_share = absl::GetFlag(FLAGS_tenant_memory_share);
  o.security.admin_listen = absl::GetFlag(FLAGS_admin_listen);
  o.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  o.malloc_name = gradserve::kProcessMallocName;
  return o;
}

// Note [Open files]
// Every connection holds a file descriptor, and Linux's default soft RLIMIT_NOFILE is 1024
// (2,000 idle connections used it up), while the hard limit is usually far higher (524288
// under systemd, 1048576 in most container runtimes). A process may raise its soft limit to
// its hard limit without privilege, so the server does so before it starts, and says so in a
// start-up line. Past the hard limit, the listener sheds new connections instead of stopping
// (Note [Our own listening socket] in server/service/listener.h), and --max_connection_idle
// closes what an attacker leaves open.
std::string RaiseOpenFileLimit() {
  rlimit limit;
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return "open files: limit unknown";
  const rlim_t before = limit.rlim_cur;
  // An unlimited hard limit is still capped by the kernel (fs.nr_open); ask for 2^20 then.
  const rlim_t target = limit.rlim_max == RLIM_INFINITY ? rlim_t{1} << 20 : limit.rlim_max;
  if (before != RLIM_INFINITY && before < target) {
    rlimit raised = limit;
    raised.rlim_cur = target;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  auto text = [](rlim_t v) {
    return v == RLIM_INFINITY ? std::string("unlimited") : absl::StrCat(v);
  };
  if (limit.rlim_cur == before) {
    return absl::StrCat("open files: soft limit ", text(before), " (hard limit ",
                        text(limit.rlim_max), ")");
  }
  return absl::StrCat("open files: soft limit ", text(limit.rlim_cur), ", raised from ",
                      text(before), " (hard limit ", text(limit.rlim_max), ")");
}

// Note [Stop signals]
// SIGTERM, SIGINT and SIGHUP stop the server gracefully (Note [Draining] in
// server/service/grad_server.h); only the first one counts. Until the drain ends (the calls in
// flight finished, or the grace period ended) further ones are logged and ignored, and the
// process exits 0: Kubernetes sends SIGTERM once and SIGKILL at the end of
// terminationGracePeriodSeconds, and a second Ctrl-C must not lose the calls in flight.
// No thread may take a stop signal with its default action, which kills the process. main
// blocks the three before any thread of its own starts, so that gRPC's, the workers' and the
// drain's threads inherit the mask; but threads that libraries start before main runs
// (OpenBLAS starts its pool when it is loaded) have them unblocked, and the kernel may hand a
// process's signal to any thread that does not block it. So the three also get a handler,
// which only writes the signal's number to a pipe (write is async-signal-safe), and main's
// thread reads the pipe in ppoll, which unblocks the three for that thread alone while it
// waits: whichever thread takes a signal, it ends up in the pipe, and nothing but main's
// thread acts on it. The drain runs on a thread of its own, which writes a 0 to the pipe when
// it is done, so that main's thread keeps reading, and ignoring, signals until then.
constexpr int kStopSignals[] = {SIGTERM, SIGINT, SIGHUP};
int signal_pipe[2] = {-1, -1};  // written by OnStopSignal and the drain; read by main's thread

void OnStopSignal(int signal_number) {
  const int saved_errno = errno;
  const unsigned char byte = static_cast<unsigned char>(signal_number);
  [[maybe_unused]] const ssize_t written = write(signal_pipe[1], &byte, 1);  // full: dropped
  errno = saved_errno;
}

sigset_t StopSignalSet() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : kStopSignals) sigaddset(&set, s);
  return set;
}

// Installs the handler and blocks the stop signals in this thread, hence in every thread it
// starts. Call first in main, before any thread starts. False if the pipe cannot be made.
bool SetUpStopSignals() {
  if (pipe2(signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return false;
  struct sigaction action = {};
  action.sa_handler = OnStopSignal;
  action.sa_mask = StopSignalSet();  // one handler at a time
  action.sa_flags = SA_RESTART;
  for (int s : kStopSignals) {
    // A signal the process was started with ignored (nohup ignores SIGHUP) stays ignored.
    struct sigaction inherited = {};
    if (sigaction(s, nullptr, &inherited) == 0 && inherited.sa_handler == SIG_IGN) continue;
    sigaction(s, &action, nullptr);
  }
  const sigset_t set = StopSignalSet();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return true;
}

// The next byte of the pipe: a stop signal's number, or 0 when the drain is done. Blocks, with
// the stop signals unblocked for this thread alone while it waits.
int NextStopEvent() {
  sigset_t waiting;
  pthread_sigmask(SIG_SETMASK, nullptr, &waiting);
  for (int s : kStopSignals) sigdelset(&waiting, s);
  for (;;) {
    unsigned char byte = 0;
    if (read(signal_pipe[0], &byte, 1) == 1) return byte;
    pollfd readable = {signal_pipe[0], POLLIN, 0};
    ppoll(&readable, 1, nullptr, &waiting);  // EINTR when the handler ran on this thread
  }
}

const char* SignalName(int signal_number) {
  switch (signal_number) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGHUP:
      return "SIGHUP";
  }
  return "a signal";
}

int Main(char** argv) {
  LogFormat log_format;  // Note [JSON log lines]: before the first line
  if (absl::Status s = ParseLogFormat(absl::GetFlag(FLAGS_log_format), &log_format); !s.ok()) {
    std::fprintf(stderr, "gradserve-server: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  SetLogFormat(log_format);
  // Note [Sizing the server's threads], Note [OpenBLAS's threads]: first, since a
  // re-execution must come before any thread of the server's own starts.
  if (absl::GetFlag(FLAGS_blas_threads) < 0) {
    std::fprintf(stderr, "gradserve-server: --blas_threads must be 0 (from the CPUs) or more\n");
    return 2;
  }
  if (absl::GetFlag(FLAGS_intra_op_threads) < 0) {
    std::fprintf(stderr,
                 "gradserve-server: --intra_op_threads must be 0 (from the CPUs) or more\n");
    return 2;
  }
  const std::optional<BlasStart> reexecuted = TakeReexecMarker();
  const CgroupLimits cgroup = ReadCgroup({absl::GetFlag(FLAGS_cgroup_root)});
  const int affinity_cpus = AffinityCpus();
  CpuSizing cpus = SizeCpus(
      cgroup, affinity_cpus,
      {absl::GetFlag(FLAGS_worker_threads), absl::GetFlag(FLAGS_blas_threads),
       // After the re-execution, the variable is the server's own, not the operator's.
       reexecuted.has_value() ? "" : OpenBlasEnv(), absl::GetFlag(FLAGS_intra_op_threads)});
  std::optional<std::string> blas_warning;
  if (reexecuted.has_value()) {
    int applied = 0;  // what OpenBLAS started with, should the sizing differ this time
    if (absl::SimpleAtoi(OpenBlasEnv(), &applied) && applied > 0) {
      cpus.blas_threads = {applied, reexecuted->threads_source};
    }
  } else if (pollfd stop = {signal_pipe[0], POLLIN, 0}; poll(&stop, 1, 0) == 0) {
    // No stop signal yet: one that OpenBLAS's threads took is in the pipe, and would be lost.
    blas_warning = ReexecWithBlasThreads(cpus.blas_threads.value, cpus.blas_threads.source, argv);
  }
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
  absl::StatusOr<ServerOptions> parsed = OptionsFromFlags();
  if (absl::Status s = parsed.ok() ? CheckOptions(*parsed) : parsed.status(); !s.ok()) {
    std::fprintf(stderr, "gradserve-server: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  parsed->worker_threads = cpus.worker_threads.value;
  SetIntraOpThreads(cpus.intra_op_threads.value);  // Note [Intra-op parallelism]
  parsed->memory = MemoryOf(cgroup);               // Note [Sizing the server's memory]
  const ServerOptions& options = *parsed;
  for (const std::string& warning : cgroup.warnings) LogLine(warning);
  if (blas_warning.has_value()) LogLine(*blas_warning);
  LogLine(RaiseOpenFileLimit());  // Note [Open files]
  absl::StatusOr<std::unique_ptr<GradServer>> server = GradServer::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "gradserve-server: %s\n", std::string(server.status().message()).c_str());
    // A TLS or token file that is missing or wrong is a bad flag value too.
    const absl::StatusCode code = server.status().code();
    return code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kNotFound ? 2
                                                                                             : 1;
  }
  std::string host = options.listen_address.substr(0, options.listen_address.rfind(':'));
  // The sizing first: "listening on" is the line that tells scripts the server is up.
  LogLine(CpuLine(cpus, affinity_cpus));
  if (!blas_warning.has_value()) {
    LogLine(BlasTimeoutLine(!reexecuted.has_value() || reexecuted->timeout_from_environment));
  }
  LogLine((*server)->memory_line());
  LogLine(absl::StrCat(
      "connections: idle ones closed after ", absl::FormatDuration(options.max_connection_idle),
      ", aged out after ", absl::FormatDuration(options.max_connection_age), " (grace ",
      absl::FormatDuration(options.max_connection_age_grace), "), keepalive ping after ",
      absl::FormatDuration(options.keepalive_time), " (timeout ",
      absl::FormatDuration(options.keepalive_timeout), "), client pings at most every ",
      absl::FormatDuration(options.min_client_ping_interval), ", ", options.max_concurrent_streams,
      " streams each"));
  LogLine((*server)->security_line());
  if (const std::string warning =
          ExposureWarning(absl::StrCat(host, ":", (*server)->port()), options.security);
      !warning.empty()) {
    LogLine(warning);
  }
  if ((*server)->admin_port() != 0) {
    const std::string& admin = options.security.admin_listen;
    LogLine(absl::StrCat("admin address (health, reflection, GetServerInfo; plaintext): ",
                         admin.substr(0, admin.rfind(':')), ":", (*server)->admin_port()));
  }
  if ((*server)->metrics_port() != 0) {
    const std::string& metrics = options.metrics_listen;
    LogLine(absl::StrCat("metrics address (Prometheus, GET /metrics; plaintext HTTP): ",
                         metrics.substr(0, metrics.rfind(':')), ":", (*server)->metrics_port()));
  }
  LogLine(absl::StrCat("listening on ", host, ":", (*server)->port(), " (version ", ServerVersion(),
                       ", malloc ", gradserve::kProcessMallocName, ")"));
  LogLine(absl::StrCat("limits: ", DescribeLimits(DescribeServer(options).limits())));

  // Note [Stop signals]
  const int signal_number = NextStopEvent();
  const absl::Duration grace = absl::GetFlag(FLAGS_grace_period);
  const absl::Time deadline = absl::Now() + grace;
  LogLine(absl::StrCat("got ", SignalName(signal_number),
                       ": closing the port, health NOT_SERVING, GOAWAY to every connection; "
                       "calls in flight have up to ",
                       absl::FormatDuration(grace)));
  bool drained = false;
  std::thread drain([&] {
    drained = (*server)->Shutdown(grace);
    const unsigned char done = 0;
    while (write(signal_pipe[1], &done, 1) != 1 && (errno == EINTR || errno == EAGAIN)) {
      absl::SleepFor(absl::Milliseconds(1));  // full of signals: main's thread empties it
    }
  });
  for (int event = NextStopEvent(); event != 0; event = NextStopEvent()) {
    LogLine(absl::StrCat("got ", SignalName(event), " again; ignored while draining (up to ",
                         absl::FormatDuration(absl::Ceil(deadline - absl::Now(), absl::Seconds(1))),
                         " left)"));
  }
  drain.join();
  LogLine(drained ? "every call in flight finished; exiting"
                  : "grace period over; calls still in flight were cancelled; exiting");
  server->reset();
  return 0;
}

}  // namespace
}  // namespace gradserve::server

int main(int argc, char** argv) {
  // Note [Stop signals]: before anything might start a thread.
  if (!gradserve::server::SetUpStopSignals()) {
    std::perror("gradserve-server: pipe2");
    return 1;
  }
  gradserve::StartProcess();  // Note [The server's malloc], Note [Mutex deadlock detection]
  absl::SetProgramUsageMessage(
      "Computes gradients for gRPC clients (service gradserve.v1.GradService, plus "
      "grpc.health.v1 and server reflection).\n"
      "Usage: gradserve-server [--listen=127.0.0.1:50051] [--flags...]\n"
      "Stops on SIGTERM, SIGINT or SIGHUP: the port closes, health turns NOT_SERVING and every "
      "connection gets GOAWAY (clients move to other replicas), calls in flight finish within "
      "--grace_period, then it exits 0; further stop signals meanwhile are ignored.");
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
  return gradserve::server::Main(argv);
}
