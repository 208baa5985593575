// DeviceLoad: which GPU and which simulated device a request's bare "cuda" and "sim" name (Note
// [Bare device names] in engine/device/device.h).
//
// Each request holds a Lease for its life. Acquire gives it, for each device type, the device
// with the fewest leases held, ties going to the device after the last one given (round robin),
// so requests spread over the GPUs the server serves, most evenly when they are many. A session
// keeps its Forward's choice for its later calls, which then lease that choice again (Hold).
// Every request counts against the devices it was given, whether it names them or not: the
// count is of requests in flight, not of work. A server with at most one device of each type has
// no choice to make, and its leases take no lock.
//
// Thread safety: every method may be called from any thread; a Lease is released by its
// destructor, on any thread.

#ifndef GRADSERVE_SERVER_RUN_DEVICE_LOAD_H_
#define GRADSERVE_SERVER_RUN_DEVICE_LOAD_H_

#include <cstdint>
#include <vector>

#include "engine/device/device.h"
#include "engine/util/mutex.h"

namespace gradserve::server {

class DeviceLoad {
 public:
  // Spreads over `gpus` GPUs (cuda:0 to cuda:gpus-1) and `sims` simulated devices; with none of
  // a type, that type's choice is index 0.
  DeviceLoad(int gpus, int sims);
  // Counts the devices the DeviceRegistry holds now.
  static DeviceLoad ForRegisteredDevices();

  DeviceLoad(const DeviceLoad&) = delete;
  DeviceLoad& operator=(const DeviceLoad&) = delete;
  DeviceLoad(DeviceLoad&&) = delete;

  class Lease {
   public:
    Lease(Lease&& other) noexcept : load_(other.load_), choice_(other.choice_) {
      other.load_ = nullptr;
    }
    Lease& operator=(Lease&&) = delete;
    ~Lease();

    DeviceChoice choice() const { return choice_; }

   private:
    friend class DeviceLoad;
    Lease(DeviceLoad* load, DeviceChoice choice) : load_(load), choice_(choice) {}

    DeviceLoad* load_;  // null once moved from
    DeviceChoice choice_;
  };

  // The least loaded device of each type.
  Lease Acquire();
  // This choice again, counted as one more request on its devices (a session's later call).
  Lease Hold(DeviceChoice choice);

  // Leases held per GPU and per simulated device, for tests and metrics.
  std::vector<int64_t> GpuLeases() const;
  std::vector<int64_t> SimulatedLeases() const;

 private:
  // One device type's counts.
  struct Devices {
    std::vector<int64_t> leases;
    int next = 0;  // where the search for the least loaded starts: round robin among ties
  };

  static int16_t Pick(Devices& devices);
  static void Add(Devices& devices, int16_t index, int64_t delta);
  // Adds delta to the leases of both of choice's devices.
  void Count(DeviceChoice choice, int64_t delta) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Release(DeviceChoice choice);

  // More than one GPU or simulated device: leases are counted.
  const bool counts_;
  mutable Mutex mu_;
  Devices gpus_ ABSL_GUARDED_BY(mu_);
  Devices sims_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradserve::server

#endif  // GRADSERVE_SERVER_RUN_DEVICE_LOAD_H_
