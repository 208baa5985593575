// Every op of elementwise.cc and reductions.cc on cuda:0 against the CPU, forward and backward
// (the fused formulas), with broadcast and strided inputs, int64, NaN and ties. Skips without
// a GPU.
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "engine/autograd/autograd.h"
#include "engine/device/cuda_devices.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/reductions.h"
#include "engine/tensor/tensor.h"
#include "gtest/gtest.h"
#include "tests/engine/cuda_test_util.h"

namespace gradserve::ops {
namespace {

using testing::kGpu;
int failures = 0, passes = 0;

Tensor Rand(std::vector<int64_t> shape, double lo, double hi, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  int64_t n = 1;
  for (auto s : shape) n *= s;
  std::vector<double> v(n);
  for (auto& x : v) x = dist(gen);
  if (n > 2) v[1] = 0;  // an exact zero, for the masks
  return Tensor::FromVector<double>(v, shape);
}

void Compare(const std::string& name, const Tensor& cpu, const Tensor& gpu, double tol = 1e-9) {
  if (gpu.device() != kGpu) {
    std::printf("FAIL %s: result on %s\n", name.c_str(), DeviceName(gpu.device()).c_str());
    ++failures;
    return;
  }
  auto a = testing::HostValues(cpu), b = testing::HostValues(gpu);
  if (a.size() != b.size() || cpu.shape() != gpu.shape() || cpu.dtype() != gpu.dtype()) {
    std::printf("FAIL %s: shape/dtype differ\n", name.c_str());
    ++failures;
    return;
  }
  for (size_t i = 0; i < a.size(); ++i) {
    const bool same = a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i]));  // infinities too
    if (!same && !(std::abs(a[i] - b[i]) <= tol * (1 + std::abs(a[i])))) {
      std::printf("FAIL %s: [%zu] cpu %.17g gpu %.17g\n", name.c_str(), i, a[i], b[i]);
      ++failures;
      return;
    }
  }
  ++passes;
}

void RunChecked(const std::string& name, const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    std::printf("FAIL %s: threw %s\n", name.c_str(), e.what());
    ++failures;
  }
}

// Forward on both devices, then the gradient of sum(out * seed) with respect to each input.
void CheckOp(const std::string& name, const std::function<Tensor(const TensorList&)>& op,
             TensorList cpu_in, bool grad = true, double tol = 1e-9) {
  RunChecked(name, [&] {
    TensorList gpu_in;
    for (Tensor& t : cpu_in) {
      Tensor g = t.To(kGpu);
      if (grad && IsFloating(t.dtype())) {
        t.set_requires_grad(true);
        g.set_requires_grad(true);
      }
      gpu_in.push_back(g);
    }
    Tensor yc = op(cpu_in);
    Tensor yg = op(gpu_in);
    Compare(name, yc, yg, tol);
    if (!grad || !IsFloating(yc.dtype())) return;
    Tensor seed = Rand({yc.shape().begin(), yc.shape().end()}, -1, 1, 7);
    if (yc.dtype() != DType::kFloat64) seed = seed.To(yc.dtype());
    TensorList xc, xg;
    for (size_t i = 0; i < cpu_in.size(); ++i) {
      if (cpu_in[i].requires_grad()) {
        xc.push_back(cpu_in[i]);
        xg.push_back(gpu_in[i]);
      }
    }
    autograd::BackwardOptions opts;
    opts.allow_unused = true;
    auto gc = autograd::Grad({yc}, {seed}, xc, opts);
    auto gg = autograd::Grad({yg}, {seed.To(kGpu)}, xg, opts);
    if (!gc.ok() || !gg.ok()) {
      std::printf("FAIL %s backward: %s / %s\n", name.c_str(), gc.status().ToString().c_str(),
                  gg.status().ToString().c_str());
      ++failures;
      return;
    }
    for (size_t i = 0; i < gc->size(); ++i) {
      if ((*gc)[i].defined()) Compare(name + " grad" + std::to_string(i), (*gc)[i], (*gg)[i], tol);
    }
  });
}

TEST(CudaElementwiseTest, EveryOpMatchesTheCpuForwardAndBackward) {
  const std::string why = testing::GpuUnavailable();
  if (!why.empty()) GTEST_SKIP() << "no GPU: " << why;
  const Tensor a = Rand({4, 33}, -2, 2, 1), b = Rand({4, 33}, 0.5, 2, 2),
               row = Rand({33}, 0.5, 2, 3);
  const Tensor pos = Rand({4, 33}, 0.1, 3, 4);
  auto U = [&](const char* n, Tensor (*f)(const Tensor&), const Tensor& x) {
    CheckOp(n, [f](const TensorList& in) { return f(in[0]); }, {x.Clone()});
  };
  U("neg", &neg, a);
  U("sign", &sign, a);
  U("abs", &abs, a);
  U("exp", &exp, a);
  U("log", &log, pos);
  U("sqrt", &sqrt, pos);
  U("rsqrt", &rsqrt, pos);
  U("sin", &sin, a);
  U("cos", &cos, a);
  U("tanh", &tanh, a);
  U("sigmoid", &sigmoid, a);
  U("erf", &erf, a);
  U("relu", &relu, a);
  CheckOp("gelu none", [](const TensorList& in) { return gelu(in[0]); }, {a.Clone()});
  CheckOp("gelu tanh", [](const TensorList& in) { return gelu(in[0], "tanh"); }, {a.Clone()});
  CheckOp("softplus", [](const TensorList& in) { return softplus(in[0], 2, 1); }, {a.Clone()});
  CheckOp("clamp", [](const TensorList& in) { return clamp(in[0], -0.5, 0.7); }, {a.Clone()});
  CheckOp("add", [](const TensorList& in) { return add(in[0], in[1]); }, {a.Clone(), b.Clone()});
  CheckOp("add alpha bcast", [](const TensorList& in) { return add(in[0], in[1], 3); },
          {a.Clone(), row.Clone()});
  CheckOp("add scalar", [](const TensorList& in) { return add(in[0], 1.5); }, {a.Clone()});
  CheckOp("sub", [](const TensorList& in) { return sub(in[0], in[1], 2); }, {a.Clone(), b.Clone()});
  CheckOp("rsub", [](const TensorList& in) { return rsub(in[0], 2.0, 3); }, {a.Clone()});
  CheckOp("mul bcast", [](const TensorList& in) { return mul(in[0], in[1]); },
          {a.Clone(), row.Clone()});
  CheckOp("mul scalar", [](const TensorList& in) { return mul(in[0], -2.5); }, {a.Clone()});
  CheckOp("div", [](const TensorList& in) { return div(in[0], in[1]); }, {a.Clone(), b.Clone()});
  CheckOp("div scalar", [](const TensorList& in) { return div(in[0], 3.0); }, {a.Clone()});
  CheckOp("pow", [](const TensorList& in) { return pow(in[0], in[1]); }, {pos.Clone(), a.Clone()});
  CheckOp("pow 2", [](const TensorList& in) { return pow(in[0], 2.0); }, {a.Clone()});
  CheckOp("pow 1.5", [](const TensorList& in) { return pow(in[0], 1.5); }, {pos.Clone()});
  CheckOp("where", [](const TensorList& in) { return where(in[0], in[1], in[2]); },
          {Tensor::FromVector<bool>(std::vector<bool>{true, false, true}, {3, 1}).To(kCPU),
           Rand({3, 5}, -1, 1, 9), Rand({5}, -1, 1, 10)});
  const Tensor ints = Tensor::FromVector<int64_t>({3, -2, 0, 7, 1, 2}, {2, 3});
  const Tensor small = Tensor::FromVector<int64_t>({2, 3, 0, 1, 5, 2}, {2, 3});
  CheckOp(
      "int add", [](const TensorList& in) { return add(in[0], in[1]); }, {ints, small}, false);
  CheckOp(
      "int pow", [](const TensorList& in) { return pow(in[0], in[1]); }, {ints, small}, false);
  CheckOp(
      "int clamp", [](const TensorList& in) { return clamp(in[0], -1.0, 4.0, true); }, {ints},
      false);
  RunChecked("int pow negative", [&] {
    try {
      pow(ints.To(kGpu), ints.To(kGpu));
      std::printf("FAIL int pow negative: no error\n");
      ++failures;
    } catch (const std::exception& e) {
      std::printf("ok: int pow negative exponent on GPU refused: %s\n", e.what());
      ++passes;
    }
  });
  const Tensor big = Rand({6, 7, 40}, -3, 3, 11);
  for (std::vector<int64_t> dims : std::vector<std::vector<int64_t>>{{}, {0}, {1}, {2}, {0, 2}}) {
    std::string d;
    for (auto x : dims) d += std::to_string(x);
    CheckOp("sum" + d, [dims](const TensorList& in) { return sum(in[0], dims); }, {big.Clone()});
    CheckOp("mean" + d, [dims](const TensorList& in) { return mean(in[0], dims, true); },
            {big.Clone()});
    CheckOp("amax" + d, [dims](const TensorList& in) { return amax(in[0], dims); }, {big.Clone()});
  }
  CheckOp("amax ties", [](const TensorList& in) { return amax(in[0], {1}); },
          {Tensor::FromVector<double>({1, 3, 3, 2, 2, 0}, {2, 3})});
  CheckOp(
      "amax nan", [](const TensorList& in) { return amax(in[0]); },
      {Tensor::FromVector<double>({1, NAN, 3, 2}, {4})}, false);
  CheckOp(
      "amax int", [](const TensorList& in) { return amax(in[0], {0}); }, {ints}, false);
  CheckOp(
      "sum int", [](const TensorList& in) { return sum(in[0], {1}); }, {ints}, false);
  CheckOp(
      "float32 tanh", [](const TensorList& in) { return tanh(in[0]); }, {a.To(DType::kFloat32)},
      true, 1e-6);
  CheckOp(
      "float32 mean", [](const TensorList& in) { return mean(in[0], {1}); },
      {big.To(DType::kFloat32)}, true, 1e-6);
  std::printf("passed %d, failed %d\n", passes, failures);
  EXPECT_EQ(failures, 0) << "see the FAIL lines above";
}

}  // namespace
}  // namespace gradserve::ops
