#include "engine/device/stream.h"

#include "engine/device/device_registry.h"

namespace gradserve {
namespace {

DeviceBackend* BackendOf(Device device) {
  return device.is_cpu() ? nullptr : DeviceRegistry::Get().backend(device.type);
}

}  // namespace

Stream CurrentStream(Device device) {
  DeviceBackend* backend = BackendOf(device);
  return {device, backend == nullptr ? 0 : backend->CurrentStream(device.index)};
}

void StreamScope::Enter() {
  previous_ = BackendOf(stream_.device)->ExchangeCurrentStream(stream_.device.index, stream_.id);
}

void StreamScope::Exit() {
  BackendOf(stream_.device)->ExchangeCurrentStream(stream_.device.index, previous_);
}

void WaitStream(Stream consumer, Stream producer) {
  if (!consumer.has_stream() || !producer.has_stream() || consumer == producer) return;
  if (consumer.device != producer.device) return;  // a copy between devices waits itself
  BackendOf(consumer.device)->WaitStream(consumer.device.index, consumer.id, producer.id);
}

void RecordStream(Device device, void* data, Stream stream) {
  if (!stream.has_stream() || device != stream.device) return;
  BackendOf(stream.device)->RecordStream(stream.device.index, data, stream.id);
}

void SynchronizeStream(Stream stream) {
  if (stream.has_stream())
    BackendOf(stream.device)->SynchronizeStream(stream.device.index, stream.id);
}

}  // namespace gradserve
