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
// Note [Budgets within a budget]
// A budget may have a parent, which every charge and release also reaches: the server makes one
// budget for the whole process (--max_server_memory_bytes) and installs it on the threads that
// run requests, and the interpreter makes each request's budget a child of the budget current
// where the request starts. So a tensor counts against its request's limit and the server's at
// once, and the error names whichever limit it passed. What is not a tensor but holds memory
// for a request (an upload's buffered bytes, a response being serialized) is charged with a
// MemoryReservation.
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
// adds the op, as to any error of the op. A tensor that a grad op's nested backward makes on
// the op's thread is named by the grad op's outputs too, since it is made to compute them; on
// other threads, and outside the interpreter, it is "a tensor".
//
// Note [A budget outlives its charges]
// What is charged to a budget (a Storage, a Node, a working buffer) keeps a plain pointer to
// it, not a shared_ptr: copying and dropping a shared_ptr are two more atomic operations for
// every small tensor and Node, about as many as the charge and release themselves, and they
// were most of what the limits cost the backward pass (docs/benchmarks.md, "Builds
// compared"). Instead a budget stays alive while anything is charged to it. Its owners (the
// shared_ptrs Make returns, and their copies) and its charged bytes share one atomic word:
// twice the bytes charged, plus one while any owner is left. The last owner to go takes the
// one off; a release takes twice its bytes off; whichever of them brings the word to 0 deletes
// the budget. So a charge and its release are one atomic operation on each budget of the
// chain, and a tensor may outlive every owner of the budget it is charged to (a gradient a
// session keeps, a response still being written). A holder keeps the pointer only while it
// holds a charge of more than 0 bytes: a budget with no owner and nothing charged is gone.
// Budgets are made only by Make, whose shared_ptr knows this.

#ifndef GRADSERVE_ENGINE_TENSOR_MEMORY_BUDGET_H_
#define GRADSERVE_ENGINE_TENSOR_MEMORY_BUDGET_H_

#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace gradserve {

// Thread safety: all methods may be called from any thread at once.
class MemoryBudget {
 public:
  // The most bytes one charge may ask; more is refused whatever the limit, so that the state
  // word (Note [A budget outlives its charges]) cannot overflow. No memory is this big.
  static constexpr int64_t kMaxChargeBytes = int64_t{1} << 56;

  // A budget of limit_bytes (Note [A budget outlives its charges]: the only way to make one).
  static std::shared_ptr<MemoryBudget> Make(
      int64_t limit_bytes = std::numeric_limits<int64_t>::max(),
      int64_t max_tensor_elements = std::numeric_limits<int64_t>::max());
  // A budget within parent (Note [Budgets within a budget]); `what` names the limit in errors,
  // e.g. "server memory limit (--max_server_memory_bytes)". parent may be null.
  static std::shared_ptr<MemoryBudget> Make(
      int64_t limit_bytes, std::shared_ptr<MemoryBudget> parent, std::string what,
      int64_t max_tensor_elements = std::numeric_limits<int64_t>::max());

  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  // Adds bytes here and to every parent, or throws RESOURCE_EXHAUSTED naming the limit it would
  // pass (and adds nothing anywhere). Inline: every tensor and every recorded Node is charged
  // (Note [Nodes on the budget]), most of them to a request's budget within the server's, so
  // the chain is walked in a loop here and only a refusal takes the out-of-line path. The
  // caller holds an owner of this budget or a charge to it.
  void Charge(int64_t bytes) {
    const MemoryBudget* refused = bytes <= kMaxChargeBytes ? ChargeChain(bytes) : this;
    if (refused == nullptr) [[likely]]
      return;
    ThrowRefused(bytes, refused);
  }
  // Like Charge, but returns the error instead of throwing it.
  absl::Status TryCharge(int64_t bytes);
  // Gives back bytes charged here (and to every parent). May delete the budget: the caller
  // must not use it afterwards unless it holds an owner or another charge (Note [A budget
  // outlives its charges]).
  void Release(int64_t bytes) {
    if (bytes <= 0) return;
    if (parent_ != nullptr) parent_->Release(bytes);  // first: this budget owns its parent
    if (state_.fetch_sub(2 * bytes, std::memory_order_acq_rel) == 2 * bytes) delete this;
  }

  int64_t used() const { return state_.load(std::memory_order_relaxed) >> 1; }
  int64_t peak() const { return peak_.load(std::memory_order_relaxed); }
  int64_t limit() const { return limit_; }
  const std::shared_ptr<MemoryBudget>& parent() const { return parent_; }
  // The most elements one tensor made under this budget may have (Note [Tensors over
  // max_tensor_elements]).
  int64_t max_tensor_elements() const { return max_tensor_elements_; }

 private:
  MemoryBudget(int64_t limit_bytes, std::shared_ptr<MemoryBudget> parent, std::string what,
               int64_t max_tensor_elements)
      : limit_(limit_bytes),
        max_tensor_elements_(max_tensor_elements),
        parent_(std::move(parent)),
        what_(std::move(what)) {}
  ~MemoryBudget() = default;

  // The last owner is gone: deletes the budget unless something is still charged to it.
  void Disown() {
    if (state_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }
  // The RESOURCE_EXHAUSTED error of a charge of bytes that refused (a budget of the chain,
  // or this one for more than kMaxChargeBytes) did not take, thrown by Charge's out-of-line
  // path and returned by TryCharge.
  absl::Status Refusal(int64_t bytes, const MemoryBudget* refused) const;
  [[noreturn]] void ThrowRefused(int64_t bytes, const MemoryBudget* refused) const;
  // Adds bytes (at most kMaxChargeBytes) to this budget and then to each parent in turn. At
  // the first that it would take past its limit, takes them back from that one and those
  // before it and returns it; nullptr once every budget of the chain holds them. A peak is
  // raised as its budget is charged, so a charge a parent then refuses may still raise a
  // child's peak: the bytes were counted there for that moment.
  MemoryBudget* ChargeChain(int64_t bytes) {
    for (MemoryBudget* b = this; b != nullptr; b = b->parent_.get()) {
      const int64_t now = (b->state_.fetch_add(2 * bytes, std::memory_order_relaxed) >> 1) + bytes;
      if (now > b->limit_) [[unlikely]] {
        for (MemoryBudget* u = this;; u = u->parent_.get()) {
          u->state_.fetch_sub(2 * bytes, std::memory_order_relaxed);
          if (u == b) return b;
        }
      }
      int64_t peak = b->peak_.load(std::memory_order_relaxed);
      while (now > peak && !b->peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
      }
    }
    return nullptr;
  }

  const int64_t limit_;
  const int64_t max_tensor_elements_;
  const std::shared_ptr<MemoryBudget> parent_;
  const std::string what_;
  // Note [A budget outlives its charges]: 2 * bytes charged + 1 while any owner is left.
  std::atomic<int64_t> state_{1};
  std::atomic<int64_t> peak_{0};
};

// Bytes charged to a budget for as long as the reservation lives: memory a request holds that
// is not a tensor (Note [Budgets within a budget]). Movable; releases on destruction.
//
// Thread safety: one reservation is used by one thread at a time; its budget may be shared.
class MemoryReservation {
 public:
  MemoryReservation() = default;
  // Reserves nothing yet from budget (which may be null: then nothing is ever counted).
  explicit MemoryReservation(std::shared_ptr<MemoryBudget> budget) : budget_(std::move(budget)) {}
  ~MemoryReservation() { Reset(); }
  MemoryReservation(MemoryReservation&& other) noexcept
      : budget_(std::move(other.budget_)), bytes_(std::exchange(other.bytes_, 0)) {}
  MemoryReservation& operator=(MemoryReservation&& other) noexcept {
    if (this != &other) {
      Reset();
      budget_ = std::move(other.budget_);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }

  // Reserves bytes more, or returns RESOURCE_EXHAUSTED naming the limit (reserving nothing).
  absl::Status Grow(int64_t bytes);
  // Gives every reserved byte back.
  void Reset();
  int64_t bytes() const { return bytes_; }

 private:
  std::shared_ptr<MemoryBudget> budget_;
  int64_t bytes_ = 0;
};

namespace internal {
inline const std::shared_ptr<MemoryBudget> kNoBudget;
// Points at the current budget's owner (a scope, or a borrowed shared_ptr); never null. Inline,
// so that reading it costs no call: every tensor and Node made reads it.
inline thread_local const std::shared_ptr<MemoryBudget>* current_budget = &kNoBudget;
}  // namespace internal

// The budget charged by allocations on this thread; null means unaccounted.
inline const std::shared_ptr<MemoryBudget>& CurrentMemoryBudget() {
  return *internal::current_budget;
}

// Makes a budget current on this thread for the scope's lifetime.
class MemoryBudgetScope {
 public:
  // The scope keeps budget alive.
  explicit MemoryBudgetScope(std::shared_ptr<MemoryBudget> budget)
      : owned_(std::move(budget)), previous_(internal::current_budget) {
    internal::current_budget = &owned_;
  }
  // Borrows *budget, which must outlive the scope: no reference count is touched, which keeps
  // the Engine's per-Node scope free.
  explicit MemoryBudgetScope(const std::shared_ptr<MemoryBudget>* budget)
      : previous_(internal::current_budget) {
    internal::current_budget = budget;
  }
  ~MemoryBudgetScope() { internal::current_budget = previous_; }
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
