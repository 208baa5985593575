#include "engine/ops/conv_im2col.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "engine/autograd/node.h"
#include "engine/ops/nn_kernels.h"
#include "engine/ops/record.h"
#include "engine/ops/shape_common.h"

namespace gradserve::ops {
namespace {

// a / b rounded up, for a >= 0 and b > 0, without overflow.
int64_t CeilDiv(int64_t a, int64_t b) { return a / b + (a % b != 0); }

std::string PairString(const std::array<int64_t, 2>& p) {
  return absl::StrCat("(", p[0], ", ", p[1], ")");
}

// The output size along one spatial dim, or -1 if the dilated kernel does not fit. Padding and
// dilation come from clients, so the padded input's and the dilated kernel's sizes are
// computed with overflow checks: a size past int64 is INVALID_ARGUMENT.
int64_t OutputSize(int64_t in, int64_t kernel, int64_t stride, int64_t pad, int64_t dilation) {
  int64_t span = 0, padded = 0;
  GS_CHECK_ARG(!__builtin_mul_overflow(dilation, kernel - 1, &span) &&
                   !__builtin_add_overflow(span, 1, &span) &&
                   !__builtin_mul_overflow(pad, 2, &padded) &&
                   !__builtin_add_overflow(padded, in, &padded),
               "conv2d: padding ", pad, " or dilation ", dilation,
               " is too large: the padded input (", in, " + 2 * ", pad, ") or the dilated kernel (",
               dilation, " * (", kernel, " - 1) + 1) does not fit in int64");
  if (padded < span) return -1;
  return (padded - span) / stride + 1;
}

// Runs fn(cols_row, image_row_or_null, ow_begin, ow_end, w_start, width) for every (row of
// cols, output row oh): the output positions ow in [ow_begin, ow_end) of the width positions at
// cols_row read image_row[w_start + ow * sW]; the others (and the whole row when image_row is
// null) fall in the padding. The one walk im2col and col2im share. The work is counted in
// meter (Note [Stopping a running op]); an output row longer than a block is walked in windows
// of positions, each one call of fn.
template <typename T, typename Fn>
void ForEachColsRow(T* image, T* cols, const ConvGeometry& g, WorkMeter& meter, Fn&& fn) {
  const auto& o = g.options;
  const int64_t positions = g.positions();
  for (int64_t c = 0; c < g.channels; ++c) {
    for (int64_t i = 0; i < g.kernel_h; ++i) {
      for (int64_t j = 0; j < g.kernel_w; ++j) {
        T* row = cols + ((c * g.kernel_h + i) * g.kernel_w + j) * positions;
        const int64_t w_start = j * o.dilation[1] - o.padding[1];
        // ow is inside the image when 0 <= w_start + ow * sW < W. (CeilDiv, not
        // (a + sW - 1) / sW: a client's stride may be near int64's end.)
        const int64_t ow_begin =
            w_start >= 0 ? 0 : std::min(g.out_w, CeilDiv(-w_start, o.stride[1]));
        const int64_t ow_end =
            w_start >= g.width
                ? ow_begin
                : std::max(ow_begin, std::min(g.out_w, CeilDiv(g.width - w_start, o.stride[1])));
        for (int64_t oh = 0; oh < g.out_h; ++oh) {
          const int64_t h = oh * o.stride[0] - o.padding[0] + i * o.dilation[0];
          T* image_row = (h >= 0 && h < g.height) ? image + (c * g.height + h) * g.width : nullptr;
          T* out_row = row + oh * g.out_w;
          // Positions [w0, w1) of the row; w0 * sW stays below the padded width.
          ForEachBlock(g.out_w, meter, [&](int64_t w0, int64_t w1) {
            const int64_t begin = std::clamp(ow_begin - w0, int64_t{0}, w1 - w0);
            const int64_t end = std::clamp(ow_end - w0, begin, w1 - w0);
            fn(out_row + w0, image_row, begin, end, w_start + w0 * o.stride[1], w1 - w0);
          });
        }
      }
    }
  }
}

// --- The differentiable pair. ---

class Im2ColBackward final : public autograd::Node {
 public:
  explicit Im2ColBackward(const ConvGeometry& g) : g_(g) {}
  TensorList apply(TensorList&& grads) override {
    if (grads.empty() || !grads[0].defined()) return {Tensor()};
    return {Col2Im(grads[0], g_)};
  }
  std::string name() const override { return "Im2ColBackward0"; }

 private:
  const ConvGeometry g_;
};

class Col2ImBackward final : public autograd::Node {
 public:
  explicit Col2ImBackward(const ConvGeometry& g) : g_(g) {}
  TensorList apply(TensorList&& grads) override {
    if (grads.empty() || !grads[0].defined()) return {Tensor()};
    return {Im2Col(grads[0], g_)};
  }
  std::string name() const override { return "Col2ImBackward0"; }

 private:
  const ConvGeometry g_;
};

}  // namespace

ConvGeometry MakeConvGeometry(absl::Span<const int64_t> input_shape,
                              absl::Span<const int64_t> weight_shape,
                              const Conv2dOptions& options) {
  GS_CHECK_ARG(input_shape.size() == 4, "conv2d: input must be [N, C, H, W] or [C, H, W], got ",
               ShapeToString(input_shape));
  GS_CHECK_ARG(weight_shape.size() == 4, "conv2d: weight must be [out_channels, in_channels / ",
               "groups, kH, kW], got ", ShapeToString(weight_shape));
  const auto& o = options;
  GS_CHECK_ARG(o.stride[0] > 0 && o.stride[1] > 0, "conv2d: stride ", PairString(o.stride),
               " must be positive");
  GS_CHECK_ARG(o.dilation[0] > 0 && o.dilation[1] > 0, "conv2d: dilation ", PairString(o.dilation),
               " must be positive");
  GS_CHECK_ARG(o.padding[0] >= 0 && o.padding[1] >= 0, "conv2d: padding ", PairString(o.padding),
               " must be non-negative");
  GS_CHECK_ARG(o.groups > 0, "conv2d: groups = ", o.groups, " must be positive");
  ConvGeometry g;
  g.options = options;
  g.batch = input_shape[0];
  g.channels = input_shape[1];
  g.height = input_shape[2];
  g.width = input_shape[3];
  g.out_channels = weight_shape[0];
  g.kernel_h = weight_shape[2];
  g.kernel_w = weight_shape[3];
  // in_channels / groups may be 0 (Note [conv2d over zero channels] in nn.cc).
  GS_CHECK_ARG(g.kernel_h > 0 && g.kernel_w > 0, "conv2d: weight with shape ",
               ShapeToString(weight_shape), " must have positive kernel sizes");
  GS_CHECK_ARG(g.out_channels % o.groups == 0, "conv2d: out_channels = ", g.out_channels,
               " (weight shape ", ShapeToString(weight_shape),
               ") is not divisible by groups = ", o.groups);
  int64_t expected = 0;  // a client's groups may be near int64's end
  const bool too_many = __builtin_mul_overflow(weight_shape[1], o.groups, &expected);
  GS_CHECK_ARG(!too_many && g.channels == expected, "conv2d: input with shape ",
               ShapeToString(input_shape), " has ", g.channels, " channels, but weight with shape ",
               ShapeToString(weight_shape), " and groups = ", o.groups, " expects ",
               too_many ? std::string("more than int64 counts") : absl::StrCat(expected));
  // PyTorch's check: an empty output channel count is refused, not convolved.
  GS_CHECK_ARG(g.out_channels >= o.groups, "conv2d: weight with shape ",
               ShapeToString(weight_shape), " has out_channels = ", g.out_channels,
               ", fewer than groups = ", o.groups, " (at least one per group)");
  g.out_h = OutputSize(g.height, g.kernel_h, o.stride[0], o.padding[0], o.dilation[0]);
  g.out_w = OutputSize(g.width, g.kernel_w, o.stride[1], o.padding[1], o.dilation[1]);
  GS_CHECK_ARG(g.out_h > 0 && g.out_w > 0, "conv2d: input with shape ", ShapeToString(input_shape),
               " padded by ", PairString(o.padding), " is smaller than the kernel (", g.kernel_h,
               ", ", g.kernel_w, ") dilated by ", PairString(o.dilation));
  // cols_shape() multiplies these unchecked: each partial product must fit (all are positive,
  // so the whole one fitting is enough); then the batch's cols as a whole.
  ValueOrThrow(CheckedNumel({g.channels, g.kernel_h, g.kernel_w, g.out_h, g.out_w}));
  ValueOrThrow(CheckedNumel(g.cols_shape()));
  return g;
}

template <typename T>
void Im2ColImage(const T* image, const ConvGeometry& g, T* cols, WorkMeter& meter) {
  const int64_t sw = g.options.stride[1];
  ForEachColsRow(
      const_cast<T*>(image), cols, g, meter,
      [&](T* out, const T* in, int64_t begin, int64_t end, int64_t w_start, int64_t width) {
        if (in == nullptr) {
          std::fill(out, out + width, T(0));
          return;
        }
        std::fill(out, out + begin, T(0));
        for (int64_t ow = begin; ow < end; ++ow) out[ow] = in[w_start + ow * sw];
        std::fill(out + end, out + width, T(0));
      });
}

template <typename T>
void Col2ImAddImage(const T* cols, const ConvGeometry& g, T* image, WorkMeter& meter) {
  const int64_t sw = g.options.stride[1];
  ForEachColsRow(image, const_cast<T*>(cols), g, meter,
                 [&](const T* from, T* to, int64_t begin, int64_t end, int64_t w_start, int64_t) {
                   if (to == nullptr) return;
                   for (int64_t ow = begin; ow < end; ++ow) to[w_start + ow * sw] += from[ow];
                 });
}

template void Im2ColImage<float>(const float*, const ConvGeometry&, float*, WorkMeter&);
template void Im2ColImage<double>(const double*, const ConvGeometry&, double*, WorkMeter&);
template void Col2ImAddImage<float>(const float*, const ConvGeometry&, float*, WorkMeter&);
template void Col2ImAddImage<double>(const double*, const ConvGeometry&, double*, WorkMeter&);

namespace {

void Im2ColCpu(const Tensor& x, const ConvGeometry& g, const Tensor& cols) {
  const int64_t image_size = g.channels * g.height * g.width;
  const int64_t cols_size = g.channels * g.kernel_h * g.kernel_w * g.positions();
  DispatchFloating(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    WorkMeter meter;
    for (int64_t n = 0; n < g.batch; ++n) {
      Im2ColImage(x.data<T>() + n * image_size, g, cols.data<T>() + n * cols_size, meter);
    }
  });
}

void Col2ImCpu(const Tensor& cols, const ConvGeometry& g, const Tensor& image) {
  const int64_t image_size = g.channels * g.height * g.width;
  const int64_t cols_size = g.channels * g.kernel_h * g.kernel_w * g.positions();
  DispatchFloating(cols.dtype(), [&](auto tag) {
    using T = decltype(tag);
    WorkMeter meter;
    for (int64_t n = 0; n < g.batch; ++n) {
      Col2ImAddImage(cols.data<T>() + n * cols_size, g, image.data<T>() + n * image_size, meter);
    }
  });
}

}  // namespace

KernelStub<Im2ColFn> im2col_stub("im2col", Im2ColCpu);
KernelStub<Col2ImFn> col2im_stub("col2im", Col2ImCpu);

Tensor Im2Col(const Tensor& input, const ConvGeometry& g) {
  RequireFloating("im2col", "input", input);
  GS_CHECK_INTERNAL(input.shape() == g.input_shape(), "im2col: input does not fit the geometry");
  const Tensor x = input.contiguous();
  Tensor out = Tensor::Empty(g.cols_shape(), input.dtype(), input.device());
  if (out.numel() > 0) im2col_stub(out.device(), x, g, out);
  RecordIfNeeded(out, {input}, [&] { return autograd::MakeNode<Im2ColBackward>(g); });
  return out;
}

Tensor Col2Im(const Tensor& cols, const ConvGeometry& g) {
  RequireFloating("col2im", "cols", cols);
  GS_CHECK_INTERNAL(cols.shape() == g.cols_shape(), "col2im: cols do not fit the geometry");
  const Tensor c = cols.contiguous();
  Tensor out = Tensor::Zeros(g.input_shape(), cols.dtype(), cols.device());
  if (c.numel() > 0) col2im_stub(out.device(), c, g, out);
  RecordIfNeeded(out, {cols}, [&] { return autograd::MakeNode<Col2ImBackward>(g); });
  return out;
}

namespace {

// One BLAS call: C = alpha * op(A) @ op(B) + beta * C for m, n, k > 0.
template <typename T>
void BlasGemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, T alpha,
              const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  const CBLAS_TRANSPOSE ta = transpose_a ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = transpose_b ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  } else {
    cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

// A tile's side: x (>= 1) capped at size, and rounded down to a multiple of 16 when that
// leaves a remainder and x is at least 32 (whole micro-kernel blocks).
int64_t TileSide(int64_t x, int64_t size) {
  if (x >= size) return size;
  return x >= 32 ? x / 16 * 16 : x;
}

}  // namespace

template <typename T>
void Gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc, WorkMeter& meter) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == T(0) ? T(0) : beta * c[i * ldc + j];
      meter.Add(n);
    }
    return;
  }
  const double macs = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  if (macs <= static_cast<double>(kGemmTileMacs)) {
    BlasGemm(transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    meter.Add(1 + static_cast<int64_t>(macs) / kGemmMacsPerUnit);
    return;
  }
  // Note [Matrix products in tiles]: tiles of bm x bn elements of C over bk of the inner dim.
  const int64_t bk = std::min(k, kGemmMaxInner);
  const int64_t cells = kGemmTileMacs / bk;  // >= 256
  const int64_t side = static_cast<int64_t>(std::sqrt(static_cast<double>(cells)));
  int64_t bm, bn;
  if (m <= side) {
    bm = m;
    bn = TileSide(cells / m, n);
  } else if (n <= side) {
    bn = n;
    bm = TileSide(cells / n, m);
  } else {
    bm = TileSide(side, m);
    bn = TileSide(side, n);
  }
  // Element (i, p) of op(A) and (p, j) of op(B) as stored.
  auto at_a = [&](int64_t i, int64_t p) { return transpose_a ? a + p * lda + i : a + i * lda + p; };
  auto at_b = [&](int64_t p, int64_t j) { return transpose_b ? b + j * ldb + p : b + p * ldb + j; };
  for (int64_t i = 0; i < m; i += bm) {
    const int64_t rows = std::min(bm, m - i);
    for (int64_t j = 0; j < n; j += bn) {
      const int64_t cols = std::min(bn, n - j);
      for (int64_t p = 0; p < k; p += bk) {
        const int64_t inner = std::min(bk, k - p);
        BlasGemm(transpose_a, transpose_b, rows, cols, inner, alpha, at_a(i, p), lda, at_b(p, j),
                 ldb, p == 0 ? beta : T(1), c + i * ldc + j, ldc);
        meter.Add(1 + rows * cols * inner / kGemmMacsPerUnit);
      }
    }
  }
}

template void Gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t,
                          const float*, int64_t, float, float*, int64_t, WorkMeter&);
template void Gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t,
                           const double*, int64_t, double, double*, int64_t, WorkMeter&);

}  // namespace gradserve::ops
