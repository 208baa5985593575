// CPU-versus-device parity over random graphs: the same graph run through the graph interpreter
// with every leaf on the CPU and with every leaf on a target device (sim:0 always; each GPU when
// one is present) gives the same values and gradients within a tolerance. Also the graph op
// "to" that moves tensors between devices, and the errors for devices that do not match.
//
// The graphs are grown op by op, as tests/python/graph_gen.py does: an op is kept only if it
// runs on the CPU (eagerly, without grad) and its result is finite and tame. An op that has no
// kernel on the target device yet (UNIMPLEMENTED) fails the test, naming the op.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/autograd/grad_mode.h"
#include "engine/device/device_registry.h"
#include "engine/graph/graph.h"
#include "engine/graph/interpreter.h"
#include "engine/ops/cuda_ops.h"
#include "engine/ops/op_registry.h"
#include "engine/tensor/shape.h"
#include "engine/tensor/tensor.h"
#include "engine/util/status_error.h"
#include "gtest/gtest.h"
#include "tests/engine/graph_test_util.h"

namespace gradserve::graph::testing {
namespace {

constexpr int kGraphsPerDevice = 200;

// Registers sim:0 and sim:1 (as engine_test.cc does; whichever comes first wins) and every GPU.
void RegisterTestDevices() {
  (void)RegisterSimulatedDevices(2);
  if (CudaDeviceCount() > 0) (void)RegisterCudaDevices();
}

std::vector<Device> DevicesOfType(DeviceType type) {
  std::vector<Device> out;
  for (Device d : DeviceRegistry::Get().devices()) {
    if (d.type == type) out.push_back(d);
  }
  return out;
}

// --- Random graphs ---

struct RandomGraphResult {
  Graph graph;  // every leaf on the CPU
  std::string root;
  std::vector<std::string> wrt;
  std::vector<std::string> op_outputs;  // every op's outputs, to compare values
  std::vector<std::string> ops_used;
};

class RandomGraph {
 public:
  RandomGraph(uint64_t seed, DType dtype) : rng_(seed), dtype_(dtype) {}

  RandomGraphResult Build() {
    const int leaves = Int(1, 3);
    for (int i = 0; i < leaves; ++i) FloatLeaf(RandomShape());
    const int steps = Int(4, 12);
    for (int i = 0; i < steps; ++i) {
      for (int attempt = 0; attempt < 10; ++attempt) {
        if (Step()) break;
      }
    }
    // root = sum(last * w): every element of the last value gets a distinct seed.
    const std::string last = floats_.back();
    const std::string w = FloatLeaf(ShapeOf(last), /*requires_grad=*/false);
    std::optional<std::string> prod = TryOp("mul", {last, w});
    std::optional<std::string> root = TryOp("sum", {prod ? *prod : last});
    GS_CHECK_INTERNAL(root.has_value(), "the root of a random graph failed");
    result_.root = *root;
    return std::move(result_);
  }

 private:
  int Int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  double Uniform(double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(rng_);
  }
  bool Coin(double p = 0.5) { return Uniform(0, 1) < p; }
  template <typename T>
  const T& Choice(const std::vector<T>& v) {
    return v[Int(0, static_cast<int>(v.size()) - 1)];
  }

  Shape RandomShape() {
    Shape s(Int(0, 3));
    for (int64_t& d : s) d = Int(1, 4);
    return s;
  }
  Shape ShapeOf(const std::string& name) const { return values_.at(name).shape(); }
  int64_t Rank(const std::string& name) const { return values_.at(name).dim(); }

  std::string NewName() { return absl::StrCat("v", next_++); }

  std::string AddLeaf(Tensor value, bool requires_grad) {
    std::string name = NewName();
    result_.graph.leaves.push_back({name, value, requires_grad});
    values_[name] = value;
    if (requires_grad) result_.wrt.push_back(name);
    return name;
  }

  std::string FloatLeaf(const Shape& shape, bool requires_grad = true, double lo = -1,
                        double hi = 1, bool away_from_zero = false) {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    std::vector<double> data(numel);
    for (double& x : data) {
      x = Uniform(lo, hi);
      if (away_from_zero) x = (x < 0 ? -0.5 : 0.5) + x * 0.5;
    }
    std::string name = AddLeaf(Tensor::FromVector<double>(data, shape).To(dtype_), requires_grad);
    floats_.push_back(name);
    return name;
  }

  std::string IndexLeaf(const Shape& shape, int64_t high) {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    std::vector<int64_t> data(numel);
    for (int64_t& x : data) x = Int(0, static_cast<int>(high) - 1);
    return AddLeaf(Tensor::FromVector<int64_t>(data, shape), false);
  }

  std::string BoolLeaf(const Shape& shape) {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    std::vector<double> data(numel);
    for (double& x : data) x = Coin() ? 1 : 0;
    return AddLeaf(Tensor::FromVector<double>(data, shape).To(DType::kBool), false);
  }

  // A float value, favouring recent ones, with rank in range; nullopt if none.
  std::optional<std::string> Pick(int min_rank = 0, int max_rank = 4) {
    std::vector<std::string> names;
    for (const std::string& n : floats_) {
      if (Rank(n) >= min_rank && Rank(n) <= max_rank) names.push_back(n);
    }
    if (names.empty()) return std::nullopt;
    std::vector<double> weights(names.size());
    for (size_t i = 0; i < names.size(); ++i) weights[i] = double(i + 1) * double(i + 1);
    return names[std::discrete_distribution<size_t>(weights.begin(), weights.end())(rng_)];
  }

  // An existing float value of exactly shape, or a new leaf with it.
  std::string PickShaped(const Shape& shape) {
    std::vector<std::string> names;
    for (const std::string& n : floats_) {
      if (ShapeOf(n) == shape) names.push_back(n);
    }
    if (!names.empty() && Coin()) return Choice(names);
    return FloatLeaf(shape);
  }

  // A shape that broadcasts with s: s itself, a suffix, or s with some dims set to 1.
  Shape Partner(const Shape& s) {
    Shape out = s;
    if (!out.empty() && Coin(0.3)) out.erase(out.begin(), out.begin() + Int(0, out.size()));
    for (int64_t& d : out) {
      if (Coin(0.25)) d = 1;
    }
    return out;
  }

  // Adds op if it runs on the CPU and its floating result is finite and at most 1e3.
  std::optional<std::string> TryOp(const std::string& op, const std::vector<std::string>& inputs,
                                   ops::Attrs attrs = {}) {
    const ops::OpSchema* schema = ops::OpRegistry::Get().Find(op);
    GS_CHECK_INTERNAL(schema != nullptr, "no op ", op);
    TensorList in;
    for (const std::string& n : inputs) in.push_back(values_.at(n));
    TensorList out;
    try {
      autograd::NoGradGuard no_grad;
      out = schema->run(in, attrs);
    } catch (const StatusError&) {
      return std::nullopt;
    }
    const Tensor& result = out.at(0);
    if (IsFloating(result.dtype())) {
      for (double x : Values(result)) {
        if (!std::isfinite(x) || std::abs(x) > 1e3) return std::nullopt;
      }
    }
    std::string name = NewName();
    graph::Op o;
    o.op = op;
    o.inputs = inputs;
    o.outputs = {name};
    o.attrs = std::move(attrs);
    result_.graph.ops.push_back(std::move(o));
    result_.op_outputs.push_back(name);
    result_.ops_used.push_back(op);
    values_[name] = result;
    if (IsFloating(result.dtype())) floats_.push_back(name);
    return name;
  }

  // x mapped to values of at least ~0.25 through differentiable ops.
  std::optional<std::string> Positive(const std::string& x) {
    const std::vector<double> v = Values(values_.at(x));
    if (!v.empty() && *std::min_element(v.begin(), v.end()) > 0.2) return x;
    std::optional<std::string> y = TryOp(Choice<std::string>({"abs", "sigmoid", "softplus"}), {x});
    if (!y) return std::nullopt;
    return TryOp("add", {*y}, ops::Attrs({{"other", 0.5}}));
  }

  bool Step() {
    switch (Int(0, 8)) {
      case 0:
      case 1:
        return Binary();
      case 2:
        return ScalarOperand();
      case 3:
      case 4:
        return Unary();
      case 5:
        return Reduction();
      case 6:
        return Matmul();
      case 7:
        return ShapeOp();
      default:
        return NN();
    }
  }

  bool Binary() {
    const std::string op = Choice<std::string>({"add", "sub", "mul", "div", "where"});
    std::optional<std::string> x = Pick();
    if (!x) return false;
    const Shape partner = Partner(ShapeOf(*x));
    if (op == "where")
      return TryOp("where", {BoolLeaf(Partner(ShapeOf(*x))), *x, PickShaped(partner)}).has_value();
    std::string y = op == "div" ? FloatLeaf(partner, true, -1, 1, /*away_from_zero=*/true)
                                : PickShaped(partner);
    ops::Attrs attrs;
    if ((op == "add" || op == "sub") && Coin(0.3)) attrs.set("alpha", Choice<double>({0.5, -2, 3}));
    if (op != "div" && Coin(0.3)) std::swap(*x, y);
    return TryOp(op, {*x, y}, attrs).has_value();
  }

  bool ScalarOperand() {
    const std::string op = Choice<std::string>({"add", "sub", "mul", "div", "pow"});
    std::optional<std::string> x = Pick();
    if (!x) return false;
    if (op == "pow") {
      const double e = Choice<double>({2, 3, -1, 0.5, 1.5});
      if (e == 0.5 || e == 1.5) x = Positive(*x);
      return x && TryOp("pow", {*x}, ops::Attrs({{"exponent", e}}));
    }
    return TryOp(op, {*x}, ops::Attrs({{"other", Choice<double>({2, -3, 0.5, 1.25})}})).has_value();
  }

  bool Unary() {
    const std::string op =
        Choice<std::string>({"neg", "exp", "log", "sqrt", "rsqrt", "abs", "sin", "cos", "tanh",
                             "sigmoid", "relu", "gelu", "softplus", "clamp"});
    std::optional<std::string> x = Pick();
    if (!x) return false;
    ops::Attrs attrs;
    if (op == "log" || op == "sqrt" || op == "rsqrt") {
      x = Positive(*x);
    } else if (op == "gelu" && Coin()) {
      attrs.set("approximate", Choice<std::string>({"none", "tanh"}));
    } else if (op == "softplus" && Coin()) {
      attrs.set("beta", Choice<double>({0.5, 2}));
    } else if (op == "clamp") {
      // Bounds midway between distinct values, so no value lies on a bound.
      std::vector<double> v = Values(values_.at(*x));
      std::sort(v.begin(), v.end());
      v.erase(std::unique(v.begin(), v.end()), v.end());
      if (v.size() < 2) return false;
      const size_t i = Int(0, static_cast<int>(v.size()) - 2);
      const double mid = (v[i] + v[i + 1]) / 2;
      attrs.set(Coin() ? "min" : "max", mid);
    }
    return x && TryOp(op, {*x}, attrs);
  }

  bool Reduction() {
    const std::string op = Choice<std::string>({"sum", "mean", "amax"});
    std::optional<std::string> x = Pick();
    if (!x) return false;
    ops::Attrs attrs;
    const int rank = static_cast<int>(Rank(*x));
    if (rank > 0 && Coin(0.7)) attrs.set("dim", std::vector<int64_t>{Int(-rank, rank - 1)});
    if (Coin(0.4)) attrs.set("keepdim", Coin());
    return TryOp(op, {*x}, attrs).has_value();
  }

  bool Matmul() {
    std::optional<std::string> x = Pick(1, 3);
    if (!x) return false;
    const Shape sx = ShapeOf(*x);
    const int64_t k = sx.back();
    const int64_t m = Int(1, 4);
    Shape so = Coin() ? Shape{k} : Shape{k, m};
    return TryOp("matmul", {*x, PickShaped(so)}).has_value();
  }

  bool ShapeOp() {
    const std::string op =
        Choice<std::string>({"reshape", "transpose", "permute", "expand", "unsqueeze", "cat",
                             "stack", "narrow", "select", "index_select", "gather"});
    std::optional<std::string> x =
        Pick(op == "reshape" || op == "unsqueeze" || op == "stack" || op == "expand" ? 0 : 1);
    if (!x) return false;
    const Shape s = ShapeOf(*x);
    const int rank = static_cast<int>(s.size());
    const int dim = rank > 0 ? Int(-rank, rank - 1) : 0;
    const int64_t size = rank > 0 ? s[dim < 0 ? dim + rank : dim] : 1;
    if (op == "reshape") {
      int64_t numel = 1;
      for (int64_t d : s) numel *= d;
      return TryOp(op, {*x},
                   ops::Attrs({{"shape", std::vector<int64_t>{-1, numel == 0 ? 1 : numel}}}))
          .has_value();
    }
    if (op == "transpose") {
      return TryOp(op, {*x},
                   ops::Attrs({{"dim0", int64_t{dim}}, {"dim1", int64_t{Int(-rank, rank - 1)}}}))
          .has_value();
    }
    if (op == "permute") {
      std::vector<int64_t> dims(rank);
      for (int i = 0; i < rank; ++i) dims[i] = i;
      std::shuffle(dims.begin(), dims.end(), rng_);
      return TryOp(op, {*x}, ops::Attrs({{"dims", dims}})).has_value();
    }
    if (op == "expand") {
      std::vector<int64_t> size_attr;
      if (Coin()) size_attr.push_back(Int(1, 2));
      for (int64_t d : s) size_attr.push_back(d == 1 ? Int(1, 3) : d);
      return TryOp(op, {*x}, ops::Attrs({{"size", size_attr}})).has_value();
    }
    if (op == "unsqueeze") {
      return TryOp(op, {*x}, ops::Attrs({{"dim", int64_t{Int(-rank - 1, rank)}}})).has_value();
    }
    if (op == "cat" || op == "stack") {
      std::vector<std::string> parts = {*x};
      for (int i = Int(1, 2); i > 0; --i) {
        if (Coin(0.3)) {
          parts.push_back(*x);
        } else if (op == "cat") {
          Shape shape = s;
          shape[dim < 0 ? dim + rank : dim] = Int(1, 3);
          parts.push_back(PickShaped(shape));
        } else {
          parts.push_back(PickShaped(s));
        }
      }
      const int64_t d = op == "stack" ? Int(-rank - 1, rank) : dim;
      return TryOp(op, parts, ops::Attrs({{"dim", d}})).has_value();
    }
    if (op == "narrow") {
      const int64_t length = Int(1, static_cast<int>(size));
      const int64_t start = Int(0, static_cast<int>(size - length));
      return TryOp(op, {*x},
                   ops::Attrs({{"dim", int64_t{dim}}, {"start", start}, {"length", length}}))
          .has_value();
    }
    if (op == "select") {
      return TryOp(op, {*x},
                   ops::Attrs({{"dim", int64_t{dim}},
                               {"index", int64_t{Int(-static_cast<int>(size),
                                                     static_cast<int>(size) - 1)}}}))
          .has_value();
    }
    if (op == "index_select") {
      const Shape shape = Coin(0.2) ? Shape{} : Shape{Int(1, 5)};
      return TryOp(op, {*x, IndexLeaf(shape, size)}, ops::Attrs({{"dim", int64_t{dim}}}))
          .has_value();
    }
    Shape shape(rank);  // gather
    for (int i = 0; i < rank; ++i) shape[i] = Int(1, static_cast<int>(s[i]));
    shape[dim < 0 ? dim + rank : dim] = Int(1, 4);
    return TryOp(op, {*x, IndexLeaf(shape, size)}, ops::Attrs({{"dim", int64_t{dim}}})).has_value();
  }

  bool NN() {
    const std::string op = Choice<std::string>({"softmax", "log_softmax", "mse_loss", "to"});
    std::optional<std::string> x = Pick();
    if (!x) return false;
    if (op == "to") {  // to the other floating dtype, on the same device
      const bool f64 = values_.at(*x).dtype() == DType::kFloat64;
      return TryOp(op, {*x}, ops::Attrs({{"dtype", std::string(f64 ? "float32" : "float64")}}))
          .has_value();
    }
    if (op == "mse_loss") {
      ops::Attrs attrs;
      if (Coin(0.7)) attrs.set("reduction", Choice<std::string>({"none", "mean", "sum"}));
      return TryOp(op, {*x, PickShaped(ShapeOf(*x))}, attrs).has_value();
    }
    const int rank = static_cast<int>(Rank(*x));
    const int64_t dim = rank > 0 ? Int(-rank, rank - 1) : 0;
    return TryOp(op, {*x}, ops::Attrs({{"dim", dim}})).has_value();
  }

  std::mt19937_64 rng_;
  DType dtype_;
  int next_ = 0;
  RandomGraphResult result_;
  absl::flat_hash_map<std::string, Tensor> values_;  // eager CPU values
  std::vector<std::string> floats_;
};

// --- Running and comparing ---

struct RunResult {
  absl::Status status;
  std::map<std::string, Tensor> values;  // op outputs, on the CPU
  CallResult grads;                      // grads as returned (on the leaves' device)
};

RunResult RunOn(const RandomGraphResult& g, Device device) {
  RunResult r;
  Graph graph = g.graph;
  for (Leaf& leaf : graph.leaves) leaf.value = leaf.value.To(device);
  auto recorded = RecordedGraph::Record(graph, Limits{});
  if (!recorded.ok()) {
    r.status = recorded.status();
    return r;
  }
  for (const std::string& name : g.op_outputs) {
    absl::StatusOr<Tensor> v = (*recorded)->Value(name);
    if (!v.ok()) {
      r.status = v.status();
      return r;
    }
    r.values[name] = v->To(kCPU);
  }
  BackwardCall call = GradCall(g.root, g.wrt);
  call.allow_unused = true;
  absl::StatusOr<CallResult> result = (*recorded)->Backward(call);
  if (!result.ok()) {
    r.status = result.status();
    return r;
  }
  r.grads = *std::move(result);
  return r;
}

// Empty if a (on the device, brought to the CPU) matches b (the CPU's) within tolerance: float32's
// when anything in the graph was float32 (a float64 value computed from a float32 one through
// `to` is only as accurate as float32), float64's otherwise.
std::string Compare(const Tensor& a, const Tensor& b, bool float32_in_graph) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) {
    return absl::StrCat("dtype/shape ", DTypeName(a.dtype()), ShapeToString(a.shape()), " vs ",
                        DTypeName(b.dtype()), ShapeToString(b.shape()));
  }
  const std::vector<double> va = Values(a.To(DType::kFloat64));
  const std::vector<double> vb = Values(b.To(DType::kFloat64));
  const bool f64 = a.dtype() == DType::kFloat64 && !float32_in_graph;
  const double atol = !IsFloating(a.dtype()) ? 0 : f64 ? 1e-10 : 1e-4;
  const double rtol = !IsFloating(a.dtype()) ? 0 : f64 ? 1e-10 : 1e-4;
  for (size_t i = 0; i < va.size(); ++i) {
    if (!(std::abs(va[i] - vb[i]) <= atol + rtol * std::abs(vb[i]))) {
      return absl::StrCat("element ", i, ": device ", va[i], " vs cpu ", vb[i], " (difference ",
                          std::abs(va[i] - vb[i]), ")");
    }
  }
  return "";
}

std::string Describe(const RandomGraphResult& g, uint64_t seed, DType dtype) {
  return absl::StrCat("graph seed ", seed, " (", DTypeName(dtype), "), ops [",
                      absl::StrJoin(g.ops_used, ", "), "]");
}

// Runs kGraphsPerDevice random graphs (half float32, half float64) on the CPU and on device.
void CheckParity(Device device) {
  std::set<std::string> unimplemented;
  std::map<std::string, int> op_counts;
  int compared = 0, grads_compared = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kGraphsPerDevice; ++i) {
    const uint64_t seed = 1000 + i;
    const DType dtype = i % 2 == 0 ? DType::kFloat64 : DType::kFloat32;
    const RandomGraphResult g = RandomGraph(seed, dtype).Build();
    const std::string what = Describe(g, seed, dtype);
    const bool float32_in_graph =
        dtype == DType::kFloat32 || absl::c_linear_search(g.ops_used, std::string("to"));
    for (const std::string& op : g.ops_used) ++op_counts[op];
    const RunResult cpu = RunOn(g, kCPU);
    ASSERT_TRUE(cpu.status.ok()) << what << ": on the CPU: " << cpu.status;
    const RunResult dev = RunOn(g, device);
    if (dev.status.code() == absl::StatusCode::kUnimplemented) {
      unimplemented.insert(std::string(dev.status.message()));
      continue;
    }
    ASSERT_TRUE(dev.status.ok()) << what << ": on " << DeviceName(device) << ": " << dev.status;
    for (const auto& [name, value] : cpu.values) {
      const std::string diff = Compare(dev.values.at(name), value, float32_in_graph);
      EXPECT_EQ(diff, "") << what << ": value " << name;
    }
    ASSERT_EQ(dev.grads.grads.size(), cpu.grads.grads.size()) << what;
    for (size_t k = 0; k < cpu.grads.grads.size(); ++k) {
      const Tensor& cg = cpu.grads.grads[k];
      const Tensor& dg = dev.grads.grads[k];
      ASSERT_EQ(dg.defined(), cg.defined()) << what << ": grad of " << cpu.grads.names[k];
      if (!cg.defined()) continue;
      EXPECT_EQ(dg.device(), device) << what << ": grad of " << cpu.grads.names[k];
      const std::string diff = Compare(dg.To(kCPU), cg, float32_in_graph);
      EXPECT_EQ(diff, "") << what << ": grad of " << cpu.grads.names[k];
      ++grads_compared;
    }
    ++compared;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::string ops;
  for (const auto& [op, n] : op_counts) absl::StrAppend(&ops, " ", op, "=", n);
  std::printf("[ parity   ] %s: %d of %d graphs, %d gradients compared in %.2f s; ops:%s\n",
              DeviceName(device).c_str(), compared, kGraphsPerDevice, grads_compared, seconds,
              ops.c_str());
  EXPECT_TRUE(unimplemented.empty())
      << DeviceName(device) << ": ops without a kernel there (UNIMPLEMENTED):\n  "
      << absl::StrJoin(unimplemented, "\n  ");
}

class DeviceParityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { RegisterTestDevices(); }
};

TEST_F(DeviceParityTest, SimulatedDeviceMatchesTheCpu) {
  CheckParity(Device{DeviceType::kSimulated, 0});
}

TEST_F(DeviceParityTest, EveryGpuMatchesTheCpu) {
  std::string why;
  if (CudaDeviceCount(&why) == 0) GTEST_SKIP() << "no GPU: " << why;
  const std::vector<Device> gpus = DevicesOfType(DeviceType::kCUDA);
  ASSERT_FALSE(gpus.empty()) << "GPUs were found but none is registered";
  for (Device gpu : gpus) CheckParity(gpu);
}

// --- The graph op "to" ---

class ToDeviceOpTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() { RegisterTestDevices(); }
  void SetUp() override {
    if (absl::StartsWith(GetParam(), "cuda")) {
      std::string why;
      if (CudaDeviceCount(&why) == 0) GTEST_SKIP() << "no GPU: " << why;
    }
  }
};

TEST_P(ToDeviceOpTest, MovesForwardAndTheGradientComesBack) {
  const Device target = ParseDevice(GetParam()).value();
  for (DType dtype : {DType::kFloat32, DType::kFloat64}) {
    GraphBuilder b;
    b.Leaf("x", F64({1, -2, 3}).To(dtype), true)
        .Op("to", {"x"}, {"y"}, ops::Attrs({{"device", GetParam()}}))
        .Op("mul", {"y", "y"}, {"z"})
        .Op("to", {"z"}, {"w"}, ops::Attrs({{"device", std::string("cpu")}}))
        .Op("sum", {"w"}, {"s"});
    auto recorded = MustRecord(b.Build());
    ASSERT_NE(recorded, nullptr);
    EXPECT_EQ((*recorded->Value("y")).device(), target);
    EXPECT_EQ((*recorded->Value("w")).device(), kCPU);
    auto result = recorded->Backward(GradCall("s", {"x"}));
    ASSERT_TRUE(result.ok()) << result.status();
    ASSERT_TRUE(result->grads[0].defined());
    EXPECT_EQ(result->grads[0].device(), kCPU);
    EXPECT_EQ(result->grads[0].dtype(), dtype);
    EXPECT_EQ(Values(result->grads[0]), (std::vector<double>{2, -4, 6}));
  }
}

TEST_P(ToDeviceOpTest, DeviceAndDtypeTogether) {
  const Device target = ParseDevice(GetParam()).value();
  GraphBuilder b;
  b.Leaf("x", F64({0.5, 1.5}), true)
      .Op("to", {"x"}, {"y"},
          ops::Attrs({{"device", GetParam()}, {"dtype", std::string("float32")}}))
      .Op("sum", {"y"}, {"s"});
  auto recorded = MustRecord(b.Build());
  ASSERT_NE(recorded, nullptr);
  const Tensor y = *recorded->Value("y");
  EXPECT_EQ(y.device(), target);
  EXPECT_EQ(y.dtype(), DType::kFloat32);
  auto result = recorded->Backward(GradCall("s", {"x"}));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->grads[0].device(), kCPU);
  EXPECT_EQ(result->grads[0].dtype(), DType::kFloat64);
  EXPECT_EQ(Values(result->grads[0]), (std::vector<double>{1, 1}));
}

TEST_P(ToDeviceOpTest, InputsOnTwoDevicesAreRefusedNamingBoth) {
  GraphBuilder b;
  b.Leaf("x", F64({1, 2}), true)
      .Leaf("c", F64({3, 4}))
      .Op("to", {"x"}, {"y"}, ops::Attrs({{"device", GetParam()}}))
      .Op("add", {"y", "c"}, {"z"});
  auto recorded = RecordedGraph::Record(b.Build(), Limits{});
  ASSERT_FALSE(recorded.ok());
  EXPECT_EQ(recorded.status().code(), absl::StatusCode::kInvalidArgument) << recorded.status();
  EXPECT_TRUE(MessageHas(recorded.status(), GetParam()));
  EXPECT_TRUE(MessageHas(recorded.status(), "cpu"));
}

INSTANTIATE_TEST_SUITE_P(Devices, ToDeviceOpTest, ::testing::Values("sim:0", "cuda:0"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == "sim:0" ? std::string("Sim0")
                                                        : std::string("Cuda0");
                         });

// Several devices in one request (issue 34): a graph over a GPU and two simulated devices
// beside it, moved between them with `to`, each device's Nodes on its own worker thread. Its
// values and gradients match the same graph kept on the CPU, in float32 and bfloat16.
TEST(SeveralDevicesTest, OneGraphOverAGpuAndTwoSimulatedDevices) {
  RegisterTestDevices();
  std::string why;
  if (CudaDeviceCount(&why) == 0) GTEST_SKIP() << "no GPU: " << why;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    auto run = [&](bool spread, std::vector<Tensor>* values) {
      auto to = [&](const char* device) {
        return ops::Attrs({{"device", std::string(spread ? device : "cpu")}});
      };
      GraphBuilder b;
      b.Leaf("x", F64({0.5, -1.25, 2, 0.75}).To(dtype), true)
          .Leaf("w", F64({1.5, 0.25, -0.5, 1}).To(dtype), true)
          .Op("to", {"x"}, {"gx"}, to("cuda:0"))
          .Op("to", {"w"}, {"gw"}, to("cuda:0"))
          .Op("mul", {"gx", "gw"}, {"p"})  // on the GPU
          .Op("to", {"p"}, {"q"}, to("sim:0"))
          .Op("tanh", {"q"}, {"r"})  // on sim:0
          .Op("to", {"r"}, {"s"}, to("sim:1"))
          .Op("mul", {"s", "s"}, {"t"})  // on sim:1
          .Op("to", {"t"}, {"u"}, to("cuda:0"))
          .Op("add", {"u", "p"}, {"v"})  // on the GPU, from both simulated devices' work
          .Op("to", {"v"}, {"h"}, to("cpu"))
          .Op("sum", {"h"}, {"loss"});
      auto recorded = MustRecord(b.Build());
      EXPECT_NE(recorded, nullptr);
      if (recorded == nullptr) return;
      if (spread) {
        EXPECT_EQ((*recorded->Value("p")).device(), (Device{DeviceType::kCUDA, 0}));
        EXPECT_EQ((*recorded->Value("r")).device(), (Device{DeviceType::kSimulated, 0}));
        EXPECT_EQ((*recorded->Value("t")).device(), (Device{DeviceType::kSimulated, 1}));
      }
      auto result = recorded->Backward(GradCall("loss", {"x", "w"}));
      ASSERT_TRUE(result.ok()) << result.status();
      values->push_back(*recorded->Value("loss"));
      for (const Tensor& g : result->grads) {
        EXPECT_EQ(g.device(), kCPU);
        EXPECT_EQ(g.dtype(), dtype);
        values->push_back(g);
      }
    };
    std::vector<Tensor> spread, on_cpu;
    run(true, &spread);
    run(false, &on_cpu);
    ASSERT_EQ(spread.size(), 3u);
    ASSERT_EQ(on_cpu.size(), 3u);
    const double tol = dtype == DType::kFloat32 ? 1e-6 : 1e-2;
    for (size_t i = 0; i < spread.size(); ++i) {
      const std::vector<double> got = Values(spread[i]), want = Values(on_cpu[i]);
      ASSERT_EQ(got.size(), want.size());
      for (size_t j = 0; j < got.size(); ++j) {
        EXPECT_NEAR(got[j], want[j], tol * (1 + std::abs(want[j]))) << i << "[" << j << "]";
      }
    }
  }
}

TEST(ToOpTest, UnknownOrUnregisteredDeviceIsInvalidArgument) {
  RegisterTestDevices();
  for (const char* device : {"tpu:0", "sim:7"}) {
    GraphBuilder b;
    b.Leaf("x", F64({1, 2}), true)
        .Op("to", {"x"}, {"y"}, ops::Attrs({{"device", std::string(device)}}));
    auto recorded = RecordedGraph::Record(b.Build(), Limits{});
    ASSERT_FALSE(recorded.ok()) << device;
    EXPECT_EQ(recorded.status().code(), absl::StatusCode::kInvalidArgument) << recorded.status();
    EXPECT_TRUE(MessageHas(recorded.status(), device));
  }
}

TEST(ToOpTest, DtypeOnlyAndNeitherAttribute) {
  GraphBuilder b;
  b.Leaf("x", F64({1, 2}), true)
      .Op("to", {"x"}, {"y"}, ops::Attrs({{"dtype", std::string("float32")}}))
      .Op("sum", {"y"}, {"s"});
  auto recorded = MustRecord(b.Build());
  ASSERT_NE(recorded, nullptr);
  EXPECT_EQ((*recorded->Value("y")).dtype(), DType::kFloat32);
  auto result = recorded->Backward(GradCall("s", {"x"}));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->grads[0].dtype(), DType::kFloat64);

  GraphBuilder none;
  none.Leaf("x", F64({1, 2}), true).Op("to", {"x"}, {"y"});
  auto refused = RecordedGraph::Record(none.Build(), Limits{});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MessageHas(refused.status(), "device"));
}

}  // namespace
}  // namespace gradserve::graph::testing
