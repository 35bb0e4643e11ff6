// A byte budget shared by every layer on one device: the server's "KV pool" limit. Each layer's
// pages are charged here when reserved and credited when released or evicted, so the sum of all
// sessions' KV memory never passes the budget and the server can report exact use.
#ifndef ATTNSERVE_KERNELS_KV_MEMORY_BUDGET_H_
#define ATTNSERVE_KERNELS_KV_MEMORY_BUDGET_H_

#include <atomic>
#include <cstdint>

namespace attnserve {

class KvMemoryBudget {
 public:
  explicit KvMemoryBudget(int64_t capacity_bytes) : capacity_(capacity_bytes) {}

  // Charges `bytes` if they fit; false (and nothing charged) otherwise. Thread-safe.
  bool TryCharge(int64_t bytes) {
    int64_t used = used_.load(std::memory_order_relaxed);
    do {
      if (used + bytes > capacity_) return false;
    } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
    return true;
  }
  void Release(int64_t bytes) { used_.fetch_sub(bytes, std::memory_order_relaxed); }

  int64_t capacity_bytes() const { return capacity_; }
  int64_t used_bytes() const { return used_.load(std::memory_order_relaxed); }
  int64_t free_bytes() const { return capacity_ - used_bytes(); }

 private:
  const int64_t capacity_;
  std::atomic<int64_t> used_{0};
};

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_KV_MEMORY_BUDGET_H_
