#include "engine/device/device_registry.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/util/status_error.h"

namespace gradserve {
namespace {

class CpuBackend final : public DeviceBackend {
 public:
  DeviceType type() const override { return DeviceType::kCPU; }
  int device_count() const override { return 1; }
  Allocator* allocator(int) override { return CpuAllocator(); }
  bool host_accessible() const override { return true; }
  void Copy(void* dst, Device, const void* src, Device, size_t nbytes) override {
    if (nbytes > 0) std::memcpy(dst, src, nbytes);
  }
  std::string Describe(int) const override { return "host CPU"; }
};

}  // namespace

DeviceRegistry& DeviceRegistry::Get() {
  static DeviceRegistry* const registry = new DeviceRegistry;
  return *registry;
}

DeviceRegistry::DeviceRegistry() {
  backends_[static_cast<int>(DeviceType::kCPU)].store(new CpuBackend, std::memory_order_release);
}

absl::Status DeviceRegistry::Register(std::unique_ptr<DeviceBackend> backend) {
  DeviceBackend* expected = nullptr;
  auto& slot = backends_[static_cast<int>(backend->type())];
  // Backends live for the whole process (worker threads may hold them), so the registry owns
  // them through a deliberate release.
  if (!slot.compare_exchange_strong(expected, backend.get(), std::memory_order_acq_rel)) {
    return absl::AlreadyExistsError(
        absl::StrCat("a backend for ", DeviceTypeName(backend->type()), " is already registered"));
  }
  backend.release();
  return absl::OkStatus();
}

absl::Status DeviceRegistry::Validate(Device device) const {
  DeviceBackend* b = backend(device.type);
  if (b == nullptr || device.index < 0 || device.index >= b->device_count()) {
    return absl::InvalidArgumentError(
        absl::StrCat("device ", DeviceName(device), " is not available on this server"));
  }
  return absl::OkStatus();
}

Allocator* DeviceRegistry::allocator(Device device) const {
  if (device.is_cpu()) return CpuAllocator();
  ThrowIfError(Validate(device));
  return backend(device.type)->allocator(device.index);
}

bool DeviceRegistry::host_accessible(Device device) const {
  DeviceBackend* b = backend(device.type);
  return b != nullptr && b->host_accessible();
}

std::vector<Device> DeviceRegistry::devices() const {
  std::vector<Device> out;
  for (int t = 0; t < kNumDeviceTypes; ++t) {
    DeviceBackend* b = backends_[t].load(std::memory_order_acquire);
    if (b == nullptr) continue;
    for (int i = 0; i < b->device_count(); ++i) {
      out.push_back(Device{static_cast<DeviceType>(t), static_cast<int16_t>(i)});
    }
  }
  return out;
}

}  // namespace gradserve
