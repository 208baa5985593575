// ExecInfo: whether a Node of a backward pass runs, and which of its inputs the pass captures.

#ifndef GRADSERVE_ENGINE_AUTOGRAD_EXEC_INFO_H_
#define GRADSERVE_ENGINE_AUTOGRAD_EXEC_INFO_H_

#include <cstdint>
#include <vector>

namespace gradserve::autograd {

// Per Node of a pass (GraphTask::exec_info_used): whether it must run and which of its inputs
// to capture (grad semantics). PyTorch's GraphTask::ExecInfo.
struct ExecInfo {
  struct Capture {
    uint32_t input_idx_;   // which input of the Node
    uint32_t output_idx_;  // where in captured_vars_
  };
  bool should_execute() const { return needed_ || !captures_.empty(); }
  bool needed_ = false;
  std::vector<Capture> captures_;
};

}  // namespace gradserve::autograd

#endif  // GRADSERVE_ENGINE_AUTOGRAD_EXEC_INFO_H_
