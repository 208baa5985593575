#include "engine/device/device.h"

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/util/quote.h"

namespace gradserve {

const char* DeviceTypeName(DeviceType type) {
  switch (type) {
    case DeviceType::kCPU:
      return "cpu";
    case DeviceType::kSimulated:
      return "sim";
    case DeviceType::kCUDA:
      return "cuda";
  }
  return "invalid";
}

std::string DeviceName(Device device) {
  if (device.is_cpu()) return "cpu";
  return absl::StrCat(DeviceTypeName(device.type), ":", device.index);
}

absl::StatusOr<Device> ParseDevice(absl::string_view name) {
  absl::string_view type_name = name;
  absl::string_view index_text;
  if (size_t colon = name.find(':'); colon != absl::string_view::npos) {
    type_name = name.substr(0, colon);
    index_text = name.substr(colon + 1);
  }
  Device device;
  if (type_name == "cpu") {
    device.type = DeviceType::kCPU;
  } else if (type_name == "sim") {
    device.type = DeviceType::kSimulated;
  } else if (type_name == "cuda") {
    device.type = DeviceType::kCUDA;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown device ", Quote(name), ": expected cpu, cuda:N or sim:N"));
  }
  if (index_text.empty()) {
    // Note [Bare device names]
    const DeviceChoice choice = CurrentDeviceChoice();
    if (device.type == DeviceType::kCUDA) device.index = choice.cuda;
    if (device.type == DeviceType::kSimulated) device.index = choice.sim;
  } else {
    int index = 0;
    if (!absl::SimpleAtoi(index_text, &index) || index < 0 || index > 1023 ||
        (device.is_cpu() && index != 0)) {
      return absl::InvalidArgumentError(absl::StrCat("bad device index in ", Quote(name)));
    }
    device.index = static_cast<int16_t>(index);
  }
  return device;
}

}  // namespace gradserve
