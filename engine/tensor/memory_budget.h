// Per-request accounting of tensor memory, and the request's bound on the size of one tensor.
//
// Note [Memory budget]
// Every Storage charges its bytes to the MemoryBudget current on the thread that allocates it and
// gives them back when it is freed. The graph interpreter makes one budget per request and
// installs it (MemoryBudgetScope) around the forward pass; the Engine installs the GraphTask's
// budget around each node it evaluates, on whatever thread that is. A charge over the limit
// throws StatusError(RESOURCE_EXHAUSTED) before the memory is taken, so no client can make the
// server allocate without bound. The kernels' working buffers are charged the same way (Note
// [Working buffers], working_buffer.h).
//
// Note [Tensors over max_tensor_elements]
// The budget also carries the request's max_tensor_elements, so that the limit is wherever the
// budget is: Tensor::Empty refuses a tensor with more elements with RESOURCE_EXHAUSTED naming
// max_tensor_elements before it allocates anything, inside whichever op asked for it, in the
// forward pass and in the backward alike. So no op allocates or computes a result that is then
// refused (the interpreter checked outputs after the op ran, and a 2 GiB result was computed
// for seconds first). Views allocate nothing and are checked by the interpreter after the op.
// The message names the tensor by the op outputs the thread is computing, which the
// interpreter sets per op (OutputNamesScope): "output 'h' float32[65536, 65536] on cpu has
// 4294967296 elements, over the limit of 268435456 (max_tensor_elements)"; the interpreter then
// adds the op, as to any error of the op.

#ifndef GRADSERVE_ENGINE_TENSOR_MEMORY_BUDGET_H_
#define GRADSERVE_ENGINE_TENSOR_MEMORY_BUDGET_H_

#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace gradserve {

// Thread safety: all methods may be called from any thread at once.
class MemoryBudget {
 public:
  explicit MemoryBudget(int64_t limit_bytes = std::numeric_limits<int64_t>::max(),
                        int64_t max_tensor_elements = std::numeric_limits<int64_t>::max())
      : limit_(limit_bytes), max_tensor_elements_(max_tensor_elements) {}

  // Adds bytes, or throws RESOURCE_EXHAUSTED (and adds nothing) if that passes the limit.
  void Charge(int64_t bytes);
  void Release(int64_t bytes) { used_.fetch_sub(bytes, std::memory_order_relaxed); }

  int64_t used() const { return used_.load(std::memory_order_relaxed); }
  int64_t peak() const { return peak_.load(std::memory_order_relaxed); }
  int64_t limit() const { return limit_; }
  // The most elements one tensor made under this budget may have (Note [Tensors over
  // max_tensor_elements]).
  int64_t max_tensor_elements() const { return max_tensor_elements_; }

 private:
  const int64_t limit_;
  const int64_t max_tensor_elements_;
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

// Names, in the errors of tensors over max_tensor_elements (Note [Tensors over
// max_tensor_elements]), the op outputs this thread is computing, for the scope's lifetime;
// then restores the previous names. Borrows names (null: none), which must outlive the scope.
class OutputNamesScope {
 public:
  explicit OutputNamesScope(const std::vector<std::string>* names);
  ~OutputNamesScope();
  OutputNamesScope(const OutputNamesScope&) = delete;
  OutputNamesScope& operator=(const OutputNamesScope&) = delete;

  // The names of the innermost scope on this thread; null if none.
  static const std::vector<std::string>* Current();

 private:
  const std::vector<std::string>* const previous_;
};

}  // namespace gradserve

#endif  // GRADSERVE_ENGINE_TENSOR_MEMORY_BUDGET_H_
