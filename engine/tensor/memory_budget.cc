#include "engine/tensor/memory_budget.h"

#include "absl/strings/str_cat.h"
#include "engine/util/status_error.h"

namespace gradserve {
namespace {
// OutputNamesScope's names; null if none.
thread_local const std::vector<std::string>* current_output_names = nullptr;
}  // namespace

std::shared_ptr<MemoryBudget> MemoryBudget::Make(int64_t limit_bytes, int64_t max_tensor_elements) {
  return Make(limit_bytes, nullptr, "request memory limit", max_tensor_elements);
}

std::shared_ptr<MemoryBudget> MemoryBudget::Make(int64_t limit_bytes,
                                                 std::shared_ptr<MemoryBudget> parent,
                                                 std::string what, int64_t max_tensor_elements) {
  return std::shared_ptr<MemoryBudget>(
      new MemoryBudget(limit_bytes, std::move(parent), std::move(what), max_tensor_elements),
      [](MemoryBudget* budget) { budget->Disown(); });
}

absl::Status MemoryBudget::TryCharge(int64_t bytes) {
  const MemoryBudget* refused = bytes <= kMaxChargeBytes ? ChargeChain(bytes) : this;
  return refused == nullptr ? absl::OkStatus() : Refusal(bytes, refused);
}

absl::Status MemoryBudget::Refusal(int64_t bytes, const MemoryBudget* refused) const {
  if (bytes > kMaxChargeBytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what_, " exceeded: allocating ", bytes, " bytes is more than any budget counts (at most ",
        kMaxChargeBytes, " bytes at once)"));
  }
  return absl::ResourceExhaustedError(
      absl::StrCat(refused->what_, " exceeded: allocating ", bytes, " bytes with ", refused->used(),
                   " in use would pass the limit of ", refused->limit_, " bytes"));
}

void MemoryBudget::ThrowRefused(int64_t bytes, const MemoryBudget* refused) const {
  ThrowStatus(Refusal(bytes, refused));
}

absl::Status MemoryReservation::Grow(int64_t bytes) {
  if (budget_ != nullptr && bytes > 0) {
    if (absl::Status s = budget_->TryCharge(bytes); !s.ok()) return s;
  }
  bytes_ += bytes;
  return absl::OkStatus();
}

void MemoryReservation::Reset() {
  if (budget_ != nullptr && bytes_ > 0) budget_->Release(bytes_);
  bytes_ = 0;
}

OutputNamesScope::OutputNamesScope(const std::vector<std::string>* names)
    : previous_(current_output_names) {
  current_output_names = names;
}

OutputNamesScope::~OutputNamesScope() { current_output_names = previous_; }

const std::vector<std::string>* OutputNamesScope::Current() { return current_output_names; }

}  // namespace gradserve
