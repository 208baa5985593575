// The simulated accelerator: host memory behind the accelerator interface.
//
// Its tensors are ordinary host memory (so the CPU kernels compute on them), but they carry a
// device tag of their own, and the Engine gives each simulated device its own ready queue and
// worker thread. That makes every cross-device path of the Engine (device ready queues, the
// owner's wake-up task, InputBuffer's choice of device) testable without a GPU.

#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/device/device_registry.h"

namespace gradserve {
namespace {

class SimulatedAllocator final : public Allocator {
 public:
  explicit SimulatedAllocator(int index) : device_{DeviceType::kSimulated, int16_t(index)} {}
  void* Allocate(size_t nbytes) override { return CpuAllocator()->Allocate(nbytes); }
  void Deallocate(void* ptr, size_t nbytes) override { CpuAllocator()->Deallocate(ptr, nbytes); }
  Device device() const override { return device_; }

 private:
  const Device device_;
};

class SimulatedBackend final : public DeviceBackend {
 public:
  explicit SimulatedBackend(int count) {
    for (int i = 0; i < count; ++i) allocators_.push_back(std::make_unique<SimulatedAllocator>(i));
  }
  DeviceType type() const override { return DeviceType::kSimulated; }
  int device_count() const override { return static_cast<int>(allocators_.size()); }
  Allocator* allocator(int index) override { return allocators_[index].get(); }
  bool host_accessible() const override { return true; }
  void Copy(void* dst, Device, const void* src, Device, size_t nbytes) override {
    if (nbytes > 0) std::memcpy(dst, src, nbytes);
  }
  std::string Describe(int index) const override {
    return absl::StrCat("simulated accelerator ", index, " (host memory)");
  }

 private:
  std::vector<std::unique_ptr<SimulatedAllocator>> allocators_;
};

}  // namespace

absl::Status RegisterSimulatedDevices(int count) {
  if (count <= 0 || count > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("simulated device count must be in [1, 64], got ", count));
  }
  return DeviceRegistry::Get().Register(std::make_unique<SimulatedBackend>(count));
}

}  // namespace gradserve
