#include "server/unary_messages.h"

#include <cstddef>
#include <memory>
#include <vector>

#include "google/protobuf/arena.h"

namespace gradserve::server {
namespace {

// Enough for a request of a few dozen small ops and its response.
constexpr size_t kFirstBlockBytes = 8192;
// Holders each thread keeps for reuse: about the calls one thread has in flight at once.
constexpr size_t kHoldersPerThread = 8;

// Note [Unary messages on an arena]. gRPC calls Release once the call is done.
class ArenaMessageHolder final : public grpc::MessageHolder<v1::GradRequest, v1::GradResponse> {
 public:
  ArenaMessageHolder() : arena_(FirstBlock(first_block_)) { CreateMessages(); }

  // Returns the holder to this thread's cache (its arena emptied), or deletes it.
  void Release() override;

  void CreateMessages() {
    set_request(google::protobuf::Arena::CreateMessage<v1::GradRequest>(&arena_));
    set_response(google::protobuf::Arena::CreateMessage<v1::GradResponse>(&arena_));
  }
  // Frees the messages and any blocks beyond the first.
  void Reset() { arena_.Reset(); }

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

// Holders released on this thread, with empty arenas: allocating a fresh 8 KiB holder costs
// more than the parse of a small request. Each thread's cache is its own, so it needs no lock;
// a holder may be allocated on one thread and released (cached) on another.
class HolderCache {
 public:
  // This thread's cache, or null once the thread has destroyed it (on its way out).
  static std::vector<std::unique_ptr<ArenaMessageHolder>>* Get() {
    if (gone_) return nullptr;
    thread_local HolderCache cache;
    return &cache.holders_;
  }
  ~HolderCache() { gone_ = true; }

 private:
  static thread_local bool gone_;  // constant-initialized, so never destroyed
  std::vector<std::unique_ptr<ArenaMessageHolder>> holders_;
};

thread_local bool HolderCache::gone_ = false;

void ArenaMessageHolder::Release() {
  std::vector<std::unique_ptr<ArenaMessageHolder>>* cache = HolderCache::Get();
  if (cache == nullptr || cache->size() >= kHoldersPerThread) {
    delete this;
    return;
  }
  Reset();
  cache->emplace_back(this);
}

}  // namespace

grpc::MessageHolder<v1::GradRequest, v1::GradResponse>* ArenaMessageAllocator::AllocateMessages() {
  std::vector<std::unique_ptr<ArenaMessageHolder>>* cache = HolderCache::Get();
  if (cache == nullptr || cache->empty()) return new ArenaMessageHolder;
  ArenaMessageHolder* holder = cache->back().release();
  cache->pop_back();
  holder->CreateMessages();
  return holder;
}

}  // namespace gradserve::server
