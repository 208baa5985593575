// MathMode: the request's numeric choices that kernels read, carried by the calling thread.
//
// Note [TF32 per request]
// ~~~~~~~~~~~~~~~~~~~~~~~
// A float32 matrix product on an NVIDIA GPU may run on tensor cores in TF32, which keeps 10 of
// float32's 23 mantissa bits in the products (PyTorch's torch.backends.cuda.matmul.allow_tf32,
// off by default since PyTorch 1.12). gradserve leaves it off unless a request asks
// (GradRequest.allow_tf32): the server runs the request under a MathModeScope, the Engine gives
// each backward pass the mode of the thread that started it and restores it on the threads that
// run the pass's Nodes, and the GPU gemm (engine/ops/cuda/linalg_kernels.cu) reads it on each
// call. Host kernels compute float32 in float32 either way.
//
// Thread safety: the mode is the calling thread's own (a thread_local); a scope changes it for
// that thread until it ends.

#ifndef GRADSERVE_ENGINE_UTIL_MATH_MODE_H_
#define GRADSERVE_ENGINE_UTIL_MATH_MODE_H_

namespace gradserve {

struct MathMode {
  // float32 matrix products on GPUs may use TF32 tensor cores.
  bool allow_tf32 = false;
};

inline thread_local MathMode current_math_mode;

inline MathMode CurrentMathMode() { return current_math_mode; }

// Sets the calling thread's mode for the scope's life.
class MathModeScope {
 public:
  explicit MathModeScope(MathMode mode) : previous_(current_math_mode) { current_math_mode = mode; }
  ~MathModeScope() { current_math_mode = previous_; }
  MathModeScope(const MathModeScope&) = delete;
  MathModeScope& operator=(const MathModeScope&) = delete;

 private:
  const MathMode previous_;
};

}  // namespace gradserve

#endif  // GRADSERVE_ENGINE_UTIL_MATH_MODE_H_
