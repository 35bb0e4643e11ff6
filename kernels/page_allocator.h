// Hands out page ids [0, capacity) from a free list. Storage lives elsewhere (host slabs or one
// device allocation); this class only decides which ids are in use.
#ifndef ATTNSERVE_KERNELS_PAGE_ALLOCATOR_H_
#define ATTNSERVE_KERNELS_PAGE_ALLOCATOR_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace attnserve {

class PageAllocator {
 public:
  explicit PageAllocator(int64_t capacity);

  // `count` page ids, all or nothing. RESOURCE_EXHAUSTED with the numbers when fewer are free.
  absl::StatusOr<std::vector<int32_t>> Allocate(int64_t count);
  // Returns pages to the pool. Each id must have come from Allocate and not been freed since.
  void Free(absl::Span<const int32_t> pages);

  int64_t capacity() const { return capacity_; }
  int64_t used() const { return capacity_ - static_cast<int64_t>(free_.size()); }
  int64_t free() const { return static_cast<int64_t>(free_.size()); }

 private:
  int64_t capacity_;
  std::vector<int32_t> free_;  // Stack; back() is the next id handed out.
};

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_PAGE_ALLOCATOR_H_
