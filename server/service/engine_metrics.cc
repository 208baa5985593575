#include "server/service/engine_metrics.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/autograd/busy_time.h"
#include "engine/device/device_registry.h"

namespace gradserve::server {

void WriteEngineMetrics(metrics::TextWriter* out) {
  std::vector<std::pair<std::string, MemoryStats>> memory;
  DeviceRegistry& registry = DeviceRegistry::Get();
  for (const Device& device : registry.devices()) {
    if (std::optional<MemoryStats> stats = registry.allocator(device)->memory_stats()) {
      memory.emplace_back(DeviceName(device), *stats);
    }
  }
  struct Gauge {
    const char* name;
    const char* help;
    int64_t MemoryStats::*field;
  };
  for (const Gauge& g : {
           Gauge{"gradserve_device_memory_allocated_bytes",
                 "Bytes a device's allocator has handed out to tensors and working buffers now.",
                 &MemoryStats::allocated_bytes},
           Gauge{"gradserve_device_memory_reserved_bytes",
                 "Bytes a device's allocator holds now: allocated and cached for reuse.",
                 &MemoryStats::reserved_bytes},
           Gauge{"gradserve_device_memory_peak_allocated_bytes",
                 "The most gradserve_device_memory_allocated_bytes has been (GPUs only).",
                 &MemoryStats::peak_allocated_bytes},
       }) {
    out->Family(g.name, "gauge", g.help);
    for (const auto& [device, stats] : memory) {
      if (stats.*g.field < 0) continue;  // not kept by this allocator
      out->Sample(g.name, {{"device", device}}, stats.*g.field);
    }
  }
  out->Family("gradserve_engine_busy_seconds_total", "counter",
              "Time Engine threads spent in backward passes (not waiting for a task), by kind: "
              "owner (request workers, gRPC threads), device (a GPU's worker), reentrant (the "
              "pool for deep nested backwards).");
  for (int k = 0; k < autograd::kEngineThreadKinds; ++k) {
    const auto kind = static_cast<autograd::EngineThread>(k);
    out->Sample("gradserve_engine_busy_seconds_total",
                {{"thread", autograd::EngineThreadName(kind)}},
                static_cast<double>(autograd::EngineBusyNanos(kind)) / 1e9);
  }
}

}  // namespace gradserve::server
