// Which CUDA stream work for a GPU goes to.
//
// Note [CUDA streams]
// A GPU runs the kernels queued on one stream in order, and kernels of different streams in any
// order. Every GPU gets one compute stream when it is registered, and all work for "cuda:N"
// (kernels, copies, the caching allocator's reuse of freed blocks) goes to the calling thread's
// current stream for that GPU: the compute stream unless a StreamGuard has set another. So a
// forward pass and its backward, even on different threads, queue in one order on one stream,
// and nothing but the host needs to wait.
//
// Where a gradient made on one stream is used on another (another GPU, or a Node whose forward
// ran under a StreamGuard), the Engine makes the consumer stream wait for an event recorded on
// the producer (Note [Streams in the backward pass]), as PyTorch's InputBuffer does; and a pass
// synchronizes the streams it used before it reports its result, so the caller sees finished
// gradients.
//
// Thread safety: the current stream is per thread; the compute streams live for the process.

#ifndef GRADSERVE_ENGINE_DEVICE_CUDA_CUDA_STREAM_H_
#define GRADSERVE_ENGINE_DEVICE_CUDA_CUDA_STREAM_H_

#include <cuda_runtime.h>

namespace gradserve::cuda {

// The number of registered GPUs ("cuda:0" ... ), 0 before RegisterCudaBackend.
int RegisteredDeviceCount();
// The CUDA runtime's index of "cuda:index".
int PhysicalIndex(int index);
// The compute stream of "cuda:index".
cudaStream_t ComputeStream(int index);
// The calling thread's current stream for "cuda:index".
cudaStream_t CurrentStream(int index);

// Sets the calling thread's current stream for "cuda:index" for a scope (PyTorch's
// torch.cuda.stream), restoring the previous one after. The stream must outlive the scope.
class StreamGuard {
 public:
  StreamGuard(int index, cudaStream_t stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  int index_;
  cudaStream_t previous_;
};

// Makes later work queued on `consumer` wait for what was queued on `producer` so far, with an
// event (nothing if they are the same stream). Both on "cuda:index".
void WaitStream(int index, cudaStream_t consumer, cudaStream_t producer);

}  // namespace gradserve::cuda

#endif  // GRADSERVE_ENGINE_DEVICE_CUDA_CUDA_STREAM_H_
