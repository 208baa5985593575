// Per-request accounting of tensor memory.
//
// Note [Memory budget]
// Every Storage charges its bytes to the MemoryBudget current on the thread that allocates it and
// gives them back when it is freed. The graph interpreter makes one budget per request and
// installs it (MemoryBudgetScope) around the forward pass; the Engine installs the GraphTask's
// budget around each node it evaluates, on whatever thread that is. A charge over the limit
// throws StatusError(RESOURCE_EXHAUSTED) before the memory is taken, so no client can make the
// server allocate without bound.

#ifndef GRADSERVE_ENGINE_TENSOR_MEMORY_BUDGET_H_
#define GRADSERVE_ENGINE_TENSOR_MEMORY_BUDGET_H_

#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>

namespace gradserve {

// Thread safety: all methods may be called from any thread at once.
class MemoryBudget {
 public:
  explicit MemoryBudget(int64_t limit_bytes = std::numeric_limits<int64_t>::max())
      : limit_(limit_bytes) {}

  // Adds bytes, or throws RESOURCE_EXHAUSTED (and adds nothing) if that passes the limit.
  void Charge(int64_t bytes);
  void Release(int64_t bytes) { used_.fetch_sub(bytes, std::memory_order_relaxed); }

  int64_t used() const { return used_.load(std::memory_order_relaxed); }
  int64_t peak() const { return peak_.load(std::memory_order_relaxed); }
  int64_t limit() const { return limit_; }

 private:
  const int64_t limit_;
  std::atomic<int64_t> used_{0};
  std::atomic<int64_t> peak_{0};
};

// The budget charged by allocations on this thread; null means unaccounted.
const std::shared_ptr<MemoryBudget>& CurrentMemoryBudget();

// Makes a budget current on this thread for the scope's lifetime.
class MemoryBudgetScope {
 public:
  // The scope keeps budget alive.
  explicit MemoryBudgetScope(std::shared_ptr<MemoryBudget> budget);
  // Borrows *budget, which must outlive the scope: no reference count is touched, which keeps
  // the Engine's per-Node scope free.
  explicit MemoryBudgetScope(const std::shared_ptr<MemoryBudget>* budget);
  ~MemoryBudgetScope();
  MemoryBudgetScope(const MemoryBudgetScope&) = delete;
  MemoryBudgetScope& operator=(const MemoryBudgetScope&) = delete;

 private:
  std::shared_ptr<MemoryBudget> owned_;
  const std::shared_ptr<MemoryBudget>* previous_;
};

}  // namespace gradserve

#endif  // GRADSERVE_ENGINE_TENSOR_MEMORY_BUDGET_H_
