#include "server/process/devices_flag.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "engine/ops/cuda_ops.h"

namespace gradserve::server {

absl::StatusOr<DeviceSelection> ParseDevicesFlag(absl::string_view spec) {
  DeviceSelection selection;
  spec = absl::StripAsciiWhitespace(spec);
  if (spec == "all") {
    selection.all_gpus = true;
    return selection;
  }
  if (spec.empty()) {
    return absl::InvalidArgumentError(
        "--devices is empty; give 'all' or a list such as 'cpu', 'cpu,cuda', 'cuda:0,cuda:1'");
  }
  for (absl::string_view item : absl::StrSplit(spec, ',')) {
    item = absl::StripAsciiWhitespace(item);
    if (item == "cpu") continue;
    if (item == "cuda") {
      selection.all_gpus = true;
      selection.gpus_required = true;
      continue;
    }
    int index = -1;
    if (absl::ConsumePrefix(&item, "cuda:")) {
      if (!absl::SimpleAtoi(item, &index) || index < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("--devices: 'cuda:", item, "' is not a GPU; write cuda:N with N >= 0"));
      }
      if (std::find(selection.gpus.begin(), selection.gpus.end(), index) != selection.gpus.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--devices: cuda:", index, " is named twice"));
      }
      selection.gpus.push_back(index);
      selection.gpus_required = true;
      continue;
    }
    if (item == "all") {
      return absl::InvalidArgumentError("--devices: 'all' cannot be combined with other devices");
    }
    if (item == "sim" || absl::StartsWith(item, "sim:")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--devices: '", item, "': simulated devices are registered with --simulated_devices=N"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("--devices: unknown device '", item,
                     "'; give 'all' or a comma-separated list of cpu, cuda and cuda:N"));
  }
  if (selection.all_gpus && !selection.gpus.empty()) {
    return absl::InvalidArgumentError(
        "--devices: 'cuda' (every GPU) cannot be combined with 'cuda:N'");
  }
  return selection;
}

absl::Status RegisterSelectedDevices(const DeviceSelection& selection,
                                     std::vector<std::string>* registered) {
  if (!selection.all_gpus && selection.gpus.empty()) return absl::OkStatus();
  std::string why_none;
  const int count = CudaDeviceCount(&why_none);
  if (count == 0) {
    if (!selection.gpus_required) return absl::OkStatus();  // "all" on a machine without GPU
    const std::string asked =
        selection.gpus.empty() ? std::string("cuda") : absl::StrCat("cuda:", selection.gpus[0]);
    return absl::FailedPreconditionError(absl::StrCat(
        "--devices: ", asked, " does not exist: no GPU is available (", why_none, ")"));
  }
  for (int index : selection.gpus) {
    if (index >= count) {
      return absl::FailedPreconditionError(
          absl::StrCat("--devices: cuda:", index, " does not exist: this machine has ", count,
                       " GPU", count == 1 ? "" : "s", " (cuda:0",
                       count > 1 ? absl::StrCat("..cuda:", count - 1) : "", ")"));
    }
  }
  if (absl::Status s = RegisterCudaDevices(selection.gpus); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("--devices: ", s.message()));
  }
  if (registered != nullptr) {
    const int n = selection.all_gpus ? count : static_cast<int>(selection.gpus.size());
    for (int i = 0; i < n; ++i) {
      registered->push_back(
          absl::StrCat("cuda:", i, " = GPU ", selection.all_gpus ? i : selection.gpus[i]));
    }
  }
  return absl::OkStatus();
}

}  // namespace gradserve::server
