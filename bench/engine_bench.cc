// engine_bench: the engine scenarios of DESIGN.md section 6, built with the ops' C++ API and
// timed backward only: from autograd::Grad's call to its return (Engine::execute to the
// GraphTask's future resolved). Each repetition records a fresh graph (not timed), since a
// backward without retain_graph frees it. Prints one JSON object per line; bench/run reads
// them and torch_engine.py prints the same for PyTorch.
//
//   engine_bench --scenario=all --repeats=7 --threads=1
//   engine_bench --scenario=all --limits   (under a budget and a token, as the server runs)
//   engine_bench --scenario=mlp --memory   (run once in this fresh process; report its memory)
//   engine_bench --device=cuda:0 --scenario=all,mlp_big   (on a GPU; torch_engine.py --device cuda)
//   engine_bench --scenario=stop_latency   (how long after a deadline each long op stops)

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cblas.h"
#include "engine/autograd/autograd.h"
#include "engine/device/device_registry.h"
#include "engine/ops/cuda_ops.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/linalg.h"
#include "engine/ops/nn.h"
#include "engine/ops/op_registry.h"
#include "engine/ops/reductions.h"
#include "engine/ops/shape.h"
#include "engine/tensor/memory_budget.h"
#include "engine/tensor/tensor.h"
#include "engine/util/cancellation.h"
#include "engine/util/parallel.h"
#include "engine/util/status_error.h"
#include "program/flag_arguments.h"
#include "program/host_malloc.h"
#include "program/process_start.h"

ABSL_FLAG(std::string, scenario, "all",
          "Comma-separated: chain_10k, fanin_2k, mlp, mlp_big (batch 4096, width 4096, depth 4: "
          "for GPUs), mlp_big_bf16 (mlp_big in bfloat16), or all (the first three); or "
          "stop_latency alone: how long after its "
          "deadline each of a list of long ops stops.");
ABSL_FLAG(std::string, device, "cpu",
          "Where the graph's tensors live: cpu, or cuda:N (registers the GPUs first).");
ABSL_FLAG(int, repeats, 7, "Timed backward passes per scenario; the median is reported.");
ABSL_FLAG(int, warmup, 1, "Untimed passes before them.");
ABSL_FLAG(int, threads, 1,
          "OpenBLAS threads, and the threads that may share one long elementwise loop or sum "
          "(Note [Intra-op parallelism]); the engine's Nodes run on one thread. OpenBLAS starts "
          "its pool when it loads, one thread per CPU unless OPENBLAS_NUM_THREADS says "
          "otherwise, and its threads spin for about 0.1 s before they sleep: set "
          "OPENBLAS_NUM_THREADS to this count too, as bench/run does (Note [OpenBLAS's "
          "threads]).");
ABSL_FLAG(bool, memory, false,
          "Run the scenario once and report this process's peak memory instead of times.");
ABSL_FLAG(bool, limits, false,
          "Record each graph under a MemoryBudget and run its backward under that budget and a "
          "CancellationToken whose deadline is an hour ahead, as the server does, so that the "
          "budget's charges and the token's checks run.");
ABSL_FLAG(int, stop_after_ms, 100,
          "stop_latency: how far ahead of each op's start its deadline is.");
ABSL_FLAG(bool, stop_full, false,
          "stop_latency: also time each op once to its end, or to a deadline 60 s ahead (the "
          "int64 product takes minutes), as full_ms.");

namespace gradserve::bench {
namespace {

// A recorded graph: the loss to differentiate and the inputs to differentiate it by.
struct Graph {
  Tensor loss;
  TensorList inputs;
};

// Where the scenarios' tensors are made (--device).
Device bench_device = kCPU;

Tensor Leaf(Tensor t) {
  t.set_requires_grad(true);
  return t;
}

// n floats in [-scale, scale) from a fixed sequence, on bench_device.
Tensor Values(std::vector<int64_t> shape, float scale, uint64_t seed) {
  Tensor t = Tensor::Empty(shape, DType::kFloat32);
  uint64_t state = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  float* data = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    data[i] = static_cast<float>((2 * (static_cast<double>(state >> 11) * 0x1.0p-53) - 1) * scale);
  }
  return t.To(bench_device);
}

// x = [0.5]; 10 000 times y = tanh(y * 1.0001); loss = y.sum().
Graph Chain10k() {
  Tensor x = Leaf(Tensor::Full({1}, 0.5, DType::kFloat32, bench_device));
  Tensor y = x;
  for (int i = 0; i < 10'000; ++i) y = ops::tanh(ops::mul(y, 1.0001));
  return {ops::sum(y), {x}};
}

// x = 16 floats; acc = x * 0; 2000 times acc = acc + sin(x * (1 + i * 1e-3)); loss = acc.sum().
Graph Fanin2k() {
  Tensor x = Leaf(Values({16}, 1, 3));
  Tensor acc = ops::mul(x, 0.0);
  for (int i = 0; i < 2000; ++i) acc = ops::add(acc, ops::sin(ops::mul(x, 1 + i * 1e-3)));
  return {ops::sum(acc), {x}};
}

// An op through the op registry, as a request runs it: for the 16-bit dtypes, whose ops
// compute in float32 there (Note [Ops on 16-bit floats]).
Tensor RegistryOp(const char* name, const TensorList& inputs) {
  return ops::OpRegistry::Get().Find(name)->run(inputs, {}).at(0);
}

// x = [batch, width] (no grad); four [width, width] weights; h = relu(h @ w); loss = h.sum().
// mlp is batch 256, width 1024; mlp_big, batch 4096, width 4096, fills a GPU; mlp_big_bf16 is
// mlp_big in bfloat16.
Graph Mlp(int64_t batch, int64_t width, DType dtype = DType::kFloat32) {
  const bool registry = dtype != DType::kFloat32;
  Tensor h = Values({batch, width}, 1, 4).To(dtype);
  TensorList weights;
  for (int layer = 0; layer < 4; ++layer) {
    weights.push_back(Leaf(
        Values({width, width}, 1.0f / std::sqrt(static_cast<float>(width)), 10 + layer).To(dtype)));
    const Tensor product = ops::matmul(h, weights.back());
    h = registry ? RegistryOp("relu", {product}) : ops::relu(product);
  }
  return {registry ? RegistryOp("sum", {h}) : ops::sum(h), weights};
}

Graph Build(const std::string& scenario) {
  if (scenario == "chain_10k") return Chain10k();
  if (scenario == "fanin_2k") return Fanin2k();
  if (scenario == "mlp_big") return Mlp(4096, 4096);
  if (scenario == "mlp_big_bf16") return Mlp(4096, 4096, DType::kBFloat16);
  return Mlp(256, 1024);
}

int64_t MinorFaults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// One timed backward pass: its wall time and the page faults (first touches of fresh memory)
// during it.
struct Pass {
  double ms = 0;
  int64_t faults = 0;
};

// Times one backward pass of a fresh graph. The graph is torn down after the clock stops.
// With --limits the graph is recorded under a MemoryBudget, and the backward runs under it and
// under a token whose deadline is an hour ahead, as the server runs a request.
Pass TimeBackward(const std::string& scenario) {
  const bool limits = absl::GetFlag(FLAGS_limits);
  std::shared_ptr<MemoryBudget> budget;
  if (limits) budget = MemoryBudget::Make();
  Graph g;
  {
    std::optional<MemoryBudgetScope> scope;
    if (limits) scope.emplace(budget);
    g = Build(scenario);
  }
  autograd::BackwardOptions options;
  // The graph is this pass's alone, as a request's is to the server's (Note [Fewer atomics per
  // Node] in engine/autograd/engine.cc).
  options.sole_pass = true;
  if (limits) {
    options.budget = budget;
    options.cancel = std::make_shared<CancellationToken>(absl::Now() + absl::Hours(1));
  }
  // A GPU may still be running the forward pass: the clock starts when it is done, as
  // torch_engine.py's torch.cuda.synchronize() does.
  if (!bench_device.is_cpu()) {
    DeviceRegistry::Get().backend(bench_device.type)->Synchronize(bench_device.index);
  }
  const int64_t faults_before = MinorFaults();
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<TensorList> grads = autograd::Grad({g.loss}, {Tensor()}, g.inputs, options);
  const auto end = std::chrono::steady_clock::now();
  const int64_t faults = MinorFaults() - faults_before;
  if (!grads.ok()) {
    std::fprintf(stderr, "engine_bench: %s: %s\n", scenario.c_str(),
                 grads.status().ToString().c_str());
    std::exit(1);
  }
  return {std::chrono::duration<double, std::milli>(end - start).count(), faults};
}

int64_t ResidentKb() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

void Times(const std::string& scenario, int repeats, int warmup, int threads) {
  for (int i = 0; i < warmup; ++i) TimeBackward(scenario);
  std::vector<double> ms;
  int64_t faults = 0;
  for (int i = 0; i < repeats; ++i) {
    const Pass pass = TimeBackward(scenario);
    ms.push_back(pass.ms);
    faults += pass.faults;
  }
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  std::printf(
      "{\"impl\": \"gradserve\", \"scenario\": \"%s\", \"device\": \"%s\", "
      "\"threads\": %d, \"malloc\": \"%s\", \"limits\": %s, \"median_ms\": %.4f, "
      "\"page_faults_per_pass\": %lld, \"times_ms\": [%s]}\n",
      scenario.c_str(), DeviceName(bench_device).c_str(), threads, kProcessMallocName,
      absl::GetFlag(FLAGS_limits) ? "true" : "false", sorted[sorted.size() / 2],
      static_cast<long long>(faults / repeats),
      absl::StrJoin(ms, ", ", [](std::string* out, double v) {
        absl::StrAppendFormat(out, "%.4f", v);
      }).c_str());
  std::fflush(stdout);
}

// Forward and backward once, under a MemoryBudget, in this fresh process.
void Memory(const std::string& scenario, int threads) {
  const int64_t before_kb = ResidentKb();
  auto budget = MemoryBudget::Make();
  {
    MemoryBudgetScope scope(budget);
    Graph g = Build(scenario);
    autograd::BackwardOptions options;
    options.budget = budget;
    absl::StatusOr<TensorList> grads = autograd::Grad({g.loss}, {Tensor()}, g.inputs, options);
    if (!grads.ok()) {
      std::fprintf(stderr, "engine_bench: %s\n", grads.status().ToString().c_str());
      std::exit(1);
    }
  }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  std::printf(
      "{\"impl\": \"gradserve\", \"scenario\": \"%s\", \"threads\": %d, "
      "\"maxrss_kb\": %ld, \"rss_before_kb\": %lld, \"budget_peak_bytes\": %lld}\n",
      scenario.c_str(), threads, usage.ru_maxrss, static_cast<long long>(before_kb),
      static_cast<long long>(budget->peak()));
}

// --- stop_latency: Note [Stopping a running op] (engine/util/cancellation.h). ---

// One op that a single call can keep busy for seconds, on inputs made once (untimed).
struct LongOp {
  std::string name;
  std::function<std::function<void()>()> make;  // makes the inputs; returns the call
};

Tensor Filled(std::vector<int64_t> shape, double value, DType dtype) {
  return Tensor::Full(shape, value, dtype);
}

std::vector<LongOp> LongOps() {
  using F = std::function<void()>;
  return {
      {"matmul f32 6144^3",
       [] {
         Tensor a = Filled({6144, 6144}, 0.5, DType::kFloat32), b = a.Clone();
         return F([=] { ops::matmul(a, b); });
       }},
      {"matmul f64 4096^3",
       [] {
         Tensor a = Filled({4096, 4096}, 0.5, DType::kFloat64), b = a.Clone();
         return F([=] { ops::matmul(a, b); });
       }},
      {"matmul int64 1536^3",
       [] {
         Tensor a = Filled({1536, 1536}, 3, DType::kInt64), b = a.Clone();
         return F([=] { ops::matmul(a, b); });
       }},
      {"matmul f32 batched 64 x 1024^3",
       [] {
         Tensor a = Filled({64, 1024, 1024}, 0.5, DType::kFloat32), b = a.Clone();
         return F([=] { ops::matmul(a, b); });
       }},
      {"matmul f32 backward 4096^3 (Engine)",
       [] {
         Tensor a = Leaf(Filled({4096, 4096}, 0.5, DType::kFloat32));
         Tensor b = Leaf(Filled({4096, 4096}, 0.25, DType::kFloat32));
         Tensor loss = ops::sum(ops::matmul(a, b));
         return F([=] {
           autograd::BackwardOptions options;
           options.retain_graph = true;
           options.cancel =
               std::make_shared<CancellationToken>(CurrentCancellationToken()->deadline());
           ThrowIfError(autograd::Grad({loss}, {Tensor()}, {a, b}, options).status());
         });
       }},
      {"conv2d f32 [8, 64, 128, 128] * [128, 64, 7, 7]",
       [] {
         Tensor x = Filled({8, 64, 128, 128}, 0.5, DType::kFloat32);
         Tensor w = Filled({128, 64, 7, 7}, 0.01, DType::kFloat32);
         ops::Conv2dOptions options;
         options.padding = {3, 3};
         return F([=] { ops::conv2d(x, w, Tensor(), options); });
       }},
      {"softmax f32 [1, 2^27]",
       [] {
         Tensor x = Filled({1, int64_t{1} << 27}, 0.5, DType::kFloat32);
         return F([=] { ops::softmax(x, 1); });
       }},
      {"layer_norm f32 [2, 2^26]",
       [] {
         Tensor x = Filled({2, int64_t{1} << 26}, 0.5, DType::kFloat32);
         return F([=] { ops::layer_norm(x, {int64_t{1} << 26}); });
       }},
      {"exp f32 2^28",
       [] {
         Tensor x = Filled({int64_t{1} << 28}, 0.5, DType::kFloat32);
         return F([=] { ops::exp(x); });
       }},
      {"mul broadcast f32 [16384, 1] * [1, 16384]",
       [] {
         Tensor a = Filled({16384, 1}, 0.5, DType::kFloat32);
         Tensor b = Filled({1, 16384}, 0.5, DType::kFloat32);
         return F([=] { ops::mul(a, b); });
       }},
      {"sum f64 over dim 0 of [2^14, 2^14]",
       [] {
         Tensor x = Filled({16384, 16384}, 0.5, DType::kFloat64);
         return F([=] { ops::sum(x, {0}); });
       }},
      {"cat f64 2 x 2^27",
       [] {
         Tensor x = Filled({int64_t{1} << 27}, 0.5, DType::kFloat64);
         return F([=] { ops::cat({x, x}); });
       }},
      {"index_select f32 2^27 rows of 1",
       [] {
         Tensor x = Filled({int64_t{1} << 27}, 0.5, DType::kFloat32);
         Tensor index = Tensor::Zeros({int64_t{1} << 27}, DType::kInt64);
         return F([=] { ops::index_select(x, 0, index); });
       }},
  };
}

// Runs each long op --repeats times, each under a token whose deadline is --stop_after_ms after
// the call starts, and prints how long after the deadline the call returned (late_ms).
void StopLatency(int repeats) {
  const absl::Duration after = absl::Milliseconds(absl::GetFlag(FLAGS_stop_after_ms));
  for (const LongOp& op : LongOps()) {
    std::function<void()> call = op.make();
    double full_ms = -1;
    if (absl::GetFlag(FLAGS_stop_full)) {
      const absl::Time start = absl::Now();
      CancellationToken cap(start + absl::Seconds(60));
      CancellationScope scope(&cap);
      try {
        call();
      } catch (const StatusError&) {
        // Stopped at the cap: full_ms is then about 60000.
      }
      full_ms = absl::ToDoubleMilliseconds(absl::Now() - start);
    }
    std::vector<double> late_ms;
    std::string status = "OK";
    for (int i = 0; i < repeats; ++i) {
      const absl::Time deadline = absl::Now() + after;
      CancellationToken token(deadline);
      CancellationScope scope(&token);
      try {
        call();
        status = "OK";
      } catch (const StatusError& e) {
        status = std::string(absl::StatusCodeToString(e.status().code()));
      }
      late_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - deadline));
    }
    std::vector<double> sorted = late_ms;
    std::sort(sorted.begin(), sorted.end());
    std::printf(
        "{\"impl\": \"gradserve\", \"scenario\": \"stop_latency\", \"op\": \"%s\", "
        "\"deadline_after_ms\": %lld, \"status\": \"%s\", \"median_late_ms\": %.1f, "
        "\"max_late_ms\": %.1f, \"full_ms\": %.0f, \"late_ms\": [%s]}\n",
        op.name.c_str(), static_cast<long long>(absl::ToInt64Milliseconds(after)), status.c_str(),
        sorted[sorted.size() / 2], sorted.back(), full_ms,
        absl::StrJoin(late_ms, ", ", [](std::string* out, double v) {
          absl::StrAppendFormat(out, "%.1f", v);
        }).c_str());
    std::fflush(stdout);
  }
}

int Main() {
  StartProcess();  // as the server does (Note [The server's malloc])
  const int threads = absl::GetFlag(FLAGS_threads);
  if (const char* pool = std::getenv("OPENBLAS_NUM_THREADS");
      pool == nullptr || std::string(pool) != absl::StrCat(threads)) {
    std::fprintf(stderr,
                 "engine_bench: OPENBLAS_NUM_THREADS is %s, not %d: OpenBLAS's own threads may "
                 "spin beside the first passes (see --threads)\n",
                 pool == nullptr ? "unset" : pool, threads);
  }
  openblas_set_num_threads(threads);
  SetIntraOpThreads(threads);  // Note [Intra-op parallelism], as torch.set_num_threads
  absl::StatusOr<Device> device = ParseDevice(absl::GetFlag(FLAGS_device));
  if (!device.ok()) {
    std::fprintf(stderr, "engine_bench: --device: %s\n", device.status().ToString().c_str());
    return 2;
  }
  bench_device = *device;
  if (bench_device.type == DeviceType::kCUDA) {
    if (absl::Status s = RegisterCudaDevices(); !s.ok()) {
      std::fprintf(stderr, "engine_bench: --device=%s: %s\n", DeviceName(bench_device).c_str(),
                   s.ToString().c_str());
      return 2;
    }
  } else if (!bench_device.is_cpu()) {
    std::fprintf(stderr, "engine_bench: --device must be cpu or cuda:N\n");
    return 2;
  }
  if (absl::GetFlag(FLAGS_scenario) == "stop_latency") {
    if (!bench_device.is_cpu()) {
      std::fprintf(stderr, "engine_bench: stop_latency runs on the cpu only\n");
      return 2;
    }
    StopLatency(absl::GetFlag(FLAGS_repeats));
    return 0;
  }
  const std::vector<std::string> known = {"chain_10k", "fanin_2k", "mlp", "mlp_big",
                                          "mlp_big_bf16"};
  std::vector<std::string> scenarios;
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_scenario), ',')) {
    if (name == "all") {
      scenarios.insert(scenarios.end(), known.begin(), known.begin() + 3);
    } else if (std::find(known.begin(), known.end(), name) != known.end()) {
      scenarios.emplace_back(name);
    } else {
      std::fprintf(stderr, "engine_bench: unknown scenario %s\n", std::string(name).c_str());
      return 2;
    }
  }
  for (const std::string& s : scenarios) {
    if (absl::GetFlag(FLAGS_memory)) {
      Memory(s, threads);
    } else {
      Times(s, absl::GetFlag(FLAGS_repeats), absl::GetFlag(FLAGS_warmup), threads);
    }
  }
  return 0;
}

}  // namespace
}  // namespace gradserve::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "the engine scenarios (DESIGN.md section 6), timed backward only; one JSON "
      "object per line.\nUsage: engine_bench [--scenario=all] [--repeats=7] [--threads=1] "
      "[--memory] [--limits] [--device=cpu]\n       engine_bench --scenario=stop_latency "
      "[--repeats=7] [--stop_after_ms=100] [--stop_full]");
  // Note [Flag spelling], Note [Flags checked first]
  if (!gradserve::ParseFlags(argc, argv, "engine_bench").has_value()) return 2;
  return gradserve::bench::Main();
}
