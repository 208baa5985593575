#include "engine/util/parallel.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <exception>
#include <memory>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "engine/util/cancellation.h"
#include "engine/util/mutex.h"

namespace gradserve {
namespace {

int DefaultThreads() {
  const int cpus = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(cpus, 1, kMaxIntraOpThreads);
}

std::atomic<int> intra_op_threads{DefaultThreads()};

// One split loop. The caller owns it with the helpers it was offered to (shared_ptr): a helper
// may still hold it after the caller returned, but touches fn only for a chunk it claimed,
// and the caller returns only once every chunk is done.
struct Job {
  Job(int64_t n, int64_t chunks, absl::FunctionRef<void(int64_t, int64_t, int64_t)> fn,
      const CancellationToken* token)
      : n(n), chunks(chunks), fn(fn), token(token) {}

  const int64_t n;
  const int64_t chunks;
  const absl::FunctionRef<void(int64_t, int64_t, int64_t)> fn;
  // The caller's token, borrowed: the caller holds it until it returns.
  const CancellationToken* const token;
  // The next chunk to claim; past chunks - 1 when all are claimed.
  std::atomic<int64_t> next{0};
  // Set by the first chunk that threw: the chunks claimed after it are skipped.
  std::atomic<bool> failed{false};

  // Note [An error changes threads under the lock]
  // The exception a chunk threw is owned by one thread at a time, and passes from the thread
  // that threw it to the caller only under `mutex`: Work moves its copy in, and the caller
  // moves it out before rethrowing. An exception_ptr is reference counted inside libstdc++,
  // which ThreadSanitizer does not see. Were a copy left in the Job, the helper that drops the
  // last reference to the Job could free the exception (and the Status inside it) after the
  // caller had read it, ordered only by that unseen count: a race report in the TSan suite,
  // though none in fact.
  Mutex mutex;
  CondVar all_done;  // signalled when done reaches chunks
  int64_t done ABSL_GUARDED_BY(mutex) = 0;
  std::exception_ptr error ABSL_GUARDED_BY(mutex);
};

// Claims and runs job's chunks until none is left; then counts the ones it ran as done.
void Work(Job& job) {
  int64_t ran = 0;
  std::exception_ptr error;
  for (int64_t c = job.next.fetch_add(1, std::memory_order_relaxed); c < job.chunks;
       c = job.next.fetch_add(1, std::memory_order_relaxed)) {
    ++ran;
    if (job.failed.load(std::memory_order_relaxed)) continue;
    const int64_t begin = c * kParallelChunk;
    try {
      job.fn(c, begin, std::min(job.n, begin + kParallelChunk));
    } catch (...) {
      if (error == nullptr) error = std::current_exception();
      job.failed.store(true, std::memory_order_relaxed);
    }
  }
  if (ran == 0) return;
  MutexLock lock(&job.mutex);
  if (error != nullptr && job.error == nullptr) job.error = std::move(error);
  job.done += ran;
  if (job.done == job.chunks) job.all_done.SignalAll();
}

// The helper threads, one process-wide set, never stopped (they wait, idle, at exit).
class Helpers {
 public:
  static Helpers& Get() {
    static Helpers* helpers = new Helpers;
    return *helpers;
  }

  // Hands job to up to `wanted` idle helpers (starting helpers first, up to threads - 1 of
  // them); none when all are busy.
  void Offer(const std::shared_ptr<Job>& job, int wanted, int threads) {
    int offered = 0;
    {
      MutexLock lock(&mutex_);
      while (started_ < threads - 1) {
        ++started_;
        ++idle_;  // counted idle from the start, so this very offer may go to it
        std::thread(&Helpers::Main, this).detach();
      }
      const int idle = idle_ - static_cast<int>(offers_.size());
      offered = std::min(wanted, idle);
      for (int i = 0; i < offered; ++i) offers_.push_back(job);
    }
    for (int i = 0; i < offered; ++i) work_.Signal();
  }

 private:
  void Main() {
    pthread_setname_np(pthread_self(), "gs-intra-op");  // as top -H and /proc show it
    while (true) {
      std::shared_ptr<Job> job;
      {
        MutexLock lock(&mutex_);
        work_.Wait(&mutex_, [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !offers_.empty(); });
        job = std::move(offers_.front());
        offers_.pop_front();
        --idle_;
      }
      {
        CancellationScope scope(job->token);
        Work(*job);
      }
      job.reset();
      MutexLock lock(&mutex_);
      ++idle_;
    }
  }

  Mutex mutex_;
  CondVar work_;  // signalled once per offer
  // Offers not yet taken, one per helper asked; a helper takes the front one.
  std::deque<std::shared_ptr<Job>> offers_ ABSL_GUARDED_BY(mutex_);
  int started_ ABSL_GUARDED_BY(mutex_) = 0;
  // Helpers waiting for an offer, or about to: less offers_.size(), the ones free to ask.
  int idle_ ABSL_GUARDED_BY(mutex_) = 0;
};

}  // namespace

void SetIntraOpThreads(int threads) {
  intra_op_threads.store(std::clamp(threads, 1, kMaxIntraOpThreads), std::memory_order_relaxed);
}

int IntraOpThreads() { return intra_op_threads.load(std::memory_order_relaxed); }

int64_t ParallelChunks(int64_t n) {
  if (n < kParallelMinUnits) return 1;
  return (n + kParallelChunk - 1) / kParallelChunk;
}

void ParallelBlocks(int64_t n,
                    absl::FunctionRef<void(int64_t chunk, int64_t begin, int64_t end)> fn) {
  const int64_t chunks = ParallelChunks(n);
  if (chunks == 1) {
    if (n > 0) fn(0, 0, n);
    return;
  }
  const int threads = IntraOpThreads();
  auto job = std::make_shared<Job>(n, chunks, fn, CurrentCancellationToken());
  if (threads > 1) {
    Helpers::Get().Offer(job, static_cast<int>(std::min<int64_t>(threads - 1, chunks - 1)),
                         threads);
  }
  Work(*job);
  std::exception_ptr error;
  {
    MutexLock lock(&job->mutex);
    job->all_done.Wait(&job->mutex,
                       [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return job->done == job->chunks; });
    error = std::move(job->error);  // Note [An error changes threads under the lock]
  }
  if (error != nullptr) std::rethrow_exception(error);
}

}  // namespace gradserve
