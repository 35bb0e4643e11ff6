#include "kernels/kv/cache_config.h"

#include "absl/strings/str_cat.h"

namespace attnserve {

absl::Status ValidateKvPaging(const KvCacheConfig& config) {
  if (config.page_size < 1 || config.page_size > kMaxPageSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size = ", config.page_size, ": must be in [1, ", kMaxPageSize, "]"));
  }
  if (config.max_pages < 1 || config.max_pages > (int64_t{1} << 31) - 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_pages = ", config.max_pages, ": must be in [1, 2^31 - 1]"));
  }
  return absl::OkStatus();
}

}  // namespace attnserve
