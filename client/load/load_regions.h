// The shared-memory regions of scenario payload_shm (docs/shared_memory.md): grad_64mb's
// request with its leaf read from, and its gradient written to, POSIX shared memory on the
// server's host instead of the connection.

#ifndef GRADSERVE_CLIENT_LOAD_LOAD_REGIONS_H_
#define GRADSERVE_CLIENT_LOAD_LOAD_REGIONS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/library/gradserve_client.h"
#include "client/library/shared_memory.h"

namespace gradserve::load {

// Two objects of `bytes` each, the input holding the payload's values, registered as two
// regions (the input read-only, the output writable) with the server of every target.
// Concurrent calls write the same gradient into the same output range: the bytes are the
// same, which is all a load run needs.
//
// Thread safety: make and destroy on one thread; the names may be read from any.
class LoadRegions {
 public:
  // Asks the first target's server for its --shared_memory_prefix (GetServerInfo), creates
  // the objects under it (named after this process) and registers them with each target.
  // FAILED_PRECONDITION naming the flag when the server has shared memory off; the server's
  // and the system's errors otherwise.
  static absl::StatusOr<std::unique_ptr<LoadRegions>> Create(
      const std::vector<std::string>& targets, const client::ClientOptions& options, int64_t bytes);
  // Unregisters the regions (errors ignored: the server may have gone) and unlinks the objects.
  ~LoadRegions();

  LoadRegions(const LoadRegions&) = delete;
  LoadRegions& operator=(const LoadRegions&) = delete;

  const std::string& in() const { return in_name_; }
  const std::string& out() const { return out_name_; }

 private:
  LoadRegions() = default;

  std::string in_name_;
  std::string out_name_;
  std::unique_ptr<client::SharedMemory> in_;
  std::unique_ptr<client::SharedMemory> out_;
  std::vector<std::unique_ptr<client::Client>> clients_;  // one per target, for Unregister
};

}  // namespace gradserve::load

#endif  // GRADSERVE_CLIENT_LOAD_LOAD_REGIONS_H_
