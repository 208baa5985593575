#include "server/unary_messages.h"

#include <cstddef>

#include "google/protobuf/arena.h"

namespace gradserve::server {
namespace {

// Enough for a request of a few dozen small ops and its response.
constexpr size_t kFirstBlockBytes = 8192;

// Note [Unary messages on an arena]. gRPC calls Release once the call is done.
class ArenaMessageHolder final : public grpc::MessageHolder<v1::GradRequest, v1::GradResponse> {
 public:
  ArenaMessageHolder() : arena_(FirstBlock(first_block_)) {
    set_request(google::protobuf::Arena::CreateMessage<v1::GradRequest>(&arena_));
    set_response(google::protobuf::Arena::CreateMessage<v1::GradResponse>(&arena_));
  }

  void Release() override { delete this; }

 private:
  static google::protobuf::ArenaOptions FirstBlock(char* block) {
    google::protobuf::ArenaOptions options;
    options.initial_block = block;
    options.initial_block_size = kFirstBlockBytes;
    return options;
  }

  alignas(std::max_align_t) char first_block_[kFirstBlockBytes];
  google::protobuf::Arena arena_;  // after first_block_, which it uses
};

}  // namespace

grpc::MessageHolder<v1::GradRequest, v1::GradResponse>* ArenaMessageAllocator::AllocateMessages() {
  return new ArenaMessageHolder;
}

}  // namespace gradserve::server
