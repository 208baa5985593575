// Finite-difference gradient checks for ops, after torch.autograd.gradcheck and gradgradcheck.
//
// GradCheck compares the Jacobian that autograd computes (autograd::Grad, one backward per
// output element) with central finite differences, entry by entry:
//   |analytical - numerical| <= atol + rtol * |numerical|.
// GradGradCheck runs GradCheck on the function that maps (inputs, grad_outputs) to the
// gradients of fn computed with create_graph, with random grad_outputs, so it checks that the
// backward formulas are themselves correctly differentiable (double backward).
//
// Usage:
//   TensorList inputs = {RandomInput({2, 3}, /*seed=*/1), RandomInput({3}, 2)};
//   EXPECT_TRUE(GradCheck([](const TensorList& x) { return TensorList{ops::mul(x[0], x[1])}; },
//                         inputs));
//
// Inputs that require grad are checked and must be float64; others (int64 indices, bool masks,
// float tensors with requires_grad false) are passed through unchanged. Every output that is
// defined and floating is checked; an output that does not require grad must have a zero
// Jacobian. The function must be deterministic and must not keep state between calls: it is
// called twice per input element, on fresh leaf copies of the inputs whose values are nudged by
// +-eps in place.
//
// Thread safety: none; call from one test thread.

#ifndef GRADSERVE_TESTS_ENGINE_GRADCHECK_H_
#define GRADSERVE_TESTS_ENGINE_GRADCHECK_H_

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "engine/autograd/autograd.h"
#include "engine/autograd/grad_mode.h"
#include "engine/kernels/basic_kernels.h"
#include "engine/tensor/tensor.h"
#include "gtest/gtest.h"

namespace gradserve::testing {

struct GradCheckOptions {
  double eps = 1e-6;   // finite-difference step
  double atol = 1e-5;  // absolute tolerance
  double rtol = 1e-3;  // relative tolerance (of the numerical value)
};

using TensorFn = std::function<TensorList(const TensorList&)>;

// A float64 tensor of `shape` with values uniform in [low, high), reproducible from seed.
inline Tensor RandomInput(absl::Span<const int64_t> shape, uint32_t seed, double low = -1,
                          double high = 1, bool requires_grad = true) {
  Tensor t = Tensor::Empty(shape, DType::kFloat64);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(low, high);
  double* d = t.data<double>();
  for (int64_t i = 0; i < t.numel(); ++i) d[i] = dist(rng);
  if (requires_grad) t.set_requires_grad(true);
  return t;
}

namespace gradcheck_internal {

// Fresh contiguous leaves with the same values and requires_grad as inputs.
inline TensorList FreshLeaves(const TensorList& inputs) {
  TensorList leaves;
  for (const Tensor& t : inputs) {
    if (!t.defined()) {
      leaves.emplace_back();
      continue;
    }
    Tensor leaf = t.detach().Clone();
    if (t.requires_grad()) leaf.set_requires_grad(true);
    leaves.push_back(leaf);
  }
  return leaves;
}

// The values of a tensor as doubles, in row-major order.
inline std::vector<double> Values(const Tensor& t) {
  Tensor c = t.detach().contiguous().To(DType::kFloat64);
  const double* d = c.data<double>();
  return std::vector<double>(d, d + c.numel());
}

inline bool Checked(const Tensor& out) { return out.defined() && IsFloating(out.dtype()); }

// The values of each checked output (empty for the others).
inline std::vector<std::vector<double>> CheckedValues(const TensorList& outputs) {
  std::vector<std::vector<double>> values(outputs.size());
  for (size_t o = 0; o < outputs.size(); ++o) {
    if (Checked(outputs[o])) values[o] = Values(outputs[o]);
  }
  return values;
}

}  // namespace gradcheck_internal

// Checks autograd's first derivatives of fn at inputs against central differences.
inline ::testing::AssertionResult GradCheck(const TensorFn& fn, const TensorList& inputs,
                                            const GradCheckOptions& options = {}) {
  using namespace gradcheck_internal;
  TensorList leaves = FreshLeaves(inputs);
  std::vector<size_t> wrt;  // indices of the inputs checked
  for (size_t i = 0; i < leaves.size(); ++i) {
    if (!leaves[i].defined() || !leaves[i].requires_grad()) continue;
    if (leaves[i].dtype() != DType::kFloat64) {
      return ::testing::AssertionFailure()
             << "GradCheck needs float64 inputs; input " << i << " is " << leaves[i].DebugString();
    }
    wrt.push_back(i);
  }
  TensorList wrt_leaves;
  for (size_t i : wrt) wrt_leaves.push_back(leaves[i]);

  // Analytical Jacobian: jac[o][k][j][e] = d out_o[j] / d input_wrt[k][e].
  autograd::GradModeGuard grad_mode(true);
  TensorList outputs;
  try {
    outputs = fn(leaves);
  } catch (const StatusError& e) {
    return ::testing::AssertionFailure() << "fn threw: " << e.status();
  }
  std::vector<std::vector<std::vector<std::vector<double>>>> jac(outputs.size());
  for (size_t o = 0; o < outputs.size(); ++o) {
    if (!Checked(outputs[o])) continue;
    const int64_t n = outputs[o].numel();
    jac[o].resize(wrt.size());
    for (size_t k = 0; k < wrt.size(); ++k) {
      jac[o][k].assign(n, std::vector<double>(leaves[wrt[k]].numel(), 0.0));
    }
    if (!outputs[o].requires_grad()) continue;
    for (int64_t j = 0; j < n; ++j) {
      Tensor seed = Tensor::Zeros(outputs[o].shape(), outputs[o].dtype());
      Fill(seed.AsStrided({}, {}, j), 1.0);
      autograd::BackwardOptions backward;
      backward.retain_graph = true;
      backward.allow_unused = true;
      absl::StatusOr<TensorList> grads = autograd::Grad({outputs[o]}, {seed}, wrt_leaves, backward);
      if (!grads.ok()) {
        return ::testing::AssertionFailure()
               << "backward of output " << o << " failed: " << grads.status();
      }
      for (size_t k = 0; k < wrt.size(); ++k) {
        const Tensor& g = (*grads)[k];
        if (!g.defined()) continue;
        const Tensor& input = leaves[wrt[k]];
        if (g.shape() != input.shape() || g.dtype() != input.dtype()) {
          return ::testing::AssertionFailure()
                 << "gradient of output " << o << " for input " << wrt[k] << " is "
                 << g.DebugString() << " but the input is " << input.DebugString();
        }
        jac[o][k][j] = Values(g);
      }
    }
  }

  // Numerical Jacobian, one input element at a time, compared as it is made.
  for (size_t k = 0; k < wrt.size(); ++k) {
    Tensor& input = leaves[wrt[k]];
    double* data = input.data<double>();
    for (int64_t e = 0; e < input.numel(); ++e) {
      const double original = data[e];
      // Outputs may alias the inputs (an op that returns its input), so their values are read
      // before the input changes again.
      std::vector<std::vector<double>> plus, minus;
      try {
        data[e] = original + options.eps;
        plus = CheckedValues(fn(leaves));
        data[e] = original - options.eps;
        minus = CheckedValues(fn(leaves));
      } catch (const StatusError& err) {
        data[e] = original;
        return ::testing::AssertionFailure() << "fn threw: " << err.status();
      }
      data[e] = original;
      for (size_t o = 0; o < outputs.size(); ++o) {
        if (!Checked(outputs[o])) continue;
        for (size_t j = 0; j < plus[o].size(); ++j) {
          const double numerical = (plus[o][j] - minus[o][j]) / (2 * options.eps);
          const double analytical = jac[o][k][j][e];
          if (!(std::abs(analytical - numerical) <=
                options.atol + options.rtol * std::abs(numerical))) {
            return ::testing::AssertionFailure()
                   << "Jacobian mismatch for output " << o << " element " << j << " and input "
                   << wrt[k] << " element " << e << ": analytical " << analytical << ", numerical "
                   << numerical;
          }
        }
      }
    }
  }
  return ::testing::AssertionSuccess();
}

// Checks the second derivatives of fn: GradCheck of (inputs, grad_outputs) -> d(sum of
// outputs * grad_outputs) / d inputs, computed with create_graph, at random grad_outputs.
inline ::testing::AssertionResult GradGradCheck(const TensorFn& fn, const TensorList& inputs,
                                                const GradCheckOptions& options = {}) {
  using namespace gradcheck_internal;
  TensorList outputs;
  {
    autograd::GradModeGuard grad_mode(true);
    try {
      outputs = fn(FreshLeaves(inputs));
    } catch (const StatusError& e) {
      return ::testing::AssertionFailure() << "fn threw: " << e.status();
    }
  }
  // One random grad_output per output that gradients flow from.
  std::vector<size_t> differentiable;
  TensorList all = inputs;
  for (size_t o = 0; o < outputs.size(); ++o) {
    if (!Checked(outputs[o]) || !outputs[o].requires_grad()) continue;
    differentiable.push_back(o);
    all.push_back(RandomInput(outputs[o].shape(), 1000 + static_cast<uint32_t>(o)));
  }
  if (differentiable.empty()) {
    return ::testing::AssertionFailure() << "GradGradCheck: no output requires grad";
  }
  const size_t num_inputs = inputs.size();
  TensorFn first_derivative = [&](const TensorList& args) -> TensorList {
    TensorList in(args.begin(), args.begin() + num_inputs);
    TensorList outs = fn(in);
    TensorList roots, seeds, wrt;
    for (size_t i = 0; i < differentiable.size(); ++i) {
      roots.push_back(outs[differentiable[i]]);
      seeds.push_back(args[num_inputs + i]);
    }
    for (const Tensor& t : in) {
      if (t.defined() && t.requires_grad()) wrt.push_back(t);
    }
    autograd::BackwardOptions backward;
    backward.create_graph = true;
    // PyTorch's retain_graph defaults to create_graph: the second backward runs through the
    // first graph's saved tensors again (e.g. tanh's result).
    backward.retain_graph = true;
    backward.allow_unused = true;
    absl::StatusOr<TensorList> grads = autograd::Grad(roots, seeds, wrt, backward);
    if (!grads.ok()) ThrowStatus(grads.status());
    for (size_t i = 0; i < grads->size(); ++i) {
      if (!(*grads)[i].defined()) (*grads)[i] = wrt[i].ZerosLike();
    }
    return *std::move(grads);
  };
  return GradCheck(first_derivative, all, options);
}

}  // namespace gradserve::testing

#endif  // GRADSERVE_TESTS_ENGINE_GRADCHECK_H_
