// The pieces conv2d (nn.cc) is built from: its geometry, im2col and its adjoint col2im (raw
// kernels for one image, and differentiable ops over a batch), and a row-major gemm on OpenBLAS.
//
// Note [conv2d as im2col]
// im2col lays the receptive field of each output position of one image [C, H, W] out as a
// column: cols[(c * kH + i) * kW + j][oh * oW + ow] = x[c][oh * sH - pH + i * dH][ow * sW - pW +
// j * dW], or 0 where that falls in the padding. The rows of group g are then the contiguous
// block [g * C/G * kH * kW, (g + 1) * C/G * kH * kW), so the convolution of group g is one gemm:
// out[g * O/G : (g + 1) * O/G] = weight_g [O/G, C/G * kH * kW] @ cols_g. col2im sums columns back
// into an image; it is im2col's adjoint, so each is the other's backward.
//
// Errors: MakeConvGeometry throws StatusError(INVALID_ARGUMENT) naming the argument and shapes;
// the kernels trust a geometry it made. Thread safety: stateless.

#ifndef GRADSERVE_ENGINE_OPS_CONV_IM2COL_H_
#define GRADSERVE_ENGINE_OPS_CONV_IM2COL_H_

#include <cstdint>

#include "engine/ops/nn.h"
#include "engine/tensor/tensor.h"
#include "engine/util/cancellation.h"

namespace gradserve::ops {

// The sizes of one conv2d call (batched layout).
struct ConvGeometry {
  int64_t batch = 0, channels = 0, height = 0, width = 0;  // input [N, C, H, W]
  int64_t out_channels = 0, kernel_h = 0, kernel_w = 0;    // weight [O, C/G, kH, kW]
  int64_t out_h = 0, out_w = 0;
  Conv2dOptions options;

  int64_t groups() const { return options.groups; }
  // Rows of cols for one group: C/G * kH * kW.
  int64_t group_rows() const { return channels / options.groups * kernel_h * kernel_w; }
  // Columns of cols: output positions per image.
  int64_t positions() const { return out_h * out_w; }
  Shape input_shape() const { return {batch, channels, height, width}; }
  Shape cols_shape() const { return {batch, channels * kernel_h * kernel_w, positions()}; }
};

// Checks a batched input [N, C, H, W] against weight [O, C/G, kH, kW] and the options (strides
// and dilations positive, padding non-negative, groups dividing C and O, O at least groups, C
// possibly 0, an output of at least one position per dim) and returns the geometry.
ConvGeometry MakeConvGeometry(absl::Span<const int64_t> input_shape,
                              absl::Span<const int64_t> weight_shape, const Conv2dOptions& options);

// One image: image [C, H, W] contiguous to cols [C * kH * kW, oH * oW] contiguous (overwritten).
// The work is counted in meter, which may throw StatusError(CANCELLED or DEADLINE_EXCEEDED)
// between blocks (Note [Stopping a running op] in engine/util/cancellation.h).
template <typename T>
void Im2ColImage(const T* image, const ConvGeometry& g, T* cols, WorkMeter& meter);
// One image: adds cols [C * kH * kW, oH * oW] into image [C, H, W] (both contiguous); meter as
// Im2ColImage's.
template <typename T>
void Col2ImAddImage(const T* cols, const ConvGeometry& g, T* image, WorkMeter& meter);

// im2col over a batch: input [N, C, H, W] (floating) to [N, C * kH * kW, oH * oW]. Records
// Im2ColBackward0 (whose backward is Col2Im), so conv2d's backward formula can be
// differentiated.
Tensor Im2Col(const Tensor& input, const ConvGeometry& g);
// col2im over a batch: cols [N, C * kH * kW, oH * oW] summed into zeros [N, C, H, W]. Records
// Col2ImBackward0 (whose backward is Im2Col).
Tensor Col2Im(const Tensor& cols, const ConvGeometry& g);

// Note [Matrix products in tiles]
// One BLAS call of a client's sizes may run for seconds (a 6144^3 float product: about 7 s on
// two cores), and OpenBLAS cannot be stopped inside a call. So Gemm makes a product of more
// than kGemmTileMacs multiply-adds as several calls, each computing one tile of C (a block of
// rows and columns, over the whole inner dimension), and counts each in the caller's WorkMeter,
// which checks the current cancellation token between tiles (Note [Stopping a running op] in
// engine/util/cancellation.h). A tile of 2^28 multiply-adds is some 5 to 30 ms of float or
// double work on this host, and at least about 128 by 128 elements of C wherever k allows, so
// the packing OpenBLAS repeats per call costs about 1% more. Every element of C is still
// summed by one call over the whole of k, in the order OpenBLAS sums it; only when k alone
// passes kGemmMaxInner (a product no tile of 16 by 16 keeps small) is k split too, the later
// parts added with beta = 1. Products up to a tile (the mlp benchmark's 256 x 1024 x 1024
// included) are one call, as before.
inline constexpr int64_t kGemmTileMacs = int64_t{1} << 28;
inline constexpr int64_t kGemmMaxInner = kGemmTileMacs / (16 * 16);
// WorkMeter units per multiply-add of a BLAS call: a tile of kGemmTileMacs is one check's
// worth (kWorkPerCheck), and even the smallest call counts one unit.
inline constexpr int64_t kGemmMacsPerUnit = kGemmTileMacs / kWorkPerCheck;

// Row-major C = alpha * op(A) @ op(B) + beta * C, op transposing when asked: op(A) is [m, k],
// op(B) [k, n], C [m, n]; ld* are the row strides of A, B and C as stored. Empty products are
// handled (C = beta * C). float and double only. The work is counted in meter, which checks the
// current cancellation token between tiles of a big product (Note [Matrix products in
// tiles]): throws StatusError(CANCELLED or DEADLINE_EXCEEDED) with C partly written.
template <typename T>
void Gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc, WorkMeter& meter);

}  // namespace gradserve::ops

#endif  // GRADSERVE_ENGINE_OPS_CONV_IM2COL_H_
