#include "kernels/cpu/host_page_store.h"

#include "absl/strings/str_cat.h"

namespace attnserve {

HostPageStore::HostPageStore(int64_t page_bytes, int64_t capacity_pages)
    : page_bytes_(page_bytes),
      slabs_(static_cast<size_t>((capacity_pages + kPagesPerSlab - 1) / kPagesPerSlab)) {}

absl::Status HostPageStore::Commit(absl::Span<const int32_t> pages) {
  for (int32_t id : pages) {
    auto& slab = slabs_[id / kPagesPerSlab];
    if (slab != nullptr) continue;
    // 64-byte alignment keeps rows of K/V on cache-line boundaries for the SIMD loops.
    const int64_t bytes = (kPagesPerSlab * page_bytes_ + 63) / 64 * 64;
    slab.reset(static_cast<std::byte*>(std::aligned_alloc(64, static_cast<size_t>(bytes))));
    if (slab == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("host refused ", bytes, " bytes for KV pages"));
    }
    ++committed_slabs_;
  }
  return absl::OkStatus();
}

}  // namespace attnserve
