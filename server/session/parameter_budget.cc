#include "server/session/parameter_budget.h"

#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace attnserve::server {

ParameterCharge::ParameterCharge(ParameterCharge&& other) noexcept
    : budget_(std::exchange(other.budget_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

ParameterCharge& ParameterCharge::operator=(ParameterCharge&& other) noexcept {
  if (this != &other) {
    ShrinkTo(0);
    budget_ = std::exchange(other.budget_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

ParameterCharge::~ParameterCharge() { ShrinkTo(0); }

void ParameterCharge::ShrinkTo(int64_t bytes) {
  if (budget_ == nullptr || bytes >= bytes_) return;
  budget_->Release(bytes_ - bytes);
  bytes_ = bytes;
}

absl::StatusOr<ParameterCharge> ParameterBudget::Charge(int64_t bytes, absl::string_view what) {
  int64_t used = used_.load(std::memory_order_relaxed);
  do {
    if (bytes > capacity_ - used) {
      return absl::ResourceExhaustedError(
          absl::StrCat(what, " needs ", bytes, " bytes of parameter memory, ", capacity_ - used,
                       " of ", capacity_,
                       " bytes are free (--max_parameter_bytes); release a session or configure a "
                       "smaller layer"));
    }
  } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
  return ParameterCharge(this, bytes);
}

int64_t DefaultMaxParameterBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return int64_t{4} << 30;  // Unknown: a modest 4 GiB.
  return static_cast<int64_t>(pages) * page_size / 2;
}

}  // namespace attnserve::server
