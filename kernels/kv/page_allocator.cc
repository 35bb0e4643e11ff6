#include "kernels/kv/page_allocator.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace attnserve {

PageAllocator::PageAllocator(int64_t capacity) : capacity_(capacity) {}

absl::StatusOr<std::vector<int32_t>> PageAllocator::Allocate(int64_t count) {
  if (count > free()) {
    return absl::ResourceExhaustedError(absl::StrCat("KV pool exhausted: needed ", count,
                                                     " pages, ", free(), " free of ", capacity_));
  }
  std::vector<int32_t> pages;
  pages.reserve(static_cast<size_t>(count));
  while (static_cast<int64_t>(pages.size()) < count && !returned_.empty()) {
    pages.push_back(returned_.back());
    returned_.pop_back();
  }
  while (static_cast<int64_t>(pages.size()) < count) {
    pages.push_back(static_cast<int32_t>(next_fresh_++));
  }
  return pages;
}

void PageAllocator::Free(absl::Span<const int32_t> pages) {
  for (auto it = pages.rbegin(); it != pages.rend(); ++it) returned_.push_back(*it);
}

}  // namespace attnserve
