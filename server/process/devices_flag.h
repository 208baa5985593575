// The server's --devices flag: which devices requests may name, besides the CPU.

#ifndef GRADSERVE_SERVER_PROCESS_DEVICES_FLAG_H_
#define GRADSERVE_SERVER_PROCESS_DEVICES_FLAG_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradserve::server {

// What --devices asks for. The CPU is always available.
struct DeviceSelection {
  // Every GPU the CUDA driver shows (none is fine only for "all").
  bool all_gpus = false;
  // "cuda" or "cuda:N" was named: at least one GPU is required.
  bool gpus_required = false;
  // Physical GPU indices (among CudaDeviceCount()), in the order named; empty with all_gpus.
  // They become cuda:0, cuda:1, ... in that order, as CUDA_VISIBLE_DEVICES does.
  std::vector<int> gpus;
};

// Parses --devices: "all" (the CPU and every GPU found, none being fine), or a comma-separated
// list of "cpu", "cuda" (every GPU, at least one) and "cuda:N" (GPU N). Simulated devices have
// their own flag (--simulated_devices). Errors: INVALID_ARGUMENT naming --devices.
absl::StatusOr<DeviceSelection> ParseDevicesFlag(absl::string_view spec);

// Registers the GPUs of a selection with the CUDA backend (RegisterCudaDevices). Errors:
// FAILED_PRECONDITION naming --devices and the missing GPU, with why none is there (no CUDA
// backend, no driver, fewer GPUs), when the selection names a GPU that does not exist.
// On success, *registered (if given) gets one line per GPU registered ("cuda:0 = GPU 1").
absl::Status RegisterSelectedDevices(const DeviceSelection& selection,
                                     std::vector<std::string>* registered = nullptr);

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_PROCESS_DEVICES_FLAG_H_
