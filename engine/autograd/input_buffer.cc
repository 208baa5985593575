#include "engine/autograd/input_buffer.h"

#include "engine/autograd/functions/accumulate.h"
#include "engine/autograd/grad_mode.h"
#include "engine/kernels/basic_kernels.h"

namespace gradserve::autograd {
void InputBuffer::add(size_t pos, Tensor grad, Stream producer, Stream consumer) {
  if (!grad.defined()) return;
  if (consumer.has_stream() && producer.has_stream() && consumer != producer) {
    WaitStream(consumer, producer);
    RecordStream(grad.device(), grad.storage()->data(), consumer);
  }
  StreamScope on_consumer(consumer);
  Tensor& old = buffer_[pos];
  if (!old.defined()) {
    old = std::move(grad);
    return;
  }
  // Note [Accumulating in place].
  if (GradMode::is_enabled() && (old.requires_grad() || grad.requires_grad())) {
    old = AccumulateSum(old, grad);
  } else if (OwnedExclusively(old)) {
    AccumulateInto(old, grad);
  } else if (OwnedExclusively(grad)) {
    AccumulateInto(grad, old);
    old = std::move(grad);
  } else {
    old = AddSameShape(old, grad);
  }
}

Device InputBuffer::device() const {
  for (const Tensor& t : buffer_) {
    if (t.defined() && !t.device().is_cpu()) return t.device();
  }
  return kCPU;
}

}  // namespace gradserve::autograd
