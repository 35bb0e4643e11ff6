// Hands out page ids [0, capacity) from a free list. Storage lives elsewhere (host slabs or one
// device allocation); this class only decides which ids are in use. Memory is proportional to the
// ids ever handed out, not to the capacity: a layer sized for a whole device pool of tiny pages
// (hundreds of millions of ids) costs nothing until it is used.
#ifndef ATTNSERVE_KERNELS_KV_PAGE_ALLOCATOR_H_
#define ATTNSERVE_KERNELS_KV_PAGE_ALLOCATOR_H_

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
  int64_t used() const { return next_fresh_ - static_cast<int64_t>(returned_.size()); }
  int64_t free() const { return capacity_ - used(); }

 private:
  int64_t capacity_;
  int64_t next_fresh_ = 0;         // Ids [next_fresh_, capacity) were never handed out.
  std::vector<int32_t> returned_;  // Freed ids, reused first (stack: back() goes out next).
};

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_KV_PAGE_ALLOCATOR_H_
