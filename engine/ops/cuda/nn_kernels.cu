// The CUDA implementations of the nn kernel stubs (engine/ops/nn_kernels.h): softmax,
// layer_norm, nll_loss, mse_loss, im2col / col2im and conv2d. Each runs on the current stream of
// its tensors' GPU and is not waited for; nothing reads device memory on the host.
//
// Row kernels (softmax, layer_norm) run one block of kBlock threads per row with a shared-memory
// tree reduction. They accumulate in double, as the CPU kernels do (Acc in nn.cc), and round to
// the element type where the CPU does, so the results agree with the CPU's to rounding (the
// order of the sums differs). Small losses reduce in one block.

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "engine/device/cuda/cuda_check.h"
#include "engine/device/cuda/cuda_stream.h"
#include "engine/kernels/cuda/launch.cuh"
#include "engine/ops/nn_kernels.h"

namespace gradserve::ops::cuda_kernels {
namespace {

constexpr int kBlock = 256;  // threads of the row and reduction kernels (a power of two)
constexpr int64_t kMaxGrid = int64_t{1} << 30;

unsigned RowBlocks(int64_t rows) {
  return static_cast<unsigned>(rows < kMaxGrid ? (rows < 1 ? 1 : rows) : kMaxGrid);
}

__device__ inline float DevExp(float v) { return expf(v); }
__device__ inline double DevExp(double v) { return exp(v); }

struct MaxOp {
  __device__ double operator()(double a, double b) const { return a < b ? b : a; }
};
struct AddOp {
  __device__ double operator()(double a, double b) const { return a + b; }
};

// Combines every thread's v with op; all threads of the block call it and get the result.
template <typename Op>
__device__ double BlockReduce(double v, Op op, double* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int s = kBlock / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] = op(shared[threadIdx.x], shared[threadIdx.x + s]);
    __syncthreads();
  }
  const double r = shared[0];
  __syncthreads();
  return r;
}

template <typename T>
const T* PtrOrNull(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}
template <typename T>
T* MutPtrOrNull(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

// ---------------------------------------------------------------------------------------------
// softmax and log_softmax: row r of [outer, size, inner] starts at (r / inner) * size * inner +
// r % inner with step inner.

template <typename T>
__global__ void SoftmaxForwardKernel(const T* x, T* y, int64_t rows, int64_t size, int64_t inner,
                                     bool log) {
  __shared__ double shared[kBlock];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t base = (r / inner) * size * inner + r % inner;
    const T* in = x + base;
    T* out = y + base;
    double m = -INFINITY;
    for (int64_t k = threadIdx.x; k < size; k += kBlock) {
      const double v = static_cast<double>(in[k * inner]);
      m = m < v ? v : m;  // std::max(m, v): a NaN v is skipped, as on the CPU
    }
    m = BlockReduce(m, MaxOp{}, shared);
    T max = static_cast<T>(m);
    if (!isfinite(m)) max = isnan(m) ? max : T(0);
    double total = 0;
    for (int64_t k = threadIdx.x; k < size; k += kBlock) {
      total += exp(static_cast<double>(in[k * inner] - max));
    }
    total = BlockReduce(total, AddOp{}, shared);
    if (log) {
      // Note [log_softmax without cancellation] (nn.cc): (x - max) - log(sum).
      const T log_total = static_cast<T>(::log(total));
      for (int64_t k = threadIdx.x; k < size; k += kBlock) {
        out[k * inner] = (in[k * inner] - max) - log_total;
      }
    } else {
      const double scale = 1 / total;
      for (int64_t k = threadIdx.x; k < size; k += kBlock) {
        out[k * inner] = static_cast<T>(exp(static_cast<double>(in[k * inner] - max)) * scale);
      }
    }
  }
}

template <typename T>
__global__ void SoftmaxBackwardKernel(const T* y, const T* g, T* gx, int64_t rows, int64_t size,
                                      int64_t inner, bool log) {
  __shared__ double shared[kBlock];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t base = (r / inner) * size * inner + r % inner;
    double total = 0;
    for (int64_t k = threadIdx.x; k < size; k += kBlock) {
      const int64_t at = base + k * inner;
      total += log ? static_cast<double>(g[at]) : static_cast<double>(g[at]) * y[at];
    }
    total = BlockReduce(total, AddOp{}, shared);
    const T t = static_cast<T>(total);
    for (int64_t k = threadIdx.x; k < size; k += kBlock) {
      const int64_t at = base + k * inner;
      gx[at] = log ? g[at] - DevExp(y[at]) * t : y[at] * (g[at] - t);
    }
  }
}

void SoftmaxCuda(const Tensor& x, const Tensor& out, DimSplit s, bool log) {
  const int64_t rows = s.outer * s.inner;
  if (rows == 0 || s.size == 0) return;
  const LaunchOn on(out);
  DispatchFloating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    SoftmaxForwardKernel<T><<<RowBlocks(rows), kBlock, 0, on.stream()>>>(
        x.data<T>(), out.data<T>(), rows, s.size, s.inner, log);
    GS_CUDA_CHECK_LAUNCH("SoftmaxForwardKernel");
  });
}

void SoftmaxBackwardCuda(const Tensor& y, const Tensor& g, const Tensor& gx, DimSplit s, bool log) {
  const int64_t rows = s.outer * s.inner;
  if (rows == 0 || s.size == 0) return;
  const LaunchOn on(gx);
  DispatchFloating(y.dtype(), [&](auto tag) {
    using T = decltype(tag);
    SoftmaxBackwardKernel<T><<<RowBlocks(rows), kBlock, 0, on.stream()>>>(
        y.data<T>(), g.data<T>(), gx.data<T>(), rows, s.size, s.inner, log);
    GS_CUDA_CHECK_LAUNCH("SoftmaxBackwardKernel");
  });
}

// ---------------------------------------------------------------------------------------------
// layer_norm over rows of [rows, cols].

template <typename T>
__global__ void LayerNormForwardKernel(const T* x, const T* weight, const T* bias, int64_t rows,
                                       int64_t cols, double eps, T* y, double* mean_out,
                                       double* rstd_out) {
  __shared__ double shared[kBlock];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* in = x + r * cols;
    T* out = y + r * cols;
    double total = 0;
    for (int64_t c = threadIdx.x; c < cols; c += kBlock) total += in[c];
    total = BlockReduce(total, AddOp{}, shared);
    const double mean = total / static_cast<double>(cols);
    double squares = 0;
    for (int64_t c = threadIdx.x; c < cols; c += kBlock) {
      squares += (in[c] - mean) * (in[c] - mean);
    }
    squares = BlockReduce(squares, AddOp{}, shared);
    const double rstd = 1 / sqrt(squares / static_cast<double>(cols) + eps);
    for (int64_t c = threadIdx.x; c < cols; c += kBlock) {
      T v = static_cast<T>((in[c] - mean) * rstd);
      if (weight != nullptr) v *= weight[c];
      if (bias != nullptr) v += bias[c];
      out[c] = v;
    }
    if (threadIdx.x == 0) {
      mean_out[r] = mean;  // Note [layer_norm's statistics in float64] (nn.cc)
      rstd_out[r] = rstd;
    }
  }
}

// gx per row: rstd * (gy - mean(gy) - xhat * mean(gy * xhat)), gy = g * weight.
template <typename T>
__global__ void LayerNormBackwardInputKernel(const T* x, const T* g, const T* weight,
                                             const double* mean, const double* rstd, int64_t rows,
                                             int64_t cols, T* gx) {
  __shared__ double shared[kBlock];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* in = x + r * cols;
    const T* gr = g + r * cols;
    const double m = mean[r], s = rstd[r];
    double sum_gy = 0, sum_gy_xhat = 0;
    for (int64_t c = threadIdx.x; c < cols; c += kBlock) {
      const double xhat = (in[c] - m) * s;
      const double gy = weight != nullptr ? static_cast<double>(gr[c]) * weight[c] : gr[c];
      sum_gy += gy;
      sum_gy_xhat += gy * xhat;
    }
    sum_gy = BlockReduce(sum_gy, AddOp{}, shared);
    sum_gy_xhat = BlockReduce(sum_gy_xhat, AddOp{}, shared);
    const double a = sum_gy / cols, b = sum_gy_xhat / cols;
    for (int64_t c = threadIdx.x; c < cols; c += kBlock) {
      const double xhat = (in[c] - m) * s;
      const double gy = weight != nullptr ? static_cast<double>(gr[c]) * weight[c] : gr[c];
      gx[r * cols + c] = static_cast<T>(s * (gy - a - xhat * b));
    }
  }
}

// gw[c] = sum over rows of g * xhat, gb[c] = sum over rows of g: one thread per column.
template <typename T>
__global__ void LayerNormBackwardParamsKernel(const T* x, const T* g, const double* mean,
                                              const double* rstd, int64_t rows, int64_t cols, T* gw,
                                              T* gb) {
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < cols;
       c += int64_t{gridDim.x} * blockDim.x) {
    double gw_acc = 0, gb_acc = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const T gv = g[r * cols + c];
      const double xhat = (x[r * cols + c] - static_cast<double>(mean[r])) * rstd[r];
      gw_acc += gv * xhat;
      gb_acc += gv;
    }
    if (gw != nullptr) gw[c] = static_cast<T>(gw_acc);
    if (gb != nullptr) gb[c] = static_cast<T>(gb_acc);
  }
}

void LayerNormCuda(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t rows,
                   int64_t cols, double eps, const Tensor& out, const Tensor& mean,
                   const Tensor& rstd) {
  if (rows == 0) return;
  const LaunchOn on(out);
  DispatchFloating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    LayerNormForwardKernel<T><<<RowBlocks(rows), kBlock, 0, on.stream()>>>(
        x.data<T>(), PtrOrNull<T>(weight), PtrOrNull<T>(bias), rows, cols, eps, out.data<T>(),
        mean.data<double>(), rstd.data<double>());
    GS_CUDA_CHECK_LAUNCH("LayerNormForwardKernel");
  });
}

void LayerNormBackwardCuda(const Tensor& x, const Tensor& g, const Tensor& weight,
                           const Tensor& mean, const Tensor& rstd, int64_t rows, int64_t cols,
                           const Tensor& gx, const Tensor& gw, const Tensor& gb) {
  if (rows == 0 || cols == 0) return;  // gw, gb are zero-filled already
  const LaunchOn on(x);
  DispatchFloating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (gx.defined()) {
      LayerNormBackwardInputKernel<T><<<RowBlocks(rows), kBlock, 0, on.stream()>>>(
          x.data<T>(), g.data<T>(), PtrOrNull<T>(weight), mean.data<double>(), rstd.data<double>(),
          rows, cols, gx.data<T>());
      GS_CUDA_CHECK_LAUNCH("LayerNormBackwardInputKernel");
    }
    if (gw.defined() || gb.defined()) {
      LayerNormBackwardParamsKernel<T><<<BlocksFor(cols), kThreads, 0, on.stream()>>>(
          x.data<T>(), g.data<T>(), mean.data<double>(), rstd.data<double>(), rows, cols,
          MutPtrOrNull<T>(gw), MutPtrOrNull<T>(gb));
      GS_CUDA_CHECK_LAUNCH("LayerNormBackwardParamsKernel");
    }
  });
}

// ---------------------------------------------------------------------------------------------
// nll_loss and mse_loss.

// The loss at target position p of [outer, inner]: 0 where ignored, else -x * w (NaN for a
// weight of 0 at -inf, as PyTorch's).
template <typename T>
__device__ T NllAt(const T* x, const T* w, const int64_t* t, int64_t ignore_index, int64_t p,
                   int64_t size, int64_t inner) {
  const int64_t n = p / inner, i = p % inner;
  return t[p] == ignore_index ? T(0) : -x[(n * size + t[p]) * inner + i] * w[p];
}

template <typename T>
__global__ void NllLossNoneKernel(const T* x, const T* w, const int64_t* t, int64_t ignore_index,
                                  int64_t positions, int64_t size, int64_t inner, T* out) {
  for (int64_t p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; p < positions;
       p += int64_t{gridDim.x} * blockDim.x) {
    out[p] = NllAt(x, w, t, ignore_index, p, size, inner);
  }
}

// One block: out[0] = the sum (NaN for "mean" over no positions).
template <typename T>
__global__ void NllLossSumKernel(const T* x, const T* w, const int64_t* t, int64_t ignore_index,
                                 int64_t positions, int64_t size, int64_t inner, bool nan_result,
                                 T* out) {
  __shared__ double shared[kBlock];
  double total = 0;
  for (int64_t p = threadIdx.x; p < positions; p += kBlock) {
    total += NllAt(x, w, t, ignore_index, p, size, inner);
  }
  total = BlockReduce(total, AddOp{}, shared);
  if (threadIdx.x == 0) out[0] = nan_result ? static_cast<T>(NAN) : static_cast<T>(total);
}

void NllLossCuda(const Tensor& x, const Tensor& weight, const Tensor& target, int64_t ignore_index,
                 DimSplit s, Reduction reduction, int64_t count, const Tensor& out) {
  const int64_t positions = s.outer * s.inner;
  if (reduction == Reduction::kNone && positions == 0) return;
  const LaunchOn on(out);
  DispatchFloating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (reduction == Reduction::kNone) {
      NllLossNoneKernel<T><<<BlocksFor(positions), kThreads, 0, on.stream()>>>(
          x.data<T>(), weight.data<T>(), target.data<int64_t>(), ignore_index, positions, s.size,
          s.inner, out.data<T>());
      GS_CUDA_CHECK_LAUNCH("NllLossNoneKernel");
    } else {
      const bool nan_result = reduction == Reduction::kMean && count == 0;
      NllLossSumKernel<T><<<1, kBlock, 0, on.stream()>>>(
          x.data<T>(), weight.data<T>(), target.data<int64_t>(), ignore_index, positions, s.size,
          s.inner, nan_result, out.data<T>());
      GS_CUDA_CHECK_LAUNCH("NllLossSumKernel");
    }
  });
}

template <typename T>
__global__ void MseNoneKernel(const T* x, const T* t, int64_t n, T* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const T d = x[i] - t[i];
    out[i] = d * d;
  }
}

// One block: out[0] = the sum of squares (divided by n for "mean"; 0/0 is NaN as on the CPU).
template <typename T>
__global__ void MseSumKernel(const T* x, const T* t, int64_t n, bool mean, T* out) {
  __shared__ double shared[kBlock];
  double total = 0;
  for (int64_t i = threadIdx.x; i < n; i += kBlock) {
    const T d = x[i] - t[i];
    total += static_cast<double>(d) * d;
  }
  total = BlockReduce(total, AddOp{}, shared);
  if (mean) total /= static_cast<double>(n);
  if (threadIdx.x == 0) out[0] = static_cast<T>(total);
}

template <typename T>
__global__ void MseBackwardKernel(const T* x, const T* t, const T* g, int64_t n, T scale,
                                  bool per_element, T* gx) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    gx[i] = scale * (x[i] - t[i]) * g[per_element ? i : 0];
  }
}

void MseLossCuda(const Tensor& x, const Tensor& t, Reduction reduction, const Tensor& out) {
  const int64_t n = x.numel();
  if (reduction == Reduction::kNone && n == 0) return;
  const LaunchOn on(out);
  DispatchFloating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (reduction == Reduction::kNone) {
      MseNoneKernel<T>
          <<<BlocksFor(n), kThreads, 0, on.stream()>>>(x.data<T>(), t.data<T>(), n, out.data<T>());
      GS_CUDA_CHECK_LAUNCH("MseNoneKernel");
    } else {
      MseSumKernel<T><<<1, kBlock, 0, on.stream()>>>(x.data<T>(), t.data<T>(), n,
                                                     reduction == Reduction::kMean, out.data<T>());
      GS_CUDA_CHECK_LAUNCH("MseSumKernel");
    }
  });
}

void MseLossBackwardCuda(const Tensor& x, const Tensor& t, const Tensor& g, double scale,
                         bool per_element, const Tensor& gx) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const LaunchOn on(gx);
  DispatchFloating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    MseBackwardKernel<T><<<BlocksFor(n), kThreads, 0, on.stream()>>>(
        x.data<T>(), t.data<T>(), g.data<T>(), n, static_cast<T>(scale), per_element, gx.data<T>());
    GS_CUDA_CHECK_LAUNCH("MseBackwardKernel");
  });
}

// ---------------------------------------------------------------------------------------------
// im2col, col2im and conv2d (Note [conv2d as im2col] in conv_im2col.h).

// ConvGeometry's sizes as plain values for the kernels.
struct ConvParams {
  int64_t batch, channels, height, width, kernel_h, kernel_w, out_h, out_w;
  int64_t stride_h, stride_w, pad_h, pad_w, dil_h, dil_w;
};

ConvParams ParamsOf(const ConvGeometry& g) {
  const Conv2dOptions& o = g.options;
  return ConvParams{g.batch,      g.channels,   g.height,      g.width,      g.kernel_h,
                    g.kernel_w,   g.out_h,      g.out_w,       o.stride[0],  o.stride[1],
                    o.padding[0], o.padding[1], o.dilation[0], o.dilation[1]};
}

// One thread per element of cols [N, C * kH * kW, oH * oW].
template <typename T>
__global__ void Im2ColKernel(const T* x, ConvParams p, int64_t total, T* cols) {
  const int64_t positions = p.out_h * p.out_w;
  const int64_t rows = p.channels * p.kernel_h * p.kernel_w;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < total;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t pos = idx % positions;
    const int64_t row = (idx / positions) % rows;
    const int64_t n = idx / (positions * rows);
    const int64_t j = row % p.kernel_w;
    const int64_t i = (row / p.kernel_w) % p.kernel_h;
    const int64_t c = row / (p.kernel_w * p.kernel_h);
    const int64_t oh = pos / p.out_w, ow = pos % p.out_w;
    const int64_t h = oh * p.stride_h - p.pad_h + i * p.dil_h;
    const int64_t w = ow * p.stride_w - p.pad_w + j * p.dil_w;
    const bool inside = h >= 0 && h < p.height && w >= 0 && w < p.width;
    cols[idx] = inside ? x[((n * p.channels + c) * p.height + h) * p.width + w] : T(0);
  }
}

// One thread per image element (n, c, h, w): adds the cols entries that im2col copied from it.
template <typename T>
__global__ void Col2ImKernel(const T* cols, ConvParams p, int64_t total, T* image) {
  const int64_t positions = p.out_h * p.out_w;
  const int64_t rows = p.channels * p.kernel_h * p.kernel_w;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < total;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t w = idx % p.width;
    const int64_t h = (idx / p.width) % p.height;
    const int64_t c = (idx / (p.width * p.height)) % p.channels;
    const int64_t n = idx / (p.width * p.height * p.channels);
    const T* cols_n = cols + n * rows * positions;
    T acc = 0;
    for (int64_t i = 0; i < p.kernel_h; ++i) {
      const int64_t hs = h + p.pad_h - i * p.dil_h;  // = oh * stride_h
      if (hs < 0 || hs % p.stride_h != 0) continue;
      const int64_t oh = hs / p.stride_h;
      if (oh >= p.out_h) continue;
      for (int64_t j = 0; j < p.kernel_w; ++j) {
        const int64_t ws = w + p.pad_w - j * p.dil_w;
        if (ws < 0 || ws % p.stride_w != 0) continue;
        const int64_t ow = ws / p.stride_w;
        if (ow >= p.out_w) continue;
        acc += cols_n[((c * p.kernel_h + i) * p.kernel_w + j) * positions + oh * p.out_w + ow];
      }
    }
    image[idx] += acc;
  }
}

void Im2ColCuda(const Tensor& x, const ConvGeometry& g, const Tensor& cols) {
  const int64_t total = cols.numel();
  if (total == 0) return;
  const LaunchOn on(cols);
  DispatchFloating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Im2ColKernel<T><<<BlocksFor(total), kThreads, 0, on.stream()>>>(x.data<T>(), ParamsOf(g), total,
                                                                    cols.data<T>());
    GS_CUDA_CHECK_LAUNCH("Im2ColKernel");
  });
}

void Col2ImCuda(const Tensor& cols, const ConvGeometry& g, const Tensor& image) {
  const int64_t total = image.numel();
  if (total == 0) return;
  const LaunchOn on(image);
  DispatchFloating(cols.dtype(), [&](auto tag) {
    using T = decltype(tag);
    Col2ImKernel<T><<<BlocksFor(total), kThreads, 0, on.stream()>>>(cols.data<T>(), ParamsOf(g),
                                                                    total, image.data<T>());
    GS_CUDA_CHECK_LAUNCH("Col2ImKernel");
  });
}

// out [N, O, P] += bias[o].
template <typename T>
__global__ void AddBiasKernel(const T* bias, int64_t out_channels, int64_t positions, int64_t total,
                              T* out) {
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < total;
       idx += int64_t{gridDim.x} * blockDim.x) {
    out[idx] += bias[(idx / positions) % out_channels];
  }
}

// One block per channel o: gb[o] += the sum of grad [N, O, P] over n and p.
template <typename T>
__global__ void BiasGradKernel(const T* grad, int64_t batch, int64_t out_channels,
                               int64_t positions, T* gb) {
  __shared__ double shared[kBlock];
  for (int64_t o = blockIdx.x; o < out_channels; o += gridDim.x) {
    double total = 0;
    for (int64_t q = threadIdx.x; q < batch * positions; q += kBlock) {
      const int64_t n = q / positions, p = q % positions;
      total += grad[(n * out_channels + o) * positions + p];
    }
    total = BlockReduce(total, AddOp{}, shared);
    if (threadIdx.x == 0) gb[o] += static_cast<T>(total);
  }
}

void Conv2dCuda(const Tensor& x, const Tensor& w, const Tensor& bias, const ConvGeometry& g,
                const Tensor& out) {
  if (out.numel() == 0) return;
  Tensor cols = Tensor::Empty(g.cols_shape(), x.dtype(), x.device());
  Im2ColCuda(x, g, cols);
  const int64_t groups = g.groups(), rows = g.group_rows(), positions = g.positions();
  const int64_t per_group = g.out_channels / groups;
  const int64_t all_rows = rows * groups;
  const size_t element = ElementSize(x.dtype());
  const char* const pw = static_cast<const char*>(w.raw_data());
  const char* const pc = static_cast<const char*>(cols.raw_data());
  char* const po = static_cast<char*>(out.raw_data());
  // Per group, over the batch: out[n, k] = weight_k [O/G, R] @ cols[n, k] [R, P].
  for (int64_t k = 0; k < groups; ++k) {
    GemmBatch args;
    args.device_index = out.device().index;
    args.dtype = x.dtype();
    args.m = per_group;
    args.n = positions;
    args.k = rows;
    args.a = pw + k * per_group * rows * element;
    args.lda = rows;
    args.stride_a = 0;
    args.b = pc + k * rows * positions * element;
    args.ldb = positions;
    args.stride_b = all_rows * positions;
    args.c = po + k * per_group * positions * element;
    args.ldc = positions;
    args.stride_c = g.out_channels * positions;
    args.count = g.batch;
    gemm_batch_stub(out.device(), args);
  }
  if (!bias.defined()) return;
  const LaunchOn on(out);
  const int64_t total = out.numel();
  DispatchFloating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    AddBiasKernel<T><<<BlocksFor(total), kThreads, 0, on.stream()>>>(
        bias.data<T>(), g.out_channels, positions, total, out.data<T>());
    GS_CUDA_CHECK_LAUNCH("AddBiasKernel");
  });
}

void Conv2dBackwardCuda(const Tensor& x, const Tensor& w, const Tensor& grad, const ConvGeometry& g,
                        const Tensor& gx, const Tensor& gw, const Tensor& gb) {
  if (grad.numel() == 0) return;  // the gradients stay zero
  const int64_t groups = g.groups(), rows = g.group_rows(), positions = g.positions();
  const int64_t per_group = g.out_channels / groups;
  const int64_t all_rows = rows * groups;
  const size_t element = ElementSize(x.dtype());
  const char* const pw = static_cast<const char*>(w.raw_data());
  const char* const pg = static_cast<const char*>(grad.raw_data());
  GemmBatch base;
  base.device_index = x.device().index;
  base.dtype = x.dtype();
  if (gw.defined()) {
    // gw_k += grad[n, k] [O/G, P] @ cols[n, k]^T [P, R], image by image.
    Tensor cols = Tensor::Empty(g.cols_shape(), x.dtype(), x.device());
    Im2ColCuda(x, g, cols);
    const char* const pc = static_cast<const char*>(cols.raw_data());
    char* const pgw = static_cast<char*>(gw.raw_data());
    for (int64_t n = 0; n < g.batch; ++n) {
      for (int64_t k = 0; k < groups; ++k) {
        GemmBatch args = base;
        args.tb = true;
        args.m = per_group;
        args.n = rows;
        args.k = positions;
        args.a = pg + (n * g.out_channels + k * per_group) * positions * element;
        args.lda = positions;
        args.b = pc + (n * all_rows + k * rows) * positions * element;
        args.ldb = positions;
        args.c = pgw + k * per_group * rows * element;
        args.ldc = rows;
        args.beta_one = true;
        gemm_batch_stub(x.device(), args);
      }
    }
  }
  if (gx.defined()) {
    // cols-gradient[n, k] = weight_k^T [R, O/G] @ grad[n, k] [O/G, P], then col2im into gx.
    Tensor cols_grad = Tensor::Empty(g.cols_shape(), x.dtype(), x.device());
    char* const pcg = static_cast<char*>(cols_grad.raw_data());
    for (int64_t k = 0; k < groups; ++k) {
      GemmBatch args = base;
      args.ta = true;
      args.m = rows;
      args.n = positions;
      args.k = per_group;
      args.a = pw + k * per_group * rows * element;
      args.lda = rows;
      args.stride_a = 0;
      args.b = pg + k * per_group * positions * element;
      args.ldb = positions;
      args.stride_b = g.out_channels * positions;
      args.c = pcg + k * rows * positions * element;
      args.ldc = positions;
      args.stride_c = all_rows * positions;
      args.count = g.batch;
      gemm_batch_stub(x.device(), args);
    }
    Col2ImCuda(cols_grad, g, gx);
  }
  if (gb.defined()) {
    const LaunchOn on(gb);
    DispatchFloating(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      BiasGradKernel<T><<<RowBlocks(g.out_channels), kBlock, 0, on.stream()>>>(
          grad.data<T>(), g.batch, g.out_channels, positions, gb.data<T>());
      GS_CUDA_CHECK_LAUNCH("BiasGradKernel");
    });
  }
}

}  // namespace

void RegisterLinalgCudaKernels();  // linalg_kernels.cu

void RegisterNnCudaKernels() {
  RegisterLinalgCudaKernels();
  softmax_stub.Register(DeviceType::kCUDA, SoftmaxCuda);
  softmax_backward_stub.Register(DeviceType::kCUDA, SoftmaxBackwardCuda);
  layer_norm_stub.Register(DeviceType::kCUDA, LayerNormCuda);
  layer_norm_backward_stub.Register(DeviceType::kCUDA, LayerNormBackwardCuda);
  nll_loss_stub.Register(DeviceType::kCUDA, NllLossCuda);
  mse_loss_stub.Register(DeviceType::kCUDA, MseLossCuda);
  mse_loss_backward_stub.Register(DeviceType::kCUDA, MseLossBackwardCuda);
  im2col_stub.Register(DeviceType::kCUDA, Im2ColCuda);
  col2im_stub.Register(DeviceType::kCUDA, Col2ImCuda);
  conv2d_stub.Register(DeviceType::kCUDA, Conv2dCuda);
  conv2d_backward_stub.Register(DeviceType::kCUDA, Conv2dBackwardCuda);
}

}  // namespace gradserve::ops::cuda_kernels
