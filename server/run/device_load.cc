#include "server/run/device_load.h"

#include "engine/device/device_registry.h"

namespace gradserve::server {

DeviceLoad::DeviceLoad(int gpus, int sims) : counts_(gpus > 1 || sims > 1) {
  MutexLock lock(&mu_);
  gpus_.leases.assign(static_cast<size_t>(gpus > 0 ? gpus : 0), 0);
  sims_.leases.assign(static_cast<size_t>(sims > 0 ? sims : 0), 0);
}

DeviceLoad DeviceLoad::ForRegisteredDevices() {
  int gpus = 0, sims = 0;
  for (Device d : DeviceRegistry::Get().devices()) {
    if (d.type == DeviceType::kCUDA) ++gpus;
    if (d.type == DeviceType::kSimulated) ++sims;
  }
  return DeviceLoad(gpus, sims);
}

DeviceLoad::Lease::~Lease() {
  if (load_ != nullptr) load_->Release(choice_);
}

int16_t DeviceLoad::Pick(Devices& devices) {
  const int n = static_cast<int>(devices.leases.size());
  if (n == 0) return 0;
  int best = devices.next % n;
  for (int k = 1; k < n; ++k) {
    const int i = (devices.next + k) % n;
    if (devices.leases[i] < devices.leases[best]) best = i;
  }
  devices.next = (best + 1) % n;
  return static_cast<int16_t>(best);
}

void DeviceLoad::Add(Devices& devices, int16_t index, int64_t delta) {
  if (index >= 0 && static_cast<size_t>(index) < devices.leases.size()) {
    devices.leases[index] += delta;
  }
}

void DeviceLoad::Count(DeviceChoice choice, int64_t delta) {
  Add(gpus_, choice.cuda, delta);
  Add(sims_, choice.sim, delta);
}

DeviceLoad::Lease DeviceLoad::Acquire() {
  if (!counts_) return Lease(nullptr, DeviceChoice{});  // index 0 of each type, or nothing
  MutexLock lock(&mu_);
  const DeviceChoice choice{Pick(gpus_), Pick(sims_)};
  Count(choice, 1);
  return Lease(this, choice);
}

DeviceLoad::Lease DeviceLoad::Hold(DeviceChoice choice) {
  if (!counts_) return Lease(nullptr, choice);
  MutexLock lock(&mu_);
  Count(choice, 1);
  return Lease(this, choice);
}

void DeviceLoad::Release(DeviceChoice choice) {
  MutexLock lock(&mu_);
  Count(choice, -1);
}

std::vector<int64_t> DeviceLoad::GpuLeases() const {
  MutexLock lock(&mu_);
  return gpus_.leases;
}

std::vector<int64_t> DeviceLoad::SimulatedLeases() const {
  MutexLock lock(&mu_);
  return sims_.leases;
}

}  // namespace gradserve::server
