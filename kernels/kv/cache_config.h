// How a layer stores its KV cache (KvCacheConfig) and the paging checks every backend applies to
// it in CreateLayer, so the CPU and CUDA backends accept the same page sizes and pool sizes with
// the same messages. Which KV dtypes a backend stores stays that backend's own check.
#ifndef ATTNSERVE_KERNELS_KV_CACHE_CONFIG_H_
#define ATTNSERVE_KERNELS_KV_CACHE_CONFIG_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "kernels/core/tensor.h"
#include "kernels/kv/sequence_table.h"
#include "kernels/kv/storage_format.h"

namespace attnserve {

struct KvCacheConfig {
  // How cached K/V (or MLA latent and RoPE key) are stored; not the dtype the layer computes in.
  KvStorageFormat storage;
  int page_size = 0;         // Tokens per page; 0 = DefaultPageSize(spec).
  int64_t max_pages = 4096;  // Pool capacity in pages. Memory is committed as pages are used.
  // Optional budget shared with other layers (e.g. every session on a device). When set, pages are
  // charged to it as well, and a batch that would pass it fails with RESOURCE_EXHAUSTED.
  std::shared_ptr<KvMemoryBudget> budget;
};

// Largest page a layer may use, in tokens.
inline constexpr int kMaxPageSize = 4096;

// OK when page_size is in [1, kMaxPageSize] (0, the default, must already be resolved) and
// max_pages in [1, 2^31 - 1] (page ids are int32). Otherwise INVALID_ARGUMENT naming the field.
absl::Status ValidateKvPaging(const KvCacheConfig& config);

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_KV_CACHE_CONFIG_H_
