#include "client/load/load_generator.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "client/load/load_calls.h"
#include "proto/trace_context.h"

namespace gradserve::load {
namespace {

using SteadyClock = std::chrono::steady_clock;

constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

// One run. Shared with every call's completion callback (they hold a reference), so it lives
// until the last callback has returned, even if that is after Run.
//
// Thread safety: Issue and OnDone run on any thread (the caller's, the scheduler's, gRPC's
// callback threads); the counters are atomics or guarded by mutex_.
class LoadRun : public std::enable_shared_from_this<LoadRun> {
 public:
  LoadRun(const LoadOptions& options, const Workload& workload,
          std::vector<std::unique_ptr<LoadConnection>> connections)
      : options_(options),
        workload_(workload),
        starter_(workload),
        connections_(std::move(connections)),
        recorder_(options.warmup),
        ticket_limit_(options.requests > 0 ? options.warmup + options.requests : kNever),
        duration_ns_(absl::ToInt64Nanoseconds(options.duration)) {}

  LoadResult Run(const ProgressFn& progress);

 private:
  int64_t NowNs() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(SteadyClock::now() - start_)
        .count();
  }
  // Whether the call numbered ticket may still be sent at time now_ns.
  bool MaySend(int64_t ticket, int64_t now_ns) const;
  // Closed loop: the next ticket, or false when the run sends no more.
  bool TakeTicket(int64_t* ticket);
  void Issue(int64_t ticket, int64_t intended_ns);
  void OnDone(int64_t ticket, int64_t intended_ns, grpc::ClientContext* context, int code,
              int64_t bytes_up, int64_t bytes_down);
  // Open loop: sends calls at the fixed rate until the run is over; on its own thread.
  void Schedule();
  // Drops the issuer's hold on in_flight_ (see there).
  void ReleaseHold();
  // Past max_duration: no more calls, and those in flight are cancelled.
  void StopAndCancel();

  const LoadOptions options_;
  const Workload& workload_;
  const CallStarter starter_;
  const std::vector<std::unique_ptr<LoadConnection>> connections_;
  ResultRecorder recorder_;
  const int64_t ticket_limit_;
  const int64_t duration_ns_;
  SteadyClock::time_point start_;

  std::atomic<int64_t> next_ticket_{0};
  // Measurement ends (no call is sent) from then on; set when the first measured call is sent.
  std::atomic<int64_t> measure_deadline_ns_{kNever};
  std::atomic<bool> stopping_{false};

  absl::Mutex mutex_;
  // Calls in flight, plus one while the issuer (Run's first calls in a closed loop, the
  // scheduler in an open loop) may still send: the run is over when it reaches 0.
  int64_t in_flight_ ABSL_GUARDED_BY(mutex_) = 1;
  absl::flat_hash_set<grpc::ClientContext*> contexts_ ABSL_GUARDED_BY(mutex_);
  bool cut_short_ ABSL_GUARDED_BY(mutex_) = false;
};

bool LoadRun::MaySend(int64_t ticket, int64_t now_ns) const {
  if (stopping_.load(std::memory_order_relaxed) || ticket >= ticket_limit_) return false;
  // The first measured call always goes: it starts the measurement.
  return ticket <= options_.warmup || now_ns < measure_deadline_ns_.load();
}

bool LoadRun::TakeTicket(int64_t* ticket) {
  *ticket = next_ticket_.fetch_add(1);
  return MaySend(*ticket, NowNs());
}

void LoadRun::Issue(int64_t ticket, int64_t intended_ns) {
  if (ticket == options_.warmup) {
    recorder_.SetMeasurementStart(intended_ns);
    if (duration_ns_ > 0) measure_deadline_ns_.store(intended_ns + duration_ns_);
  }
  auto* context = new grpc::ClientContext;
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::nanoseconds(absl::ToInt64Nanoseconds(options_.call_timeout)));
  if (!options_.trace_prefix.empty()) {
    context->AddMetadata(trace_context::kRequestIdKey,
                         absl::StrCat(options_.trace_prefix, "-", ticket));
  }
  {
    absl::MutexLock lock(&mutex_);
    ++in_flight_;
    contexts_.insert(context);
    // StopAndCancel may have swept the contexts already; a context cancelled before its call
    // starts cancels the call at once.
    if (stopping_.load()) context->TryCancel();
  }
  LoadConnection& connection = *connections_[static_cast<size_t>(ticket) % connections_.size()];
  starter_.Start(connection, context,
                 [self = shared_from_this(), ticket, intended_ns, context](int code, int64_t up,
                                                                           int64_t down) {
                   self->OnDone(ticket, intended_ns, context, code, up, down);
                 });
}

void LoadRun::OnDone(int64_t ticket, int64_t intended_ns, grpc::ClientContext* context, int code,
                     int64_t bytes_up, int64_t bytes_down) {
  const int64_t end_ns = NowNs();
  recorder_.Record({ticket, intended_ns, end_ns, code, bytes_up, bytes_down});
  // Closed loop: this call's slot sends the next one, before it leaves in_flight_, so that
  // in_flight_ reaches 0 only when the run is over.
  if (options_.rate == 0) {
    int64_t next;
    if (TakeTicket(&next)) Issue(next, NowNs());
  }
  {
    absl::MutexLock lock(&mutex_);
    contexts_.erase(context);
    --in_flight_;
  }
  delete context;
}

void LoadRun::ReleaseHold() {
  absl::MutexLock lock(&mutex_);
  --in_flight_;
}

void LoadRun::Schedule() {
  const double period_ns = 1e9 / options_.rate;
  for (int64_t i = 0;; ++i) {
    const auto intended_ns = static_cast<int64_t>(static_cast<double>(i) * period_ns);
    if (!MaySend(i, intended_ns)) break;
    // Sleep in steps, so that a stop is noticed at low rates too.
    while (!stopping_.load() && NowNs() < intended_ns) {
      std::this_thread::sleep_for(
          std::chrono::nanoseconds(std::min<int64_t>(intended_ns - NowNs(), 50'000'000)));
    }
    {
      absl::MutexLock lock(&mutex_);
      const int64_t max_in_flight = options_.concurrency + 1;  // + the hold
      auto slot_free = [this, max_in_flight]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
        return in_flight_ < max_in_flight || stopping_.load();
      };
      mutex_.Await(absl::Condition(&slot_free));
    }
    if (stopping_.load()) break;
    Issue(i, intended_ns);
  }
  ReleaseHold();
}

void LoadRun::StopAndCancel() {
  stopping_.store(true);
  absl::MutexLock lock(&mutex_);
  cut_short_ = true;
  for (grpc::ClientContext* context : contexts_) context->TryCancel();
}

LoadResult LoadRun::Run(const ProgressFn& progress) {
  start_ = SteadyClock::now();
  std::thread scheduler;
  if (options_.rate > 0) {
    scheduler = std::thread([this] { Schedule(); });
  } else {
    for (int i = 0; i < options_.concurrency; ++i) {
      int64_t ticket;
      if (!TakeTicket(&ticket)) break;
      Issue(ticket, NowNs());
    }
    ReleaseHold();
  }
  const int64_t limit_ns = absl::ToInt64Nanoseconds(options_.max_duration);
  bool over = false;
  while (!over) {
    {
      absl::MutexLock lock(&mutex_);
      auto finished = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return in_flight_ == 0; };
      over = mutex_.AwaitWithTimeout(absl::Condition(&finished), absl::Milliseconds(200));
    }
    const int64_t now_ns = NowNs();
    if (!over && now_ns >= limit_ns && !stopping_.load()) StopAndCancel();
    if (progress) progress(absl::Nanoseconds(now_ns), recorder_.Progress(now_ns));
  }
  if (scheduler.joinable()) scheduler.join();
  starter_.Finish(absl::Seconds(10));  // Note [Session load]: the sessions still held
  LoadResult result = recorder_.Result();
  result.scenario = workload_.name;
  result.options = options_;
  result.request_bytes = workload_.request_bytes;
  absl::MutexLock lock(&mutex_);
  result.cut_short = cut_short_;
  return result;
}

}  // namespace

absl::StatusOr<LoadResult> RunLoad(const LoadOptions& options, const Workload& workload,
                                   const ProgressFn& progress) {
  if (absl::Status s = ValidateLoadOptions(options); !s.ok()) return s;
  const absl::Duration connect_timeout = std::min(absl::Seconds(10), options.max_duration);
  // kPerTarget: interleaved by target, so that consecutive calls go to consecutive targets.
  // kRoundRobin: each channel to the whole list, which gRPC balances.
  const std::vector<std::string> channel_targets =
      options.balance == LoadOptions::Balance::kPerTarget
          ? options.targets
          : std::vector<std::string>{absl::StrJoin(options.targets, ",")};
  std::vector<std::unique_ptr<LoadConnection>> connections;
  for (int c = 0; c < options.connections; ++c) {
    for (const std::string& target : channel_targets) {
      absl::StatusOr<std::unique_ptr<LoadConnection>> connection =
          LoadConnection::Open(target, connect_timeout, options.credentials, workload.session);
      if (!connection.ok()) return connection.status();
      connections.push_back(std::move(*connection));
    }
  }
  auto run = std::make_shared<LoadRun>(options, workload, std::move(connections));
  LoadResult result = run->Run(progress);
  // The last completion callbacks may still hold the run for a moment after the last call
  // left in_flight_; wait for them, so that the channels close here, not on a gRPC thread.
  for (int i = 0; i < 5000 && run.use_count() > 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return result;
}

}  // namespace gradserve::load
