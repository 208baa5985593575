// GraphFuture: the result of one backward pass, as PyTorch's future_result_.

#ifndef GRADSERVE_ENGINE_AUTOGRAD_GRAPH_FUTURE_H_
#define GRADSERVE_ENGINE_AUTOGRAD_GRAPH_FUTURE_H_

#include <atomic>
#include <functional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "engine/tensor/tensor.h"
#include "engine/util/mutex.h"

namespace gradserve::autograd {

// Resolves once, to the captured gradients or to the status that stopped the pass.
//
// Thread safety: all methods may be called from any thread at once. Callbacks run on the
// thread that resolves the future (or at once on the thread that adds one to a resolved
// future); they must not block.
class GraphFuture {
 public:
  using Result = absl::StatusOr<TensorList>;

  // Resolves the future unless it already is; returns whether this call resolved it.
  bool Resolve(Result result);
  bool completed() const;
  // Blocks until resolved.
  Result Wait() const;
  // Runs fn with the result once resolved.
  void Then(std::function<void(const Result&)> fn);

 private:
  mutable Mutex mutex_;
  mutable CondVar resolved_;
  bool completed_ ABSL_GUARDED_BY(mutex_) = false;
  // completed_ for lock-free polling by the worker loop.
  std::atomic<bool> completed_flag_{false};
  Result result_ ABSL_GUARDED_BY(mutex_);
  std::vector<std::function<void(const Result&)>> callbacks_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace gradserve::autograd

#endif  // GRADSERVE_ENGINE_AUTOGRAD_GRAPH_FUTURE_H_
