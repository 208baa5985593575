// Small differentiable functions for the Engine's tests, independent of the op set, so the
// Engine is tested on its own. Tensors here are contiguous float64 on a host device.

#ifndef GRADSERVE_TESTS_ENGINE_TEST_NODES_H_
#define GRADSERVE_TESTS_ENGINE_TEST_NODES_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/autograd/saved_variable.h"
#include "engine/autograd/variable.h"
#include "engine/kernels/basic_kernels.h"
#include "engine/tensor/tensor.h"
#include "engine/util/mutex.h"

namespace gradserve::testing {

inline Tensor Vec(std::vector<double> values) {
  const int64_t n = static_cast<int64_t>(values.size());
  return Tensor::FromVector<double>(values, {n});
}
inline Tensor Leaf(std::vector<double> values) {
  Tensor t = Vec(std::move(values));
  t.set_requires_grad(true);
  return t;
}
inline Tensor ScalarLeaf(double v) {
  Tensor t = Tensor::Scalar(v, DType::kFloat64);
  t.set_requires_grad(true);
  return t;
}
inline std::vector<double> Values(const Tensor& t) {
  Tensor c = t.To(kCPU).contiguous().To(DType::kFloat64);
  return std::vector<double>(c.data<double>(), c.data<double>() + c.numel());
}

// out = in * k, elementwise.
inline Tensor ScaleData(const Tensor& in, double k) {
  Tensor out = in.contiguous().Clone();
  double* d = out.data<double>();
  for (int64_t i = 0; i < out.numel(); ++i) d[i] *= k;
  return out;
}

// A Node that calls `body` as its backward, counting calls and recording the thread.
class LambdaBackward : public autograd::Node {
 public:
  using Body = std::function<TensorList(TensorList&&)>;
  LambdaBackward(std::string name, Body body) : name_(std::move(name)), body_(std::move(body)) {}
  TensorList apply(TensorList&& grads) override {
    calls.fetch_add(1);
    {
      MutexLock lock(&thread_mutex);
      last_thread = std::this_thread::get_id();
    }
    return body_(std::move(grads));
  }
  std::string name() const override { return name_; }
  std::atomic<int> calls{0};
  Mutex thread_mutex;
  std::thread::id last_thread;

 private:
  std::string name_;
  Body body_;
};

// Records out = f(inputs) with a LambdaBackward; returns out and, through node, the Node.
inline Tensor Record(Tensor out, const TensorList& inputs, std::string name,
                     LambdaBackward::Body body, std::shared_ptr<LambdaBackward>* node = nullptr) {
  if (autograd::ShouldRecord(inputs)) {
    auto fn = autograd::MakeNode<LambdaBackward>(std::move(name), std::move(body));
    fn->set_next_edges(autograd::CollectNextEdges(inputs));
    autograd::SetHistory(out, fn);
    if (node != nullptr) *node = fn;
  }
  return out;
}

// x * k.
inline Tensor Scale(const Tensor& x, double k, std::shared_ptr<LambdaBackward>* node = nullptr) {
  return Record(
      ScaleData(x, k), {x}, "ScaleBackward",
      [k](TensorList&& g) { return TensorList{Scale(g[0], k)}; }, node);
}

// a + b (same shapes).
inline Tensor Add(const Tensor& a, const Tensor& b,
                  std::shared_ptr<LambdaBackward>* node = nullptr) {
  return Record(
      AddSameShape(a, b), {a, b}, "AddBackward",
      [](TensorList&& g) {
        return TensorList{g[0], g[0]};
      },
      node);
}

// sum(x) as a 0-d tensor.
inline Tensor Sum(const Tensor& x, std::shared_ptr<LambdaBackward>* node = nullptr) {
  double total = 0;
  for (double v : Values(x)) total += v;
  Tensor out = Tensor::Scalar(total, DType::kFloat64, x.device());
  Shape shape = x.shape();
  return Record(
      out, {x}, "SumBackward",
      [shape, device = x.device()](TensorList&& g) {
        return TensorList{Tensor::Full(shape, g[0].item(), DType::kFloat64, device)};
      },
      node);
}

// x * x, saving x: its backward fails once the graph is freed.
class SquareBackward : public autograd::Node {
 public:
  explicit SquareBackward(const Tensor& x) : x_(x, /*is_output=*/false) {}
  TensorList apply(TensorList&& grads) override {
    Tensor x = x_.unpack(this);
    Tensor out = grads[0].contiguous().Clone();
    const double* xd = x.contiguous().data<double>();
    double* d = out.data<double>();
    for (int64_t i = 0; i < out.numel(); ++i) d[i] *= 2 * xd[i];
    return {out};
  }
  std::string name() const override { return "SquareBackward"; }
  void release_variables() override { x_.reset(); }

 private:
  autograd::SavedVariable x_;
};

inline Tensor Square(const Tensor& x) {
  Tensor out = x.contiguous().Clone();
  double* d = out.data<double>();
  for (int64_t i = 0; i < out.numel(); ++i) d[i] *= d[i];
  if (autograd::ShouldRecord({x})) {
    auto fn = autograd::MakeNode<SquareBackward>(x);
    fn->set_next_edges(autograd::CollectNextEdges({x}));
    autograd::SetHistory(out, fn);
  }
  return out;
}

// a * b elementwise, with a differentiable backward (so create_graph records it).
class MulBackward : public autograd::Node {
 public:
  MulBackward(const Tensor& a, const Tensor& b) : a_(a, false), b_(b, false) {}
  TensorList apply(TensorList&& grads) override;
  std::string name() const override { return "MulBackward0"; }
  void release_variables() override {
    a_.reset();
    b_.reset();
  }

 private:
  autograd::SavedVariable a_, b_;
};

inline Tensor Mul(const Tensor& a, const Tensor& b) {
  Tensor out = a.contiguous().Clone();
  const double* bd = b.contiguous().data<double>();
  double* d = out.data<double>();
  for (int64_t i = 0; i < out.numel(); ++i) d[i] *= bd[i];
  if (autograd::ShouldRecord({a, b})) {
    auto fn = autograd::MakeNode<MulBackward>(a, b);
    fn->set_next_edges(autograd::CollectNextEdges({a, b}));
    autograd::SetHistory(out, fn);
  }
  return out;
}

inline TensorList MulBackward::apply(TensorList&& grads) {
  return {Mul(grads[0], b_.unpack(this)), Mul(grads[0], a_.unpack(this))};
}

// Moves x to device; the gradient moves back.
inline Tensor ToDevice(const Tensor& x, Device device) {
  const Device from = x.device();
  return Record(x.To(device), {x}, "ToCopyBackward",
                [from](TensorList&& g) { return TensorList{g[0].To(from)}; });
}

}  // namespace gradserve::testing

#endif  // GRADSERVE_TESTS_ENGINE_TEST_NODES_H_
