// ExecInfo: whether a Node of a backward pass runs, and which of its inputs the pass captures.

#ifndef GRADSERVE_ENGINE_AUTOGRAD_EXEC_INFO_H_
#define GRADSERVE_ENGINE_AUTOGRAD_EXEC_INFO_H_

#include <cstdint>

namespace gradserve::autograd {

// Per Node of a pass (GraphTask::exec_info_used): whether it must run and which of its inputs
// to capture (grad semantics). PyTorch's GraphTask::ExecInfo.
struct ExecInfo {
  struct Capture {
    uint32_t input_idx_;   // which input of the Node
    uint32_t output_idx_;  // where in captured_vars_
  };
  bool should_execute() const { return needed_ || num_captures_ > 0; }
  // The Node's captures are GraphTask::captures_[first_capture_, first_capture_ +
  // num_captures_): held apart, so that the entry stays small (Note [A small node table entry]
  // in graph_task.h).
  uint32_t first_capture_ = 0;
  uint32_t num_captures_ = 0;
  bool needed_ = false;
};

}  // namespace gradserve::autograd

#endif  // GRADSERVE_ENGINE_AUTOGRAD_EXEC_INFO_H_
