// The engine's side of /metrics: memory by device and the Engine threads' busy time.

#ifndef GRADSERVE_SERVER_SERVICE_ENGINE_METRICS_H_
#define GRADSERVE_SERVER_SERVICE_ENGINE_METRICS_H_

#include "server/metrics/text_format.h"

namespace gradserve::server {

// Writes gradserve_device_memory_allocated_bytes, gradserve_device_memory_reserved_bytes and
// gradserve_device_memory_peak_allocated_bytes, by device (each device whose allocator keeps a
// count: the CPU always, every registered GPU; a simulated device's memory is the CPU's), and
// gradserve_engine_busy_seconds_total by kind of Engine thread (Note [Engine busy time] in
// engine/autograd/busy_time.h). Everything is read now, from the allocators' and the Engine's
// own counters: nothing is added to a call's path for it. The device label is the device's
// name ("cpu", "cuda:0"), one of a fixed few (Note [Label values]).
//
// Thread safety: may be called from several scrapes at once, while calls run.
void WriteEngineMetrics(metrics::TextWriter* out);

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_SERVICE_ENGINE_METRICS_H_
