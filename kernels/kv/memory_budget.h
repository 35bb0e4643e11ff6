// A byte budget shared by every layer on one device: the server's "KV pool" limit. Each layer's
// pages are charged here when reserved and credited when released or evicted, so the sum of all
// sessions' KV memory never passes the budget and the server can report exact use.
//
// A budget may have a parent (a tenant's quota inside the device pool): a charge then succeeds
// only when both have room, and is made to both or to neither; a release credits both.
//
// An account (KvMemoryBudget::Account) is a budget with no limit of its own that counts one
// owner's charges inside its parent: the server gives every session's layer one. Bytes its owner
// reserved ahead (TryReserve) can be handed to the owner's next charges (Prepay): they draw on that
// credit instead of being released and charged again, so a reservation turns into the layer's
// charge without a moment in which another session could take the bytes.
//
// Header only and free of device code, so the CUDA backend's nvcc includes it too.
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

  // An account inside `parent` (not null): no limit of its own, the parent's name.
  static std::shared_ptr<KvMemoryBudget> Account(std::shared_ptr<KvMemoryBudget> parent) {
    std::shared_ptr<KvMemoryBudget> account(
        new KvMemoryBudget(kUnlimited, parent, parent->name()));
    account->limited_ = false;
    return account;
  }
  bool is_account() const { return !limited_; }

  // Charges `bytes` if they fit here and in every ancestor; false (and nothing charged anywhere)
  // otherwise. Draws on the credit (Prepay) first: credited bytes are charged already. Thread-safe.
  bool TryCharge(int64_t bytes) {
    const int64_t credited = DrawCredit(bytes);
    if (credited == bytes || TryReserve(bytes - credited)) return true;
    if (credited > 0) credit_.fetch_add(credited, std::memory_order_relaxed);
    return false;
  }
  // TryCharge that never draws on the credit: a reservation made ahead of the owner's charges
  // (they may be handed the bytes with Prepay, or the bytes are given back with Release).
  bool TryReserve(int64_t bytes) {
    if (!TryChargeOwn(bytes)) return false;
    if (parent_ != nullptr && !parent_->TryCharge(bytes)) {
      used_.fetch_sub(bytes, std::memory_order_relaxed);
      return false;
    }
    return true;
  }
  // Hands `bytes` reserved here (TryReserve) to the next charges here. Only on an account, whose
  // one owner charges it one call at a time: Prepay, the owner's call, then TakeCredit.
  void Prepay(int64_t bytes) { credit_.fetch_add(bytes, std::memory_order_relaxed); }
  // The credit the charges since Prepay left; still charged (release it, or keep it reserved).
  int64_t TakeCredit() { return credit_.exchange(0, std::memory_order_relaxed); }
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
    if (limited_ && used_bytes() + bytes > capacity_) return this;
    return parent_ == nullptr ? nullptr : parent_->Refuser(bytes);
  }
  // This budget, or for an account the nearest ancestor with a limit: the one to name.
  const KvMemoryBudget& Limiting() const {
    return limited_ || parent_ == nullptr ? *this : parent_->Limiting();
  }

 private:
  static constexpr int64_t kUnlimited = int64_t{1} << 62;

  // Takes up to `bytes` of the credit; returns how much.
  int64_t DrawCredit(int64_t bytes) {
    int64_t credit = credit_.load(std::memory_order_relaxed);
    int64_t take = 0;
    do {
      take = std::min(credit, bytes);
      if (take <= 0) return 0;
    } while (!credit_.compare_exchange_weak(credit, credit - take, std::memory_order_relaxed));
    return take;
  }
  bool TryChargeOwn(int64_t bytes) {
    if (!limited_) {
      used_.fetch_add(bytes, std::memory_order_relaxed);
      return true;
    }
    int64_t used = used_.load(std::memory_order_relaxed);
    do {
      if (used + bytes > capacity_) return false;
    } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
    return true;
  }

  const int64_t capacity_;
  const std::shared_ptr<KvMemoryBudget> parent_;
  const std::string name_;
  bool limited_ = true;
  std::atomic<int64_t> used_{0};
  std::atomic<int64_t> credit_{0};  // Reserved bytes handed to the next charges (Prepay).
};

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_KV_MEMORY_BUDGET_H_
