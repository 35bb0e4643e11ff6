#include "kernels/cpu/host_page_store.h"

#include "absl/strings/str_cat.h"

namespace attnserve {

HostPageStore::HostPageStore(int64_t page_bytes) : page_bytes_(page_bytes) {}

absl::Status HostPageStore::Commit(absl::Span<const int32_t> pages) {
  for (int32_t id : pages) {
    // The slab table grows with the highest id used, not with the capacity.
    const size_t slab_index = static_cast<size_t>(id / kPagesPerSlab);
    if (slab_index >= slabs_.size()) slabs_.resize(slab_index + 1);
    auto& slab = slabs_[slab_index];
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
