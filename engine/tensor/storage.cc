#include "engine/tensor/storage.h"

#include <cstdlib>
#include <new>

#include "absl/strings/str_cat.h"
#include "engine/tensor/status_error.h"

namespace gradserve {

Storage::Storage(size_t nbytes, Allocator* allocator)
    : allocator_(allocator),
      device_(allocator->device()),
      nbytes_(nbytes),
      budget_(CurrentMemoryBudget()) {
  if (budget_) budget_->Charge(static_cast<int64_t>(nbytes));
  if (nbytes > 0 && nbytes <= kInlineBytes && allocator == CpuAllocator()) {
    data_ = inline_;
    return;
  }
  try {
    data_ = allocator_->Allocate(nbytes);
  } catch (...) {
    if (budget_) budget_->Release(static_cast<int64_t>(nbytes));
    throw;
  }
}

Storage::~Storage() {
  if (!is_inline()) allocator_->Deallocate(data_, nbytes_);
  if (budget_) budget_->Release(static_cast<int64_t>(nbytes_));
}

namespace {

class CpuAllocatorImpl final : public Allocator {
 public:
  void* Allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    // Small tensors take malloc's 16-byte alignment: glibc's aligned path costs several times
    // more, and a backward of tiny tensors allocates one per Node. Large ones are 64-byte
    // aligned for vector loads.
    constexpr size_t kSmall = 256;
    constexpr size_t kAlign = 64;
    const size_t rounded = (nbytes + kAlign - 1) / kAlign * kAlign;
    if (rounded < nbytes) ThrowStatus(absl::ResourceExhaustedError("allocation size overflows"));
    void* p = nbytes <= kSmall ? std::malloc(nbytes) : std::aligned_alloc(kAlign, rounded);
    if (p == nullptr) {
      ThrowStatus(absl::ResourceExhaustedError(
          absl::StrCat("out of host memory allocating ", nbytes, " bytes")));
    }
    return p;
  }
  void Deallocate(void* ptr, size_t) override { std::free(ptr); }
  Device device() const override { return kCPU; }
};

}  // namespace

Allocator* CpuAllocator() {
  static CpuAllocatorImpl* const allocator = new CpuAllocatorImpl;
  return allocator;
}

}  // namespace gradserve
