// The GPU kernels of the nn, linalg and conv ops (engine/ops/cuda/nn_kernels.cu,
// linalg_kernels.cu) against the CPU's, in float32 and float64. Skips without a GPU.
#include <cmath>
#include <random>
#include <vector>

#include "engine/device/cuda_devices.h"
#include "engine/ops/conv_im2col.h"
#include "engine/ops/linalg.h"
#include "engine/ops/nn.h"
#include "engine/ops/nn_kernels.h"
#include "engine/tensor/tensor.h"
#include "gtest/gtest.h"
#include "tests/engine/cuda_test_util.h"

namespace gradserve {
namespace {
using namespace ops;

Device Gpu() { return testing::kGpu; }

Tensor Rand(std::vector<int64_t> shape, DType dt, int seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> d;
  int64_t n = 1;
  for (auto s : shape) n *= s;
  std::vector<double> v(n);
  for (auto& x : v) x = d(gen);
  return Tensor::FromVector<double>(v, shape).To(dt);
}

void Near(const Tensor& cpu, const Tensor& gpu, const char* what) {
  ASSERT_EQ(cpu.shape(), gpu.shape()) << what;
  EXPECT_EQ(gpu.device().type, DeviceType::kCUDA) << what;
  auto a = testing::HostValues(cpu), b = testing::HostValues(gpu);
  const double tol = cpu.dtype() == DType::kFloat32 ? 2e-5 : 1e-11;
  int bad = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (!(std::abs(a[i] - b[i]) <= tol * std::max(1.0, std::abs(a[i])))) {
      if (bad++ < 5) ADD_FAILURE() << what << " [" << i << "] cpu " << a[i] << " gpu " << b[i];
    }
  }
}

Tensor G(const Tensor& t) { return t.To(Gpu()); }
Tensor GZeros(std::vector<int64_t> shape, DType dt) { return Tensor::Zeros(shape, dt).To(Gpu()); }

class GpuNn : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    const std::string why = testing::GpuUnavailable();
    if (!why.empty()) GTEST_SKIP() << "no GPU: " << why;
  }
};

TEST_P(GpuNn, Matmul) {
  const DType dt = GetParam();
  struct Case {
    std::vector<int64_t> a, b;
  };
  for (const Case& c : std::vector<Case>{{{4, 5}, {5, 6}},
                                         {{3, 4, 5}, {5, 6}},
                                         {{2, 1, 4, 5}, {3, 5, 7}},
                                         {{5}, {5, 6}},
                                         {{4, 5}, {5}},
                                         {{5}, {5}},
                                         {{1, 5}, {5, 1}},
                                         {{65, 130}, {130, 33}}}) {
    Tensor a = Rand(c.a, dt, 1), b = Rand(c.b, dt, 2);
    Near(matmul(a, b), matmul(G(a), G(b)), "matmul");
  }
  // Transposed (column-major) and sliced views.
  Tensor a = Rand({6, 4}, dt, 3), b = Rand({7, 6}, dt, 4);
  Tensor at = a.AsStrided({4, 6}, {1, 4}, 0), bt = b.AsStrided({6, 7}, {1, 6}, 0);
  Tensor gat = G(a).AsStrided({4, 6}, {1, 4}, 0), gbt = G(b).AsStrided({6, 7}, {1, 6}, 0);
  Near(matmul(at, bt), matmul(gat, gbt), "matmul transposed");
  Tensor big = Rand({3, 8, 10}, dt, 5);
  Tensor sl = big.AsStrided({3, 4, 5}, {80, 10, 1}, 2);
  Tensor gsl = G(big).AsStrided({3, 4, 5}, {80, 10, 1}, 2);
  Tensor r = Rand({5, 2}, dt, 6);
  Near(matmul(sl, r), matmul(gsl, G(r)), "matmul sliced");
  // beta_one through the stub.
  Tensor x = Rand({3, 4}, dt, 7), y = Rand({4, 5}, dt, 8), c0 = Rand({3, 5}, dt, 9);
  Tensor cc = c0.Clone(), gc = G(c0);
  Tensor gx = G(x), gy = G(y);
  GemmBatch args;
  args.dtype = dt;
  args.m = 3;
  args.n = 5;
  args.k = 4;
  args.lda = 4;
  args.ldb = 5;
  args.ldc = 5;
  args.beta_one = true;
  args.a = x.raw_data();
  args.b = y.raw_data();
  args.c = cc.raw_data();
  gemm_batch_stub(kCPU, args);
  args.device_index = 0;
  args.a = gx.raw_data();
  args.b = gy.raw_data();
  args.c = gc.raw_data();
  gemm_batch_stub(Gpu(), args);
  Near(cc, gc, "gemm beta_one");
}

TEST_P(GpuNn, Softmax) {
  const DType dt = GetParam();
  for (auto shape : std::vector<std::vector<int64_t>>{{4, 7, 5}, {3, 300}, {2, 1000}, {5}}) {
    Tensor x = Rand(shape, dt, 11);
    for (int64_t dim : {int64_t{0}, int64_t(shape.size() - 1)}) {
      for (bool log : {false, true}) {
        Tensor y = log ? log_softmax(x, dim) : softmax(x, dim);
        Tensor gy = log ? log_softmax(G(x), dim) : softmax(G(x), dim);
        Near(y, gy, "softmax");
        Tensor g = Rand(shape, dt, 12);
        DimSplit s{1, shape[dim], 1};
        for (int64_t d = 0; d < dim; ++d) s.outer *= shape[d];
        for (size_t d = dim + 1; d < shape.size(); ++d) s.inner *= shape[d];
        Tensor gx = Tensor::Empty(shape, dt), ggx = Tensor::Empty(shape, dt, Gpu());
        softmax_backward_stub(kCPU, y, g, gx, s, log);
        softmax_backward_stub(Gpu(), G(y), G(g), ggx, s, log);
        Near(gx, ggx, "softmax backward");
      }
    }
  }
}

TEST_P(GpuNn, LayerNorm) {
  const DType dt = GetParam();
  const int64_t rows = 6, cols = 517;
  Tensor x = Rand({rows, cols}, dt, 21), w = Rand({cols}, dt, 22), b = Rand({cols}, dt, 23);
  const int64_t ns[] = {cols};
  Near(layer_norm(x, ns, w, b), layer_norm(G(x), ns, G(w), G(b)), "layer_norm");
  Near(layer_norm(x, ns), layer_norm(G(x), ns), "layer_norm no affine");
  // The statistics are float64 whatever dt (Note [layer_norm's statistics in float64]).
  const DType f64 = DType::kFloat64;
  Tensor y = Tensor::Empty({rows, cols}, dt), m = Tensor::Empty({rows}, f64),
         r = Tensor::Empty({rows}, f64);
  layer_norm_stub(kCPU, x, w, b, rows, cols, 1e-5, y, m, r);
  Tensor gy = Tensor::Empty({rows, cols}, dt, Gpu()), gm = Tensor::Empty({rows}, f64, Gpu()),
         gr = Tensor::Empty({rows}, f64, Gpu());
  layer_norm_stub(Gpu(), G(x), G(w), G(b), rows, cols, 1e-5, gy, gm, gr);
  Near(m, gm, "mean");
  Near(r, gr, "rstd");
  Tensor g = Rand({rows, cols}, dt, 24);
  Tensor gx = Tensor::Empty({rows, cols}, dt), gw = Tensor::Zeros({cols}, dt),
         gb = Tensor::Zeros({cols}, dt);
  layer_norm_backward_stub(kCPU, x, g, w, m, r, rows, cols, gx, gw, gb);
  Tensor ggx = Tensor::Empty({rows, cols}, dt, Gpu()), ggw = GZeros({cols}, dt),
         ggb = GZeros({cols}, dt);
  layer_norm_backward_stub(Gpu(), G(x), G(g), G(w), G(m), G(r), rows, cols, ggx, ggw, ggb);
  Near(gx, ggx, "ln gx");
  Near(gw, ggw, "ln gw");
  Near(gb, ggb, "ln gb");
}

TEST_P(GpuNn, Losses) {
  const DType dt = GetParam();
  Tensor x = log_softmax(Rand({5, 4, 3}, dt, 31), 1);
  Tensor t =
      Tensor::FromVector<int64_t>({0, 1, 2, 3, -100, 1, 2, 0, 3, 3, 1, -100, 0, 0, 2}, {5, 3});
  for (Reduction red : {Reduction::kNone, Reduction::kSum, Reduction::kMean}) {
    Near(nll_loss(x, t, red), nll_loss(G(x), G(t), red), "nll_loss");
    Near(cross_entropy(x, t, red, -100, 0.0), cross_entropy(G(x), G(t), red, -100, 0.0), "ce");
    Tensor w = Rand({4}, dt, 38);  // class weights
    Near(nll_loss(x, t, red, -100, w), nll_loss(G(x), G(t), red, -100, G(w)), "weighted nll_loss");
    Near(cross_entropy(x, t, red, -100, 0.1, w), cross_entropy(G(x), G(t), red, -100, 0.1, G(w)),
         "weighted, smoothed ce");
    Tensor probs = softmax(Rand({5, 4, 3}, dt, 39), 1);  // class probabilities
    Near(cross_entropy(x, probs, red, -100, 0.1, w),
         cross_entropy(G(x), G(probs), red, -100, 0.1, G(w)), "ce with probabilities");
    Tensor a = Rand({7, 9}, dt, 32), b = Rand({7, 9}, dt, 33);
    Near(mse_loss(a, b, red), mse_loss(G(a), G(b), red), "mse_loss");
  }
  Tensor all_ignored = Tensor::FromVector<int64_t>({-100, -100, -100}, {3});
  Tensor x2 = Rand({3, 4}, dt, 34);
  Near(nll_loss(x2, all_ignored), nll_loss(G(x2), G(all_ignored)), "nll mean of none");
  Tensor a = Rand({7, 9}, dt, 35), b = Rand({7, 9}, dt, 36), g = Rand({7, 9}, dt, 37);
  Tensor gx = Tensor::Empty({7, 9}, dt), ggx = Tensor::Empty({7, 9}, dt, Gpu());
  mse_loss_backward_stub(kCPU, a, b, g, 2.0 / 63, true, gx);
  mse_loss_backward_stub(Gpu(), G(a), G(b), G(g), 2.0 / 63, true, ggx);
  Near(gx, ggx, "mse backward");
}

TEST_P(GpuNn, Conv) {
  const DType dt = GetParam();
  struct Case {
    std::vector<int64_t> x, w;
    Conv2dOptions o;
    bool bias;
  };
  Conv2dOptions strided;
  strided.stride = {2, 1};
  strided.padding = {1, 2};
  strided.dilation = {1, 2};
  Conv2dOptions grouped;
  grouped.groups = 2;
  grouped.padding = {1, 1};
  for (const Case& c : std::vector<Case>{{{2, 3, 7, 8}, {4, 3, 3, 3}, {}, true},
                                         {{2, 3, 9, 8}, {5, 3, 3, 2}, strided, false},
                                         {{3, 4, 6, 5}, {6, 2, 3, 3}, grouped, true}}) {
    Tensor x = Rand(c.x, dt, 41), w = Rand(c.w, dt, 42);
    Tensor b = c.bias ? Rand({c.w[0]}, dt, 43) : Tensor();
    Tensor y = conv2d(x, w, b, c.o);
    Near(y, conv2d(G(x), G(w), c.bias ? G(b) : Tensor(), c.o), "conv2d");
    const ConvGeometry g = MakeConvGeometry(x.shape(), w.shape(), c.o);
    Near(Im2Col(x, g), Im2Col(G(x), g), "im2col");
    Tensor grad = Rand(std::vector<int64_t>(y.shape().begin(), y.shape().end()), dt, 44);
    Tensor gx = Tensor::Zeros(c.x, dt), gw = Tensor::Zeros(c.w, dt),
           gb = Tensor::Zeros({c.w[0]}, dt);
    conv2d_backward_stub(kCPU, x, w, grad, g, gx, gw, gb);
    Tensor ggx = GZeros(c.x, dt), ggw = GZeros(c.w, dt), ggb = GZeros({c.w[0]}, dt);
    conv2d_backward_stub(Gpu(), G(x), G(w), G(grad), g, ggx, ggw, ggb);
    Near(gx, ggx, "conv gx");
    Near(gw, ggw, "conv gw");
    Near(gb, ggb, "conv gb");
    Tensor cols = Im2Col(x, g);
    Tensor img = Tensor::Zeros(c.x, dt), gimg = GZeros(c.x, dt);
    col2im_stub(kCPU, cols, g, img);
    col2im_stub(Gpu(), G(cols), g, gimg);
    Near(img, gimg, "col2im");
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuNn, ::testing::Values(DType::kFloat32, DType::kFloat64));

}  // namespace
}  // namespace gradserve
