#include "server/kv_pool.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace attnserve::server {

absl::StatusOr<KvCacheConfig> KvPool::ConfigFor(const LayerSpec& spec, DType dtype,
                                                int page_size) const {
  const int64_t page_bytes = KvBytesPerToken(spec, dtype) * page_size;
  if (page_bytes <= 0 || page_bytes > capacity_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page_size: one page of ", page_size, " tokens takes ", page_bytes,
        " bytes, more than the whole KV pool (", capacity_bytes(), " bytes, --kv_pool_bytes)"));
  }
  KvCacheConfig config;
  config.dtype = dtype;
  config.page_size = page_size;
  // The engine's page allocator takes at most 2^31 - 1 pages.
  config.max_pages = std::min<int64_t>(capacity_bytes() / page_bytes, (int64_t{1} << 31) - 1);
  config.budget = budget_;
  return config;
}

}  // namespace attnserve::server
