// InputBuffer: where the gradients bound for one Node gather until it is ready.

#ifndef GRADSERVE_ENGINE_AUTOGRAD_INPUT_BUFFER_H_
#define GRADSERVE_ENGINE_AUTOGRAD_INPUT_BUFFER_H_

#include <cstddef>
#include <utility>

#include "engine/device/stream.h"
#include "engine/tensor/tensor.h"

namespace gradserve::autograd {

// One slot per input of the Node. Gradients that reach the same slot are summed: in place when
// nothing else holds the earlier one (Note [Accumulating in place]), as a new differentiable sum
// under create_graph.
//
// Thread safety: none; the GraphTask's mutex guards the buffers in its not_ready_ map, and a
// buffer in a NodeTask belongs to the thread that popped it.
class InputBuffer {
 public:
  // No slots: a Node's buffer before its first input arrives (GraphTask::NodeState).
  InputBuffer() = default;
  explicit InputBuffer(size_t size) : buffer_(size) {}
  InputBuffer(InputBuffer&&) = default;
  InputBuffer& operator=(InputBuffer&&) = default;

  // Adds grad into slot pos; an undefined grad adds nothing. Throws StatusError if it cannot
  // be summed with what is there (shape or dtype). On a device with streams, grad was made on
  // producer and is for a Node whose work runs on consumer: the consumer waits for the producer
  // and the sum runs on the consumer (Note [Streams in the backward pass]).
  void add(size_t pos, Tensor grad, Stream producer = {}, Stream consumer = {});

  // Where the Node should run: the device of its first input on an accelerator, else the CPU.
  Device device() const;

  size_t size() const { return buffer_.size(); }
  const Tensor& operator[](size_t pos) const { return buffer_[pos]; }

  static TensorList variables(InputBuffer&& buffer) { return std::move(buffer.buffer_); }

 private:
  TensorList buffer_;
};

}  // namespace gradserve::autograd

#endif  // GRADSERVE_ENGINE_AUTOGRAD_INPUT_BUFFER_H_
