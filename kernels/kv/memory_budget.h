// A byte budget shared by every layer on one device: the server's "KV pool" limit. Each layer's
// pages are charged here when reserved and credited when released or evicted, so the sum of all
// sessions' KV memory never passes the budget and the server can report exact use.
//
// A budget may have a parent (a tenant's quota inside the device pool): a charge then succeeds
// only when both have room, and is made to both or to neither; a release credits both. Header
// only and free of device code, so the CUDA backend's nvcc includes it too.
#ifndef ATTNSERVE_KERNELS_KV_MEMORY_BUDGET_H_
#define ATTNSERVE_KERNELS_KV_MEMORY_BUDGET_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

namespace attnserve {

class KvMemoryBudget {
 public:
  explicit KvMemoryBudget(int64_t capacity_bytes) : capacity_(capacity_bytes) {}
  // A budget inside `parent` (which must not be null). `name` says what it limits, for error
  // messages (e.g. "tenant 'alice' (--tenant_max_kv_bytes)").
  KvMemoryBudget(int64_t capacity_bytes, std::shared_ptr<KvMemoryBudget> parent, std::string name)
      : capacity_(capacity_bytes), parent_(std::move(parent)), name_(std::move(name)) {}

  // Charges `bytes` if they fit here and in every ancestor; false (and nothing charged anywhere)
  // otherwise. Thread-safe.
  bool TryCharge(int64_t bytes) {
    if (!TryChargeOwn(bytes)) return false;
    if (parent_ != nullptr && !parent_->TryCharge(bytes)) {
      used_.fetch_sub(bytes, std::memory_order_relaxed);
      return false;
    }
    return true;
  }
  void Release(int64_t bytes) {
    used_.fetch_sub(bytes, std::memory_order_relaxed);
    if (parent_ != nullptr) parent_->Release(bytes);
  }

  int64_t capacity_bytes() const { return capacity_; }
  int64_t used_bytes() const { return used_.load(std::memory_order_relaxed); }
  // What a charge could take now: the least room of this budget and its ancestors.
  int64_t free_bytes() const {
    const int64_t own = capacity_ - used_bytes();
    return parent_ == nullptr ? own : std::min(own, parent_->free_bytes());
  }
  // "" for a root budget (the device pool).
  const std::string& name() const { return name_; }

  // The budget (this or an ancestor) that a charge of `bytes` would not fit now, nullptr if it
  // would fit; for error messages after TryCharge failed (the nearest one is named first).
  const KvMemoryBudget* Refuser(int64_t bytes) const {
    if (used_bytes() + bytes > capacity_) return this;
    return parent_ == nullptr ? nullptr : parent_->Refuser(bytes);
  }

 private:
  bool TryChargeOwn(int64_t bytes) {
    int64_t used = used_.load(std::memory_order_relaxed);
    do {
      if (used + bytes > capacity_) return false;
    } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
    return true;
  }

  const int64_t capacity_;
  const std::shared_ptr<KvMemoryBudget> parent_;
  const std::string name_;
  std::atomic<int64_t> used_{0};
};

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_KV_MEMORY_BUDGET_H_
