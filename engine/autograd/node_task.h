// NodeTask: one Node ready to run, with its gathered gradients.

#ifndef GRADSERVE_ENGINE_AUTOGRAD_NODE_TASK_H_
#define GRADSERVE_ENGINE_AUTOGRAD_NODE_TASK_H_

#include <memory>

#include "engine/autograd/exec_info.h"
#include "engine/autograd/input_buffer.h"
#include "engine/autograd/node.h"

namespace gradserve::autograd {

struct GraphTask;

// Three kinds: a work task (fn set), an empty wake-up task (fn null: tells a waiting owner
// thread to look at its GraphTask again) and a shutdown task (ends a worker thread).
struct NodeTask {
  NodeTask(std::weak_ptr<GraphTask> base, std::shared_ptr<Node> fn, InputBuffer inputs,
           int reentrant_depth, bool is_shutdown_task = false)
      : base(std::move(base)),
        fn(std::move(fn)),
        inputs(std::move(inputs)),
        reentrant_depth(reentrant_depth),
        is_shutdown_task(is_shutdown_task) {}

  // Weak: a queued task must not keep a finished, failed or cancelled GraphTask alive; the
  // worker that pops it skips it if the GraphTask is gone.
  std::weak_ptr<GraphTask> base;
  std::shared_ptr<Node> fn;
  InputBuffer inputs;
  // fn's ExecInfo in the pass, set by the Node that made the task ready, which found fn's
  // entry already: it spares the worker a second hash lookup per Node. Null means look it up.
  // Entries never move during a pass (Note [GraphTask node table]).
  const ExecInfo* exec_info = nullptr;
  // The GraphTask's reentrant depth, copied so that ordering needs no lock.
  int reentrant_depth;
  bool is_shutdown_task;
};

}  // namespace gradserve::autograd

#endif  // GRADSERVE_ENGINE_AUTOGRAD_NODE_TASK_H_
