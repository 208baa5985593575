#include "engine/ops/pooling.h"

#include <cmath>
#include <vector>

#include "engine/kernels/op_kernels.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/linalg.h"
#include "engine/ops/nn.h"
#include "engine/ops/shape.h"
#include "engine/ops/shape_common.h"
#include "engine/util/cancellation.h"

namespace gradserve::ops {
namespace {

// The input as [N, C, H, W] (an unbatched one gets N = 1), checked for op.
Tensor Batched(const char* op, const Tensor& input) {
  RequireFloating(op, "input", input);
  GS_CHECK_ARG(input.dim() == 3 || input.dim() == 4, op,
               ": input must be [N, C, H, W] or [C, H, W], got shape ",
               ShapeToString(input.shape()));
  return input.dim() == 4 ? input : unsqueeze(input, 0);
}

// The result back in the input's rank.
Tensor Unbatched(const Tensor& input, const Tensor& out) {
  return input.dim() == 4 ? out : squeeze(out, 0);
}

// The output sizes (OH, OW) of a pooling window over x [N, C, H, W], checked.
std::array<int64_t, 2> PooledSize(const char* op, const Tensor& x, const Pool2dOptions& o) {
  std::array<int64_t, 2> out{};
  for (int i = 0; i < 2; ++i) {
    GS_CHECK_ARG(
        o.kernel_size[i] >= 1 && o.stride[i] >= 1 && o.padding[i] >= 0 && o.dilation[i] >= 1, op,
        ": kernel_size, stride and dilation must be positive and padding not "
        "negative, got kernel_size ",
        o.kernel_size[i], ", stride ", o.stride[i], ", padding ", o.padding[i], ", dilation ",
        o.dilation[i]);
    GS_CHECK_ARG(o.padding[i] <= o.kernel_size[i] / 2, op, ": padding = ", o.padding[i],
                 " should be at most half of kernel_size = ", o.kernel_size[i]);
    // The sizes come from the client: every product and sum is checked (an empty input may
    // have any size in a dim, and a window any size), as conv2d's OutputSize does.
    const int64_t size = x.size(2 + i);
    int64_t span = 0, padded = 0;
    GS_CHECK_ARG(!__builtin_mul_overflow(o.dilation[i], o.kernel_size[i] - 1, &span) &&
                     !__builtin_add_overflow(span, 1, &span) &&
                     !__builtin_add_overflow(size, 2 * o.padding[i], &padded),
                 op, ": kernel_size ", o.kernel_size[i], " with dilation ", o.dilation[i],
                 " or padding ", o.padding[i], " does not fit in int64");
    const int64_t room = padded - span;
    GS_CHECK_ARG(room >= 0, op, ": the window (", span, " with dilation) is larger than the ",
                 i == 0 ? "height" : "width", " ", size, " plus padding of input with shape ",
                 ShapeToString(x.shape()));
    const int64_t stride = o.stride[i];
    out[i] = room / stride + (o.ceil_mode && room % stride != 0 ? 1 : 0) + 1;
    // PyTorch's rule: with ceil_mode the last window must start inside the input or its
    // leading padding (a start past int64 is past both).
    int64_t last_start = 0;
    if (o.ceil_mode && (__builtin_mul_overflow(out[i] - 1, stride, &last_start) ||
                        last_start >= size + o.padding[i])) {
      --out[i];
    }
  }
  return out;
}

// For each window of a [planes, H, W] host tensor, the flat index h * W + w of its maximum
// (the first, or the last NaN, as PyTorch's CPU kernel), into idx [planes, OH, OW].
template <typename T>
void MaxIndices(const T* x, int64_t* idx, int64_t planes, int64_t h, int64_t w,
                std::array<int64_t, 2> out, const Pool2dOptions& o) {
  WorkMeter meter;  // Note [Stopping a running op]
  const int64_t window = o.kernel_size[0] * o.kernel_size[1];
  ForEachBlock(
      planes * out[0] * out[1], meter,
      [&](int64_t begin, int64_t end) {
        for (int64_t e = begin; e < end; ++e) {
          const int64_t p = e / (out[0] * out[1]);
          const int64_t oh = e / out[1] % out[0];
          const int64_t ow = e % out[1];
          const T* plane = x + p * h * w;
          int64_t best = -1;
          T best_value = T(0);
          for (int64_t i = 0; i < o.kernel_size[0]; ++i) {
            const int64_t y = oh * o.stride[0] - o.padding[0] + i * o.dilation[0];
            if (y < 0 || y >= h) continue;
            for (int64_t j = 0; j < o.kernel_size[1]; ++j) {
              const int64_t z = ow * o.stride[1] - o.padding[1] + j * o.dilation[1];
              if (z < 0 || z >= w) continue;
              const T v = plane[y * w + z];
              if (best < 0 || v > best_value || std::isnan(v)) {
                best = y * w + z;
                best_value = v;
              }
            }
          }
          idx[e] = best;
        }
      },
      std::max<int64_t>(1, kWorkPerCheck / window));
}

// The [n, size] matrix whose row i averages input positions floor(i * size / n) to
// ceil((i + 1) * size / n), as PyTorch's adaptive pooling bins.
Tensor AveragingMatrix(int64_t n, int64_t size, DType dtype, Device device) {
  Tensor m = Tensor::Zeros({n, size}, DType::kFloat64);
  double* d = m.data<double>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t start = i * size / n;
    const int64_t end = ((i + 1) * size + n - 1) / n;
    for (int64_t j = start; j < end; ++j) d[i * size + j] = 1.0 / static_cast<double>(end - start);
  }
  m = m.To(dtype);
  return device == kCPU ? m : m.To(device);
}

}  // namespace

Tensor max_pool2d(const Tensor& input, const Pool2dOptions& options) {
  const Tensor x = Batched("max_pool2d", input);
  const std::array<int64_t, 2> out = PooledSize("max_pool2d", x, options);
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  Tensor index = Tensor::Empty({n, c, out[0] * out[1]}, DType::kInt64);
  if (index.numel() > 0) {
    const Tensor host =
        (x.device().type == DeviceType::kCUDA ? x.detach().To(kCPU) : x.detach()).contiguous();
    DispatchFloating(host.dtype(), [&](auto tag) {
      using T = decltype(tag);
      MaxIndices<T>(host.data<T>(), index.data<int64_t>(), n * c, h, w, out, options);
    });
  }
  if (x.device() != kCPU) index = index.To(x.device());
  const int64_t flat[] = {n, c, h * w};
  const int64_t pooled[] = {n, c, out[0], out[1]};
  return Unbatched(input, reshape(gather(reshape(x, flat), 2, index), pooled));
}

Tensor avg_pool2d(const Tensor& input, const Pool2dOptions& options) {
  const Tensor x = Batched("avg_pool2d", input);
  // A convolution, whose windows never pass the padding as ceil_mode's last one may.
  GS_CHECK_ARG(!options.ceil_mode, "avg_pool2d: ceil_mode = true is not supported");
  Pool2dOptions o = options;
  o.dilation = {1, 1};
  PooledSize("avg_pool2d", x, o);
  if (options.divisor_override) {
    GS_CHECK_ARG(*options.divisor_override != 0, "avg_pool2d: divisor_override must not be 0");
  }
  const int64_t c = x.size(1);
  const double cells = static_cast<double>(o.kernel_size[0] * o.kernel_size[1]);
  const bool by_count =
      !o.count_include_pad && !o.divisor_override && (o.padding[0] > 0 || o.padding[1] > 0);
  const double divisor =
      options.divisor_override ? static_cast<double>(*options.divisor_override) : cells;
  Conv2dOptions conv;
  conv.stride = o.stride;
  conv.padding = o.padding;
  conv.groups = c;
  const Tensor kernel = Tensor::Full({c, 1, o.kernel_size[0], o.kernel_size[1]},
                                     by_count ? 1.0 : 1.0 / divisor, x.dtype(), x.device());
  Tensor out = conv2d(x, kernel, Tensor(), conv);
  if (by_count) {
    // Each window's count of positions inside the input: the same convolution of ones.
    Tensor counts;
    {
      const Tensor ones = Tensor::Full({1, c, x.size(2), x.size(3)}, 1.0, x.dtype(), x.device());
      counts = conv2d(ones, kernel, Tensor(), conv);
    }
    out = div(out, counts);
  }
  return Unbatched(input, out);
}

Tensor adaptive_avg_pool2d(const Tensor& input, std::array<int64_t, 2> output_size) {
  const Tensor x = Batched("adaptive_avg_pool2d", input);
  for (int i = 0; i < 2; ++i) {
    GS_CHECK_ARG(output_size[i] >= 1, "adaptive_avg_pool2d: output_size must be positive, got ",
                 output_size[i]);
    GS_CHECK_ARG(x.size(2 + i) > 0, "adaptive_avg_pool2d: input with shape ",
                 ShapeToString(input.shape()), " has no ", i == 0 ? "rows" : "columns");
  }
  const Tensor rows = AveragingMatrix(output_size[0], x.size(2), x.dtype(), x.device());
  const Tensor cols = AveragingMatrix(output_size[1], x.size(3), x.dtype(), x.device());
  return Unbatched(input, matmul(matmul(rows, x), transpose(cols, 0, 1)));
}

}  // namespace gradserve::ops
