// engine_bench: the engine scenarios of DESIGN.md section 6, built with the ops' C++ API and
// timed backward only: from autograd::Grad's call to its return (Engine::execute to the
// GraphTask's future resolved). Each repetition records a fresh graph (not timed), since a
// backward without retain_graph frees it. Prints one JSON object per line; bench/run reads
// them and torch_engine.py prints the same for PyTorch.
//
//   engine_bench --scenario=all --repeats=7 --threads=1
//   engine_bench --scenario=mlp --memory   (run once in this fresh process; report its memory)
//   engine_bench --device=cuda:0 --scenario=all,mlp_big   (on a GPU; torch_engine.py --device cuda)

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cblas.h"
#include "engine/autograd/autograd.h"
#include "engine/device/device_registry.h"
#include "engine/ops/cuda_ops.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/linalg.h"
#include "engine/ops/reductions.h"
#include "engine/tensor/memory_budget.h"
#include "engine/tensor/tensor.h"
#include "program/flag_arguments.h"
#include "program/host_malloc.h"
#include "program/process_start.h"

ABSL_FLAG(std::string, scenario, "all",
          "Comma-separated: chain_10k, fanin_2k, mlp, mlp_big (batch 4096, width 4096, depth 4: "
          "for GPUs), or all (the first three).");
ABSL_FLAG(std::string, device, "cpu",
          "Where the graph's tensors live: cpu, or cuda:N (registers the GPUs first).");
ABSL_FLAG(int, repeats, 7, "Timed backward passes per scenario; the median is reported.");
ABSL_FLAG(int, warmup, 1, "Untimed passes before them.");
ABSL_FLAG(int, threads, 1, "OpenBLAS threads (the engine's own CPU work is on one thread).");
ABSL_FLAG(bool, memory, false,
          "Run the scenario once and report this process's peak memory instead of times.");

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

// x = [batch, width] (no grad); four [width, width] weights; h = relu(h @ w); loss = h.sum().
// mlp is batch 256, width 1024; mlp_big, batch 4096, width 4096, fills a GPU.
Graph Mlp(int64_t batch, int64_t width) {
  Tensor h = Values({batch, width}, 1, 4);
  TensorList weights;
  for (int layer = 0; layer < 4; ++layer) {
    weights.push_back(
        Leaf(Values({width, width}, 1.0f / std::sqrt(static_cast<float>(width)), 10 + layer)));
    h = ops::relu(ops::matmul(h, weights.back()));
  }
  return {ops::sum(h), weights};
}

Graph Build(const std::string& scenario) {
  if (scenario == "chain_10k") return Chain10k();
  if (scenario == "fanin_2k") return Fanin2k();
  if (scenario == "mlp_big") return Mlp(4096, 4096);
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
Pass TimeBackward(const std::string& scenario) {
  Graph g = Build(scenario);
  autograd::BackwardOptions options;
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
      "\"threads\": %d, \"malloc\": \"%s\", \"median_ms\": %.4f, \"page_faults_per_pass\": %lld, "
      "\"times_ms\": [%s]}\n",
      scenario.c_str(), DeviceName(bench_device).c_str(), threads, kProcessMallocName,
      sorted[sorted.size() / 2], static_cast<long long>(faults / repeats),
      absl::StrJoin(ms, ", ", [](std::string* out, double v) {
        absl::StrAppendFormat(out, "%.4f", v);
      }).c_str());
  std::fflush(stdout);
}

// Forward and backward once, under a MemoryBudget, in this fresh process.
void Memory(const std::string& scenario, int threads) {
  const int64_t before_kb = ResidentKb();
  auto budget = std::make_shared<MemoryBudget>();
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

int Main() {
  StartProcess();  // as the server does (Note [The server's malloc])
  const int threads = absl::GetFlag(FLAGS_threads);
  openblas_set_num_threads(threads);
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
  const std::vector<std::string> known = {"chain_10k", "fanin_2k", "mlp", "mlp_big"};
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
      "[--memory] [--device=cpu]");
  // Note [Flag spelling], Note [Flags checked first]
  if (!gradserve::ParseFlags(argc, argv, "engine_bench").has_value()) return 2;
  return gradserve::bench::Main();
}
