// KernelStub: one kernel entry point with an implementation per device type.
//
// Note [Kernel stubs]
// An op whose work is not an elementwise map or a reduction (softmax, layer_norm, matmul, the
// index ops, im2col) calls its kernel through a stub, as PyTorch's DispatchStub does: the op's
// file defines the stub and registers the CPU implementation beside it; the GPU
// implementations (engine/ops/cuda/*.cu) are registered when RegisterCudaDevices runs
// (engine/ops/cuda_ops.h). The op code itself never names a device type. Host-accessible devices
// (the CPU, the simulated accelerator) use the CPU implementation. A device with none throws
// UNIMPLEMENTED naming the kernel and the device.
//
// Thread safety: Register may race with calls; a call sees an implementation fully or not at
// all.

#ifndef GRADSERVE_ENGINE_KERNELS_KERNEL_STUB_H_
#define GRADSERVE_ENGINE_KERNELS_KERNEL_STUB_H_

#include <array>
#include <atomic>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/device/device.h"
#include "engine/device/device_registry.h"
#include "engine/util/status_error.h"

namespace gradserve::ops {

template <typename Signature>
class KernelStub;

template <typename R, typename... Args>
class KernelStub<R(Args...)> {
 public:
  using Fn = R (*)(Args...);

  // CPU implementation given at definition.
  KernelStub(const char* name, Fn cpu) : name_(name) { fns_[0].store(cpu); }

  void Register(DeviceType type, Fn fn) {
    fns_[static_cast<int>(type)].store(fn, std::memory_order_release);
  }

  // Runs the implementation for `device`.
  template <typename... CallArgs>
  R operator()(Device device, CallArgs&&... args) const {
    int slot = static_cast<int>(device.type);
    if (device.type == DeviceType::kSimulated) slot = 0;  // host memory
    const Fn fn = fns_[slot].load(std::memory_order_acquire);
    if (fn == nullptr) {
      ThrowStatus(absl::UnimplementedError(
          absl::StrCat(name_, " has no kernel for ", DeviceName(device), " in this build")));
    }
    return fn(std::forward<CallArgs>(args)...);
  }

  const char* name() const { return name_; }

 private:
  const char* const name_;
  std::array<std::atomic<Fn>, kNumDeviceTypes> fns_{};
};

}  // namespace gradserve::ops

#endif  // GRADSERVE_ENGINE_KERNELS_KERNEL_STUB_H_
