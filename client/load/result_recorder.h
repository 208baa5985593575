// ResultRecorder: collects the outcome of every call of a load run into a LoadResult.
//
// Thread safety: every method may be called from any thread at once (gRPC's callback threads
// record, the run's monitor reads progress); one mutex guards the figures.

#ifndef GRADSERVE_CLIENT_LOAD_RESULT_RECORDER_H_
#define GRADSERVE_CLIENT_LOAD_RESULT_RECORDER_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "client/load/load_result.h"

namespace gradserve::load {

// One finished call. Times are nanoseconds on the run's steady clock (from its start).
struct CallOutcome {
  int64_t ticket = 0;       // the call's number in issue order; the first `warmup` are warm-up
  int64_t intended_ns = 0;  // when it was due to be sent
  int64_t end_ns = 0;       // when its status arrived
  int code = 0;             // grpc::StatusCode
  int64_t bytes_up = 0;
  int64_t bytes_down = 0;
};

// The figures of the live progress line.
struct ProgressSnapshot {
  int64_t done = 0;  // measured calls finished
  int64_t errors = 0;
  int64_t warmup_done = 0;
  int64_t p99_ns = 0;  // of the successful measured calls so far
  double rate = 0;     // measured calls per second so far
};

class ResultRecorder {
 public:
  explicit ResultRecorder(int64_t warmup) : warmup_(warmup) {}

  // The intended send time of the first measured call; the zero of the timeline. Call it
  // before that call starts.
  void SetMeasurementStart(int64_t ns);
  void Record(const CallOutcome& outcome);

  ProgressSnapshot Progress(int64_t now_ns);
  // The figures so far, as a LoadResult (options and scenario left for the caller to fill).
  LoadResult Result();

 private:
  const int64_t warmup_;
  absl::Mutex mutex_;
  int64_t measure_start_ns_ ABSL_GUARDED_BY(mutex_) = -1;
  int64_t last_end_ns_ ABSL_GUARDED_BY(mutex_) = 0;
  LoadResult result_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace gradserve::load

#endif  // GRADSERVE_CLIENT_LOAD_RESULT_RECORDER_H_
