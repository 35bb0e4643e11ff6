// Host memory behind a layer's KV pages. Pages are fixed-size byte blocks addressed by id; memory
// is committed in slabs as ids are first used, so a pool sized for the worst case costs only what
// its sequences hold (ids are handed out lowest first, keeping the touched slabs few).
#ifndef ATTNSERVE_KERNELS_CPU_HOST_PAGE_STORE_H_
#define ATTNSERVE_KERNELS_CPU_HOST_PAGE_STORE_H_

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace attnserve {

class HostPageStore {
 public:
  explicit HostPageStore(int64_t page_bytes);

  // Commits memory for `pages` if not yet committed. RESOURCE_EXHAUSTED when the host refuses.
  absl::Status Commit(absl::Span<const int32_t> pages);

  std::byte* page(int32_t id) {
    return slabs_[id / kPagesPerSlab].get() + (id % kPagesPerSlab) * page_bytes_;
  }
  const std::byte* page(int32_t id) const {
    return slabs_[id / kPagesPerSlab].get() + (id % kPagesPerSlab) * page_bytes_;
  }
  int64_t page_bytes() const { return page_bytes_; }
  int64_t committed_bytes() const { return committed_slabs_ * kPagesPerSlab * page_bytes_; }

 private:
  struct FreeDeleter {
    void operator()(std::byte* p) const { std::free(p); }
  };
  static constexpr int64_t kPagesPerSlab = 64;
  int64_t page_bytes_;
  int64_t committed_slabs_ = 0;
  std::vector<std::unique_ptr<std::byte[], FreeDeleter>> slabs_;
};

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_CPU_HOST_PAGE_STORE_H_
