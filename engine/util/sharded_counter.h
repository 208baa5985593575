// ShardedCounter: a counter that many threads add to at once without meeting, summed when read.
//
// Note [Counters sharded by thread]
// Some counters are added to on every Node or every allocation, by every engine and gRPC
// thread at once: the CPU allocator's bytes in use, the engine threads' busy time, the
// server's request metrics. One atomic would put all those threads on one cache line, and a
// mutex would make them wait for each other. So such a counter is kept in kThreadShards
// relaxed atomics, each on a cache line of its own; a thread takes a shard when it first
// counts (round robin, ThisThreadShard, so a server's few dozen threads mostly have one each)
// and adds only to it, and a reader sums the shards. An add costs one uncontended atomic
// instruction. A reader that sums while threads add sees each add either whole or not at all,
// but no order between adds to different shards: an amount added on one thread and taken
// away on another (a block freed by another thread than the one that allocated it) can make
// one shard negative, and a sum read between the two calls counts the first and not the
// second. Sums are for metrics, never for decisions.

#ifndef GRADSERVE_ENGINE_UTIL_SHARDED_COUNTER_H_
#define GRADSERVE_ENGINE_UTIL_SHARDED_COUNTER_H_

#include <atomic>
#include <cstdint>

namespace gradserve {

inline constexpr int kThreadShards = 16;

// The calling thread's shard, 0 to kThreadShards - 1, the same for the thread's whole life
// (Note [Counters sharded by thread]).
inline int ThisThreadShard() {
  static std::atomic<int> next{0};
  thread_local const int shard = next.fetch_add(1, std::memory_order_relaxed) % kThreadShards;
  return shard;
}

// Thread safety: Add and Sum may be called from any thread at once (Note [Counters sharded by
// thread]).
class ShardedCounter {
 public:
  void Add(int64_t n) { shards_[ThisThreadShard()].value.fetch_add(n, std::memory_order_relaxed); }
  int64_t Sum() const {
    int64_t sum = 0;
    for (const Shard& s : shards_) sum += s.value.load(std::memory_order_relaxed);
    return sum;
  }

 private:
  struct alignas(64) Shard {
    std::atomic<int64_t> value{0};
  };
  Shard shards_[kThreadShards];
};

}  // namespace gradserve

#endif  // GRADSERVE_ENGINE_UTIL_SHARDED_COUNTER_H_
