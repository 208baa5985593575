#include "client/load/load_regions.h"

#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/load/scenarios.h"

namespace gradserve::load {

absl::StatusOr<std::unique_ptr<LoadRegions>> LoadRegions::Create(
    const std::vector<std::string>& targets, const client::ClientOptions& options, int64_t bytes) {
  absl::StatusOr<client::HostTensor> values = PayloadValues(bytes);
  if (!values.ok()) return values.status();
  if (targets.empty()) return absl::InvalidArgumentError("no target");
  std::unique_ptr<LoadRegions> regions(new LoadRegions());
  for (const std::string& target : targets) {
    regions->clients_.push_back(client::Client::Connect(target, options));
  }
  client::CallOptions call;
  call.timeout = absl::Seconds(10);
  absl::StatusOr<client::v1::ServerInfo> info = regions->clients_.front()->GetServerInfo(call);
  if (!info.ok()) return info.status();
  const std::string& prefix = info->limits().shared_memory_prefix();
  if (prefix.empty()) {
    return absl::FailedPreconditionError(
        "the server has shared memory off: start it with --shared_memory_prefix=/gradserve");
  }
  const std::string stem = absl::StrCat(prefix, "_load_", getpid());
  absl::StatusOr<std::unique_ptr<client::SharedMemory>> in =
      client::SharedMemory::Create(stem + "_in", bytes);
  if (!in.ok()) return in.status();
  absl::StatusOr<std::unique_ptr<client::SharedMemory>> out =
      client::SharedMemory::Create(stem + "_out", bytes);
  if (!out.ok()) return out.status();
  regions->in_ = *std::move(in);
  regions->out_ = *std::move(out);
  std::memcpy(regions->in_->data(), values->data.data(), values->data.size());
  regions->in_name_ = absl::StrCat("load_", getpid(), "_in");
  regions->out_name_ = absl::StrCat("load_", getpid(), "_out");
  for (const std::unique_ptr<client::Client>& client : regions->clients_) {
    for (bool writable : {false, true}) {
      const client::SharedMemory& shm = writable ? *regions->out_ : *regions->in_;
      absl::StatusOr<absl::Duration> ttl =
          client->RegisterSharedMemory(writable ? regions->out_name_ : regions->in_name_, shm.key(),
                                       bytes, writable, absl::ZeroDuration(), call);
      if (!ttl.ok()) return ttl.status();
    }
  }
  return regions;
}

LoadRegions::~LoadRegions() {
  client::CallOptions call;
  call.timeout = absl::Seconds(5);
  for (const std::unique_ptr<client::Client>& client : clients_) {
    for (const std::string* name : {&in_name_, &out_name_}) {
      if (!name->empty()) client->UnregisterSharedMemory(*name, call).IgnoreError();
    }
  }
}

}  // namespace gradserve::load
