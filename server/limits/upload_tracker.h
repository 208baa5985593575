// UploadTracker: the streamed requests still arriving, bounded in number and ended when idle.
//
// Note [Uploads apart from work]
// A streamed request arrives in chunks for as long as its client takes. It used to take one of
// the --max_in_flight slots when its first byte arrived, so 32 clients that sent a few bytes and
// stalled locked every other client out while health said SERVING. Now:
//   - an upload takes an engine slot only once it is complete (the client half-closed); until
//     then it is one of at most --max_uploads uploads (RESOURCE_EXHAUSTED naming the flag
//     beyond), which take no worker and no slot;
//   - its buffered bytes, counted as they arrive (decompressed), are charged to the server's
//     memory budget (Note [Sizing the server's memory]);
//   - an upload whose client sends nothing for --upload_idle_timeout, while the server waits
//     for its next chunk, is ended with DEADLINE_EXCEEDED naming the flag. A reaper thread
//     looks every quarter of the timeout (at most every second), so an idle upload ends
//     between 1 and 1.25 timeouts after its last chunk.
// The reactor of a streamed call is the Upload: the reaper asks it to end itself
// (ExpireIfWaiting) with the tracker's lock held, and the reactor leaves the tracker (End)
// before it is deleted, which waits for a scan in progress, so the reaper never touches a
// deleted reactor.
//
// Thread safety: every method may be called from any thread at once.

#ifndef GRADSERVE_SERVER_LIMITS_UPLOAD_TRACKER_H_
#define GRADSERVE_SERVER_LIMITS_UPLOAD_TRACKER_H_

#include <atomic>
#include <cstdint>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/util/mutex.h"

namespace gradserve::server {

class UploadTracker {
 public:
  // One upload in progress; the streamed call's reactor.
  class Upload {
   public:
    virtual ~Upload() = default;

    // Called by the reaper, with the tracker's lock held, once no chunk arrived for the idle
    // timeout. Ends the call and returns true if it was waiting for the client's next chunk;
    // returns false if it is busy (it is asked again at the next look). Must not call back
    // into the tracker.
    virtual bool ExpireIfWaiting() = 0;

   private:
    friend class UploadTracker;
    // When the last chunk arrived (or the upload began), in absl::GetCurrentTimeNanos().
    std::atomic<int64_t> last_progress_ns_{0};
  };

  // max_uploads: uploads open at once; idle_timeout: how long one may go without a chunk.
  UploadTracker(int64_t max_uploads, absl::Duration idle_timeout);
  // Stops the reaper. Every upload must have ended.
  ~UploadTracker();
  UploadTracker(const UploadTracker&) = delete;
  UploadTracker& operator=(const UploadTracker&) = delete;

  // Starts tracking upload, or returns RESOURCE_EXHAUSTED naming --max_uploads.
  absl::Status Begin(Upload* upload);
  // A chunk arrived: the idle time starts again. Cheap (one clock read and a store).
  static void Progress(Upload* upload);
  // Stops tracking upload; idempotent. Once it returns the reaper no longer touches upload.
  void End(Upload* upload);

  int64_t open() const;
  // Uploads ended for idleness since the start.
  int64_t expired() const { return expired_.load(std::memory_order_relaxed); }
  absl::Duration idle_timeout() const { return idle_timeout_; }

 private:
  void Reap();

  const int64_t max_uploads_;
  const absl::Duration idle_timeout_;
  mutable Mutex mutex_;
  absl::flat_hash_set<Upload*> uploads_ ABSL_GUARDED_BY(mutex_);
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  CondVar wake_;  // signalled when stopping_ is set
  std::atomic<int64_t> expired_{0};
  std::thread reaper_;  // last: started once the rest is
};

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_LIMITS_UPLOAD_TRACKER_H_
