// Stream: an ordered queue of work on one device, as the Engine sees it.
//
// Note [Streams in the backward pass]
// A GPU runs work in stream order (Note [CUDA streams]). The Engine follows PyTorch's rules so
// that gradients are correct when Nodes use different streams:
//  1. A Node's backward runs on the stream its forward op ran on: InputMetadata records the
//     current stream when the forward op records the Node, and the Engine makes that stream
//     current (StreamScope) while the Node runs.
//  2. A gradient handed from a producer Node to a consumer on another stream of the same device
//     is ordered by an event: the consumer's stream waits for the producer's work so far, the
//     gradient's memory is marked as used by the consumer's stream (so the caching allocator
//     does not reuse it early), and InputBuffer sums on the consumer's stream.
//  3. Before a pass reports its result, it synchronizes every stream its Nodes ran on, so the
//     caller (the interpreter, the server) sees finished gradients.
// On the CPU and the simulated accelerator a stream id is 0 and all of this does nothing.
//
// Thread safety: the current stream is per thread; the functions may be called from any thread.
// Errors: a failing device call throws StatusError.

#ifndef GRADSERVE_ENGINE_DEVICE_STREAM_H_
#define GRADSERVE_ENGINE_DEVICE_STREAM_H_

#include <cstdint>

#include "engine/device/device.h"

namespace gradserve {

struct Stream {
  Device device = kCPU;
  uintptr_t id = 0;  // 0: the device has no streams

  bool has_stream() const { return id != 0; }
  friend bool operator==(Stream a, Stream b) { return a.device == b.device && a.id == b.id; }
  friend bool operator!=(Stream a, Stream b) { return !(a == b); }
};

// The calling thread's current stream on device (id 0 on the CPU).
Stream CurrentStream(Device device);

// Makes stream the calling thread's current stream on its device for a scope; nothing for a
// stream with id 0.
// Inline for the CPU's case, which the Engine meets once per Node.
class StreamScope {
 public:
  explicit StreamScope(Stream stream) : stream_(stream) {
    if (stream_.has_stream()) Enter();
  }
  ~StreamScope() {
    if (stream_.has_stream()) Exit();
  }
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

 private:
  void Enter();
  void Exit();

  Stream stream_;
  uintptr_t previous_ = 0;
};

// Makes later work on consumer wait for the work queued on producer so far (one device).
void WaitStream(Stream consumer, Stream producer);
// Marks the memory at data, allocated on device, as used by work on stream (rule 2 above);
// nothing if the memory is on another device or stream has no stream.
void RecordStream(Device device, void* data, Stream stream);
// Blocks until the work queued on stream so far is done.
void SynchronizeStream(Stream stream);

}  // namespace gradserve

#endif  // GRADSERVE_ENGINE_DEVICE_STREAM_H_
