#include "kernels/page_allocator.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace attnserve {

PageAllocator::PageAllocator(int64_t capacity) : capacity_(capacity) {
  free_.reserve(static_cast<size_t>(capacity));
  for (int64_t id = capacity - 1; id >= 0; --id) free_.push_back(static_cast<int32_t>(id));
}

absl::StatusOr<std::vector<int32_t>> PageAllocator::Allocate(int64_t count) {
  if (count > free()) {
    return absl::ResourceExhaustedError(absl::StrCat("KV pool exhausted: needed ", count,
                                                     " pages, ", free(), " free of ", capacity_));
  }
  std::vector<int32_t> pages(free_.end() - count, free_.end());
  std::reverse(pages.begin(), pages.end());
  free_.resize(free_.size() - static_cast<size_t>(count));
  return pages;
}

void PageAllocator::Free(absl::Span<const int32_t> pages) {
  for (auto it = pages.rbegin(); it != pages.rend(); ++it) free_.push_back(*it);
}

}  // namespace attnserve
