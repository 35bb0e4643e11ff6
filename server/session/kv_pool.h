// The KV cache pool of one device: a byte budget that every session's layer charges its pages to.
//
// Each layer gets its own page allocator sized to the whole budget (max_pages = capacity /
// page_bytes), so the shared budget, not a per-session split, is what limits memory: a session may
// use the whole pool while others are idle, and a step that would pass it fails with
// RESOURCE_EXHAUSTED naming the bytes needed and free (the engine writes that message), without
// touching other requests.
#ifndef ATTNSERVE_SERVER_SESSION_KV_POOL_H_
#define ATTNSERVE_SERVER_SESSION_KV_POOL_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kernels/backend.h"
#include "kernels/core/tensor.h"
#include "kernels/kv/sequence_table.h"
#include "kernels/spec/layer_spec.h"

namespace attnserve::server {

class KvPool {
 public:
  explicit KvPool(int64_t capacity_bytes)
      : budget_(std::make_shared<KvMemoryBudget>(capacity_bytes)) {}

  // The cache configuration of a new session's layer. page_size must be resolved (>= 1).
  // INVALID_ARGUMENT when a single page is larger than the whole pool.
  // `storage` may be a plain DType (f32, bf16, ...) or an 8-bit format; pages count its scales.
  absl::StatusOr<KvCacheConfig> ConfigFor(const LayerSpec& spec, const KvStorageFormat& storage,
                                          int page_size) const;
  // The same for a layer whose pages are charged to `tenant_budget` (from TenantBudget, or null
  // for the pool alone), which charges the pool in turn. RESOURCE_EXHAUSTED when one page is
  // larger than the tenant's whole quota (a quota, not a bad spec).
  absl::StatusOr<KvCacheConfig> ConfigFor(const LayerSpec& spec, const KvStorageFormat& storage,
                                          int page_size,
                                          std::shared_ptr<KvMemoryBudget> tenant_budget) const;

  // The KV quota of `tenant`: a budget of `max_bytes` inside the pool, shared by all of the
  // tenant's sessions (created on first use, the same object afterwards). Thread-safe.
  std::shared_ptr<KvMemoryBudget> TenantBudget(const std::string& tenant, int64_t max_bytes);

  int64_t capacity_bytes() const { return budget_->capacity_bytes(); }
  int64_t used_bytes() const { return budget_->used_bytes(); }
  int64_t free_bytes() const { return budget_->free_bytes(); }

 private:
  std::shared_ptr<KvMemoryBudget> budget_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<KvMemoryBudget>> tenant_budgets_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_SESSION_KV_POOL_H_
