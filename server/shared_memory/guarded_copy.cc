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

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "absl/strings/str_cat.h"
#include "engine/util/repeat_bytes.h"

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

// Runs body() with a SIGBUS on its thread turned into DATA_LOSS (Note [A region shrunk under
// the server]). body must hold nothing that needs unwinding: the jump skips its destructors.
template <typename Body>
absl::Status RunGuarded(const Body& body) {
  static std::once_flag installed;
  std::call_once(installed, InstallHandler);
  sigjmp_buf jump;
  // savemask 1: the jump restores the signal mask, whatever the handler's entry changed.
  if (sigsetjmp(jump, 1) != 0) {
    return absl::DataLossError(
        "the shared-memory object shrank during the copy (a page of the range is gone)");
  }
  current_copy = &jump;
  body();
  current_copy = nullptr;
  return absl::OkStatus();
}

// piece(begin, end) over [0, n), cut as Note [Copies split over threads] says into pieces of
// whole 4 KiB pages, the last taking the rest; the first error of a piece, in piece order.
template <typename Piece>
absl::Status SplitOverThreads(size_t n, const Piece& piece_fn) {
  const size_t cpus = std::max<size_t>(1, std::thread::hardware_concurrency());
  const size_t pieces =
      std::min({cpus, kMaxCopyThreads, std::max<size_t>(1, n / (kSplitBytes / 2))});
  if (n < kSplitBytes || pieces == 1) return piece_fn(size_t{0}, n);
  const size_t piece = (n / pieces) & ~size_t{4095};
  std::vector<absl::Status> results(pieces);
  auto run = [&](size_t i) {
    results[i] = piece_fn(i * piece, i + 1 < pieces ? (i + 1) * piece : n);
  };
  std::vector<std::thread> threads;
  threads.reserve(pieces - 1);
  size_t started = 0;  // pieces 0..started-1 run on threads of their own
  for (; started + 1 < pieces; ++started) {
    try {
      threads.emplace_back(run, started);
    } catch (const std::system_error&) {
      break;  // no thread to be had: this thread copies the rest
    }
  }
  for (size_t i = started; i < pieces; ++i) run(i);
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : results) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// The bytes a fill copies from at a time: one element repeated, small enough to stay in the
// first-level cache while the fill streams its copies out.
constexpr size_t kFillBlockBytes = 4096;

// Writes out[begin, end) from block, the element repeated from block[0] (begin a multiple of
// kFillBlockBytes, so the element's phase there is 0). Where the CPU has them, the aligned
// 16-byte lines are written with non-temporal stores: a store to a line not in the cache first
// reads the line, and nothing here reads the region again, so that read was half the fill's
// memory traffic. The ragged ends are copied.
void FillRange(char* out, size_t begin, size_t end, const char* block) {
#if defined(__SSE2__)
  char* at = out + begin;
  char* const stop = out + end;
  const size_t head =
      std::min<size_t>((16 - reinterpret_cast<uintptr_t>(at) % 16) % 16, end - begin);
  std::memcpy(at, block, head);
  at += head;
  // 16 is a multiple of the element's size, so every line starts at the same phase: head's.
  const __m128i line = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + head));
  for (; stop - at >= 16; at += 16) _mm_stream_si128(reinterpret_cast<__m128i*>(at), line);
  std::memcpy(at, block + head, static_cast<size_t>(stop - at));
  _mm_sfence();  // the streamed stores are seen before the piece reports done
#else
  for (size_t at = begin; at < end; at += kFillBlockBytes) {
    std::memcpy(out + at, block, std::min(kFillBlockBytes, end - at));
  }
#endif
}

}  // namespace

absl::Status GuardedCopy(void* dst, const void* src, size_t n) {
  if (n == 0) return absl::OkStatus();
  return RunGuarded([&] { std::memcpy(dst, src, n); });
}

absl::Status SplitGuardedCopy(void* dst, const void* src, size_t n) {
  return SplitOverThreads(n, [out = static_cast<char*>(dst), in = static_cast<const char*>(src)](
                                 size_t begin, size_t end) {
    return GuardedCopy(out + begin, in + begin, end - begin);
  });
}

absl::Status SplitGuardedFill(void* dst, const void* element, size_t element_size, size_t n) {
  if (element_size == 0 || kFillBlockBytes % element_size != 0 || n % element_size != 0) {
    return absl::InternalError(
        absl::StrCat("GuardedFill: ", n, " bytes of ", element_size, "-byte elements"));
  }
  alignas(64) char block[kFillBlockBytes];
  RepeatBytes(block, kFillBlockBytes, element, element_size);
  // The pieces start at multiples of 4 KiB, and so of element_size: each starts on an element.
  return SplitOverThreads(n, [&block, out = static_cast<char*>(dst)](size_t begin, size_t end) {
    if (begin == end) return absl::OkStatus();
    return RunGuarded([&] { FillRange(out, begin, end, block); });
  });
}

}  // namespace gradserve::server
