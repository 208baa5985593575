// The kernel stubs of nn.cc, linalg.cc and conv_im2col.cc (Note [Kernel stubs]): each op file
// defines its stubs with the CPU implementation; engine/ops/cuda/nn_kernels.cu and
// linalg_kernels.cu register the CUDA ones.
//
// Every stub takes tensors of one floating dtype (float32 or float64) on one device; inputs are
// contiguous and outputs freshly allocated (contiguous) unless said otherwise. Sizes are already
// checked by the op.

#ifndef GRADSERVE_ENGINE_OPS_NN_KERNELS_H_
#define GRADSERVE_ENGINE_OPS_NN_KERNELS_H_

#include <cstdint>

#include "engine/kernels/kernel_stub.h"
#include "engine/ops/conv_im2col.h"
#include "engine/ops/nn.h"
#include "engine/tensor/tensor.h"

namespace gradserve::ops {

// A tensor seen as [outer, size, inner] around one dim (a 0-d tensor is [1, 1, 1]).
struct DimSplit {
  int64_t outer, size, inner;
};

// --- linalg.cc ---

// `count` row-major products C_j = op(A_j) @ op(B_j) (alpha 1, beta 0 unless beta_one), with
// A_j = a + j * stride_a and so on (strides in elements; 0 repeats an operand). op(A) is
// [m, k], op(B) [k, n], C [m, n] with row strides lda, ldb, ldc; m, n, k > 0 and all below
// 2^31. `beta_one` adds into C instead of overwriting it.
struct GemmBatch {
  int device_index = 0;           // the N of the operands' device (GPUs: "cuda:N")
  DType dtype = DType::kFloat32;  // float32 or float64; float16 and bfloat16 on GPUs only
  bool ta = false, tb = false;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int64_t lda = 0, stride_a = 0;
  const void* b = nullptr;
  int64_t ldb = 0, stride_b = 0;
  void* c = nullptr;
  int64_t ldc = 0, stride_c = 0;
  int64_t count = 1;
  bool beta_one = false;
  // float32 on a GPU may use TF32 tensor cores (Note [TF32 per request]).
  bool allow_tf32 = false;
};
using GemmBatchFn = void(const GemmBatch& args);
extern KernelStub<GemmBatchFn> gemm_batch_stub;

// --- nn.cc ---

// softmax (log: log_softmax) of x along the middle of `s` into out.
using SoftmaxFn = void(const Tensor& x, const Tensor& out, DimSplit s, bool log);
extern KernelStub<SoftmaxFn> softmax_stub;
// The fused backward from the result y and the incoming gradient g into gx.
using SoftmaxBackwardFn = void(const Tensor& y, const Tensor& g, const Tensor& gx, DimSplit s,
                               bool log);
extern KernelStub<SoftmaxBackwardFn> softmax_backward_stub;

// Per row of x [rows, cols]: mean, rstd (float64 [rows] whatever x's dtype: Note [layer_norm's
// statistics in float64] in nn.cc) and y = (x - mean) * rstd * weight + bias (weight, bias
// undefined if absent).
using LayerNormFn = void(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t rows,
                         int64_t cols, double eps, const Tensor& out, const Tensor& mean,
                         const Tensor& rstd);
extern KernelStub<LayerNormFn> layer_norm_stub;
// The fused backward; gx, gw, gb undefined if not needed (gw, gb zero-filled when defined).
using LayerNormBackwardFn = void(const Tensor& x, const Tensor& g, const Tensor& weight,
                                 const Tensor& mean, const Tensor& rstd, int64_t rows, int64_t cols,
                                 const Tensor& gx, const Tensor& gw, const Tensor& gb);
extern KernelStub<LayerNormBackwardFn> layer_norm_backward_stub;

// nll_loss forward: x [outer, C, inner] log-probabilities, weight and target (int64,
// contiguous) of the target's shape [outer, inner]; out is [outer, inner] for kNone, else [].
// A position whose target is ignore_index adds 0; any other adds -x * weight, as PyTorch's
// (NaN for a weight of 0 at a log-probability of -inf). count: positions not ignored ("mean"
// of none is NaN).
using NllLossFn = void(const Tensor& x, const Tensor& weight, const Tensor& target,
                       int64_t ignore_index, DimSplit s, Reduction reduction, int64_t count,
                       const Tensor& out);
extern KernelStub<NllLossFn> nll_loss_stub;

// mse_loss forward over x and t of one shape: out of that shape for kNone, else [].
using MseLossFn = void(const Tensor& x, const Tensor& t, Reduction reduction, const Tensor& out);
extern KernelStub<MseLossFn> mse_loss_stub;
// gx = scale * (x - t) * g, g of x's shape (per_element) or one element.
using MseLossBackwardFn = void(const Tensor& x, const Tensor& t, const Tensor& g, double scale,
                               bool per_element, const Tensor& gx);
extern KernelStub<MseLossBackwardFn> mse_loss_backward_stub;

// conv2d forward: x [N, C, H, W], w [O, C/G, kH, kW], bias [O] or undefined, out [N, O, oH, oW].
using Conv2dFn = void(const Tensor& x, const Tensor& w, const Tensor& bias, const ConvGeometry& g,
                      const Tensor& out);
extern KernelStub<Conv2dFn> conv2d_stub;
// The fused backward; gx, gw, gb undefined if not needed, else zero-filled (added into).
using Conv2dBackwardFn = void(const Tensor& x, const Tensor& w, const Tensor& grad,
                              const ConvGeometry& g, const Tensor& gx, const Tensor& gw,
                              const Tensor& gb);
extern KernelStub<Conv2dBackwardFn> conv2d_backward_stub;

// --- conv_im2col.cc ---

// im2col over a batch: x [N, C, H, W] into cols [N, C * kH * kW, oH * oW] (overwritten).
using Im2ColFn = void(const Tensor& x, const ConvGeometry& g, const Tensor& cols);
extern KernelStub<Im2ColFn> im2col_stub;
// col2im over a batch: adds cols [N, C * kH * kW, oH * oW] into image [N, C, H, W].
using Col2ImFn = void(const Tensor& cols, const ConvGeometry& g, const Tensor& image);
extern KernelStub<Col2ImFn> col2im_stub;

}  // namespace gradserve::ops

#endif  // GRADSERVE_ENGINE_OPS_NN_KERNELS_H_
