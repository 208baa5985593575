// The Engine's basic kernels (fill, copies, accumulation, NaN check) and the shape and index
// ops on cuda:0 against the CPU, including the messages for bad indices. Skips without a GPU.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/device/cuda_devices.h"
#include "engine/kernels/basic_kernels.h"
#include "engine/ops/nn.h"
#include "engine/ops/shape.h"
#include "engine/tensor/tensor.h"
#include "engine/util/status_error.h"
#include "gtest/gtest.h"
#include "tests/engine/cuda_test_util.h"

namespace gradserve {
namespace {

int failures = 0;
constexpr Device G = testing::kGpu;

void Same(const char* what, const Tensor& gpu, const Tensor& cpu, double tol = 1e-6) {
  bool ok = gpu.device() == G && gpu.shape() == cpu.shape() && gpu.dtype() == cpu.dtype();
  auto a = testing::HostValues(gpu), b = testing::HostValues(cpu);
  if (ok) {
    for (size_t i = 0; i < a.size(); ++i) {
      if (!(std::fabs(a[i] - b[i]) <= tol || (std::isnan(a[i]) && std::isnan(b[i])))) {
        ok = false;
        std::printf("  %s [%zu]: gpu %g cpu %g\n", what, i, a[i], b[i]);
        break;
      }
    }
  }
  std::printf("%s %s (%s vs %s)\n", ok ? "OK  " : "FAIL", what, gpu.DebugString().c_str(),
              cpu.DebugString().c_str());
  if (!ok) ++failures;
}
void Check(const char* what, bool ok) {
  std::printf("%s %s\n", ok ? "OK  " : "FAIL", what);
  if (!ok) ++failures;
}
template <typename F>
void Throws(const char* what, F f, const std::string& cpu_msg) {
  std::string msg = "<no error>";
  try {
    f();
  } catch (const StatusError& e) {
    msg = std::string(e.status().message());
  }
  const bool ok = msg == cpu_msg;
  std::printf("%s %s: %s\n", ok ? "OK  " : "FAIL", what, msg.c_str());
  if (!ok) {
    std::printf("   cpu: %s\n", cpu_msg.c_str());
    ++failures;
  }
}
template <typename F>
std::string Msg(F f) {
  try {
    f();
  } catch (const StatusError& e) {
    return std::string(e.status().message());
  }
  return "<no error>";
}

TEST(CudaShapeTest, BasicKernelsAndIndexOpsMatchTheCpu) {
  const std::string why = testing::GpuUnavailable();
  if (!why.empty()) GTEST_SKIP() << "no GPU: " << why;
  std::vector<double> v(24);
  for (int i = 0; i < 24; ++i) v[i] = i * 0.5 - 3;
  Tensor c = Tensor::FromVector(v, {2, 3, 4});
  Tensor g = c.To(G);
  Same("To(cuda)/To(cpu)", g, c);
  Same("Full f32", Tensor::Full({3, 5}, 2.5, DType::kFloat32, G),
       Tensor::Full({3, 5}, 2.5, DType::kFloat32));
  Same("Full bool", Tensor::Full({7}, 3, DType::kBool, G), Tensor::Full({7}, 3, DType::kBool));
  Same("Zeros i64", Tensor::Zeros({1000}, DType::kInt64, G), Tensor::Zeros({1000}, DType::kInt64));
  Check("Scalar item", Tensor::Scalar(4.25, DType::kFloat64, G).item() == 4.25);
  Check("item i64", Tensor::Scalar(-7, DType::kInt64, G).item() == -7);
  Same("transpose contiguous", ops::transpose(g, 0, 2).contiguous(),
       ops::transpose(c, 0, 2).contiguous());
  Same("transpose Clone", ops::transpose(g, 1, 2).Clone(), ops::transpose(c, 1, 2).Clone());
  Same("To(f32)", g.To(DType::kFloat32), c.To(DType::kFloat32));
  Same("To(i64)", g.To(DType::kInt64), c.To(DType::kInt64));
  Same("To(bool)", g.To(DType::kBool), c.To(DType::kBool));
  Same("strided To(cpu)", ops::transpose(g, 0, 1), ops::transpose(c, 0, 1));
  {  // host -> strided GPU dst, with dtype conversion
    Tensor dst = Tensor::Zeros({4, 3, 2}, DType::kFloat32, G);
    Tensor dstc = Tensor::Zeros({4, 3, 2}, DType::kFloat32);
    CopyInto(ops::transpose(dst, 0, 2), c);
    CopyInto(ops::transpose(dstc, 0, 2), c);
    Same("CopyInto cpu->strided gpu f64->f32", dst, dstc);
    Tensor hc = Tensor::Zeros({4, 3, 2}, DType::kInt64);
    Tensor hc2 = Tensor::Zeros({4, 3, 2}, DType::kInt64);
    CopyInto(ops::transpose(hc, 0, 2), g);
    CopyInto(ops::transpose(hc2, 0, 2), c);
    Check("CopyInto gpu->strided cpu f64->i64",
          testing::HostValues(hc) == testing::HostValues(hc2));
  }
  {
    Tensor a = g.Clone(), ac = c.Clone();
    AccumulateInto(a, g);
    AccumulateInto(ac, c);
    Same("AccumulateInto", a, ac);
    Tensor t = ops::transpose(g, 0, 2).Clone();
    Tensor tc = ops::transpose(c, 0, 2).Clone();
    AccumulateInto(ops::transpose(a, 0, 2), t);
    AccumulateInto(ops::transpose(ac, 0, 2), tc);
    Same("AccumulateInto strided", a, ac);
    Same("AddSameShape", AddSameShape(g, a), AddSameShape(c, ac));
    Same("AddSameShape strided", AddSameShape(ops::transpose(g, 0, 1), ops::transpose(a, 0, 1)),
         AddSameShape(ops::transpose(c, 0, 1), ops::transpose(ac, 0, 1)));
  }
  Check("HasNaN false", !HasNaN(g));
  {
    std::vector<float> big(100000, 1.0f);
    big[77777] = NAN;
    Check("HasNaN true big", HasNaN(Tensor::FromVector(big, {100, 1000}).To(G)));
    Check("HasNaN strided",
          HasNaN(ops::transpose(Tensor::FromVector(big, {100, 1000}).To(G), 0, 1)));
    std::vector<double> inf = {INFINITY, -INFINITY};
    Check("HasNaN inf false", !HasNaN(Tensor::FromVector(inf, {2}).To(G)));
    Check("HasNaN 0-d", HasNaN(Tensor::Scalar(NAN, DType::kFloat64, G)));
    Check("HasNaN empty", !HasNaN(Tensor::Zeros({0, 3}, DType::kFloat32, G)));
  }
  Tensor idx = Tensor::FromVector(std::vector<int64_t>{2, 0, 2, 1}, {4});
  Tensor gi = idx.To(G);
  for (int d = 0; d < 3; ++d) {
    Tensor id = Tensor::FromVector(std::vector<int64_t>{1, 0, 1}, {3});
    Same("index_select", ops::index_select(g, d, id.To(G)), ops::index_select(c, d, id));
    Same("index_select cpu index", ops::index_select(g, d, id), ops::index_select(c, d, id));
    Same("index_select strided in", ops::index_select(ops::transpose(g, 0, 2), d, id.To(G)),
         ops::index_select(ops::transpose(c, 0, 2), d, id));
  }
  Same("index_select i64", ops::index_select(g.To(DType::kInt64), 2, gi),
       ops::index_select(c.To(DType::kInt64), 2, idx));
  Same("IndexSelectSkipping", ops::IndexSelectSkipping(g, 2, gi, 2),
       ops::IndexSelectSkipping(c, 2, idx, 2));
  {
    Tensor src = Tensor::FromVector(std::vector<double>(2 * 3 * 4, 1.5), {2, 3, 4});
    Same("IndexAddIntoZeros", ops::IndexAddIntoZeros({2, 3, 3}, 2, gi, src.To(G)),
         ops::IndexAddIntoZeros({2, 3, 3}, 2, idx, src));
    Same("IndexAddIntoZeros skip",
         ops::IndexAddIntoZeros({2, 3, 3}, 2, gi, src.To(G).To(DType::kFloat32), 2),
         ops::IndexAddIntoZeros({2, 3, 3}, 2, idx, src.To(DType::kFloat32), 2));
    Tensor srcv = Tensor::FromVector(v, {4, 3, 2});
    Same("IndexAddIntoZeros dim0", ops::IndexAddIntoZeros({3, 3, 2}, 0, gi, srcv.To(G)),
         ops::IndexAddIntoZeros({3, 3, 2}, 0, idx, srcv));
  }
  {
    std::vector<int64_t> gv = {0, 1, 0, 2, 2, 1, 1, 0, 2, 0, 0, 1};
    Tensor gix = Tensor::FromVector(gv, {2, 3, 2});
    Same("gather dim2", ops::gather(g, 2, gix.To(G)), ops::gather(c, 2, gix));
    Same("gather dim1", ops::gather(g, 1, gix.To(G)), ops::gather(c, 1, gix));
    Same("gather strided", ops::gather(ops::transpose(g, 1, 2), 1, gix.To(G)),
         ops::gather(ops::transpose(c, 1, 2), 1, gix));
    Tensor s = Tensor::FromVector(std::vector<double>(12, 0.25), {2, 3, 2});
    Same("ScatterAddIntoZeros", ops::ScatterAddIntoZeros({2, 3, 4}, 2, gix.To(G), s.To(G)),
         ops::ScatterAddIntoZeros({2, 3, 4}, 2, gix, s));
    Same("ScatterAddIntoZeros dim1 f32",
         ops::ScatterAddIntoZeros({2, 3, 4}, 1, gix.To(G), s.To(G).To(DType::kFloat32)),
         ops::ScatterAddIntoZeros({2, 3, 4}, 1, gix, s.To(DType::kFloat32)));
    Tensor bad = Tensor::FromVector(std::vector<int64_t>{0, 1, 5, 0}, {2, 1, 2});
    Throws(
        "gather bad index", [&] { ops::gather(g, 2, bad.To(G)); },
        Msg([&] { ops::gather(c, 2, bad); }));
    Throws(
        "scatter_add bad index",
        [&] {
          ops::ScatterAddIntoZeros({2, 3, 4}, 1, bad.To(G),
                                   Tensor::Zeros({2, 1, 2}, DType::kFloat64, G));
        },
        Msg([&] {
          ops::ScatterAddIntoZeros({2, 3, 4}, 1, bad, Tensor::Zeros({2, 1, 2}, DType::kFloat64));
        }));
  }
  {
    Tensor bad = Tensor::FromVector(std::vector<int64_t>{0, -1}, {2});
    Throws(
        "index_select bad index", [&] { ops::index_select(g, 1, bad.To(G)); },
        Msg([&] { ops::index_select(c, 1, bad); }));
  }
  Same("cat dim1", ops::cat({g, ops::narrow(g, 1, 0, 2), g}, 1),
       ops::cat({c, ops::narrow(c, 1, 0, 2), c}, 1));
  Same("cat dim2 strided", ops::cat({ops::transpose(g, 0, 1), ops::transpose(g, 0, 1)}, 2),
       ops::cat({ops::transpose(c, 0, 1), ops::transpose(c, 0, 1)}, 2));
  Same("stack dim1", ops::stack({g, g, g}, 1), ops::stack({c, c, c}, 1));
  Same("stack dim3 i64", ops::stack({g.To(DType::kInt64), g.To(DType::kInt64)}, 3),
       ops::stack({c.To(DType::kInt64), c.To(DType::kInt64)}, 3));
  Same("PadAlongDim", ops::PadAlongDim(g, {2, 7, 4}, 1, 2), ops::PadAlongDim(c, {2, 7, 4}, 1, 2));
  Same("reshape copy", ops::reshape(ops::transpose(g, 0, 2), {-1}),
       ops::reshape(ops::transpose(c, 0, 2), {-1}));
  {
    Tensor w = Tensor::FromVector(v, {6, 4});
    Tensor ids = Tensor::FromVector(std::vector<int64_t>{5, 0, 3, 3}, {2, 2});
    Same("embedding", ops::embedding(w.To(G), ids.To(G), std::nullopt),
         ops::embedding(w, ids, std::nullopt));
    Throws(
        "embedding bad",
        [&] {
          ops::embedding(w.To(G), Tensor::FromVector(std::vector<int64_t>{6}, {1}).To(G),
                         std::nullopt);
        },
        Msg([&] {
          ops::embedding(w, Tensor::FromVector(std::vector<int64_t>{6}, {1}), std::nullopt);
        }));
  }
  {  // big index_add with many repeats (atomics)
    const int64_t rows = 1000, cols = 256, n = 20000;
    std::vector<int64_t> iv(n);
    for (int64_t i = 0; i < n; ++i) iv[i] = (i * 7919) % rows;
    Tensor ix = Tensor::FromVector(iv, {n});
    Tensor src = Tensor::Full({n, cols}, 0.5, DType::kFloat32);
    Same("IndexAddIntoZeros big", ops::IndexAddIntoZeros({rows, cols}, 0, ix.To(G), src.To(G)),
         ops::IndexAddIntoZeros({rows, cols}, 0, ix, src), 1e-3);
    Same("index_select big", ops::index_select(src.To(G), 0, ix.To(G)),
         ops::index_select(src, 0, ix));
  }
  EXPECT_EQ(failures, 0) << "see the FAIL lines above";
}

}  // namespace
}  // namespace gradserve
