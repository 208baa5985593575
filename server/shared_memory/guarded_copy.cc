#include "server/shared_memory/guarded_copy.h"

#include <algorithm>
#include <csetjmp>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace gradserve::server {
namespace {

// The jump target of the copy running on this thread, or null outside one. Written only by its
// own thread, read by the SIGBUS handler on that thread: the signal is synchronous, so it is
// delivered to the thread that touched the page.
thread_local sigjmp_buf* volatile current_copy = nullptr;

// The SIGBUS action before ours, for the faults that are not a guarded copy's.
struct sigaction previous_action;

void OnSigbus(int signal, siginfo_t* info, void* context) {
  if (sigjmp_buf* jump = current_copy; jump != nullptr) {
    current_copy = nullptr;
    siglongjmp(*jump, 1);
  }
  // Not ours: what was there before handles it.
  if ((previous_action.sa_flags & SA_SIGINFO) != 0 && previous_action.sa_sigaction != nullptr) {
    previous_action.sa_sigaction(signal, info, context);
    return;
  }
  if (previous_action.sa_handler != SIG_DFL && previous_action.sa_handler != SIG_IGN) {
    previous_action.sa_handler(signal);
    return;
  }
  // The default action: die of SIGBUS, as without this handler. Returning re-executes the
  // faulting access, which raises it again with the default action in place.
  struct sigaction fallback = {};
  fallback.sa_handler = SIG_DFL;
  sigemptyset(&fallback.sa_mask);
  sigaction(SIGBUS, &fallback, nullptr);
}

void InstallHandler() {
  struct sigaction action = {};
  action.sa_sigaction = OnSigbus;
  action.sa_flags = SA_SIGINFO;
  sigemptyset(&action.sa_mask);
  sigaction(SIGBUS, &action, &previous_action);
}

constexpr size_t kSplitBytes = size_t{8} << 20;
constexpr size_t kMaxCopyThreads = 4;

}  // namespace

absl::Status GuardedCopy(void* dst, const void* src, size_t n) {
  static std::once_flag installed;
  std::call_once(installed, InstallHandler);
  if (n == 0) return absl::OkStatus();
  sigjmp_buf jump;
  // savemask 1: the jump restores the signal mask, whatever the handler's entry changed.
  if (sigsetjmp(jump, 1) != 0) {
    return absl::DataLossError(
        "the shared-memory object shrank during the copy (a page of the range is gone)");
  }
  current_copy = &jump;
  std::memcpy(dst, src, n);
  current_copy = nullptr;
  return absl::OkStatus();
}

absl::Status SplitGuardedCopy(void* dst, const void* src, size_t n) {
  const size_t cpus = std::max<size_t>(1, std::thread::hardware_concurrency());
  const size_t pieces =
      std::min({cpus, kMaxCopyThreads, std::max<size_t>(1, n / (kSplitBytes / 2))});
  if (n < kSplitBytes || pieces == 1) return GuardedCopy(dst, src, n);
  // Pieces of whole 4 KiB pages, the last taking the rest.
  const size_t piece = (n / pieces) & ~size_t{4095};
  std::vector<absl::Status> results(pieces);
  auto copy = [&results, piece, pieces, n, out = static_cast<char*>(dst),
               in = static_cast<const char*>(src)](size_t i) {
    const size_t begin = i * piece;
    results[i] = GuardedCopy(out + begin, in + begin, i + 1 < pieces ? piece : n - begin);
  };
  std::vector<std::thread> threads;
  threads.reserve(pieces - 1);
  size_t started = 0;  // pieces 0..started-1 run on threads of their own
  for (; started + 1 < pieces; ++started) {
    try {
      threads.emplace_back(copy, started);
    } catch (const std::system_error&) {
      break;  // no thread to be had: this thread copies the rest
    }
  }
  for (size_t i = started; i < pieces; ++i) copy(i);
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : results) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace gradserve::server
