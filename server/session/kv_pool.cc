#include "server/session/kv_pool.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/kv/quantization.h"

namespace attnserve::server {

absl::StatusOr<KvCacheConfig> KvPool::ConfigFor(const LayerSpec& spec,
                                                const KvStorageFormat& storage,
                                                int page_size) const {
  return ConfigFor(spec, storage, page_size, nullptr);
}

absl::StatusOr<KvCacheConfig> KvPool::ConfigFor(
    const LayerSpec& spec, const KvStorageFormat& storage, int page_size,
    std::shared_ptr<KvMemoryBudget> tenant_budget) const {
  const int64_t page_bytes = KvPageBytes(spec, storage, page_size);  // Scales included.
  if (page_bytes <= 0 || page_bytes > capacity_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page_size: one page of ", page_size, " tokens takes ", page_bytes,
        " bytes, more than the whole KV pool (", capacity_bytes(), " bytes, --kv_pool_bytes)"));
  }
  KvCacheConfig config;
  config.storage = storage;
  config.page_size = page_size;
  // The engine's page allocator takes at most 2^31 - 1 pages.
  config.max_pages = std::min<int64_t>(capacity_bytes() / page_bytes, (int64_t{1} << 31) - 1);
  config.budget = budget_;
  if (tenant_budget != nullptr) {
    if (page_bytes > tenant_budget->capacity_bytes()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("page_size: one page of ", page_size, " tokens takes ", page_bytes,
                       " bytes, more than the whole KV quota of ", tenant_budget->name(), " (",
                       tenant_budget->capacity_bytes(), " bytes)"));
    }
    config.budget = std::move(tenant_budget);
  }
  // Bytes held ahead of their pages (a chunked Forward's, an import's) are reserved by the layer's
  // ledger on this budget (AttentionLayer::ReserveKv / ReserveImport), not by the session.
  return config;
}

std::shared_ptr<KvMemoryBudget> KvPool::TenantBudget(const std::string& tenant, int64_t max_bytes) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<KvMemoryBudget>& budget = tenant_budgets_[tenant];
  if (budget == nullptr) {
    budget = std::make_shared<KvMemoryBudget>(
        max_bytes, budget_, absl::StrCat("tenant '", tenant, "' (--tenant_max_kv_bytes)"));
  }
  return budget;
}

}  // namespace attnserve::server
