// A sequence's page table: which pool pages hold its tokens (vLLM's PagedAttention layout).
//
// Token t of a sequence lives in page pages[t / page_size], slot t % page_size. Pages that a
// sliding window has left behind for good are returned to the pool and marked kEvictedPage; the
// table keeps its length so token indices never shift. This one value type is shared by the CPU
// and CUDA backends.
#ifndef ATTNSERVE_KERNELS_KV_PAGE_TABLE_H_
#define ATTNSERVE_KERNELS_KV_PAGE_TABLE_H_

#include <cstdint>
#include <vector>

namespace attnserve {

inline constexpr int32_t kEvictedPage = -1;

struct PageTable {
  std::vector<int32_t> pages;  // [ceil(num_tokens / page_size)] pool page ids or kEvictedPage.
  int64_t num_tokens = 0;      // Tokens written so far.

  int32_t PageOf(int64_t token, int page_size) const { return pages[token / page_size]; }
};

// Pages needed to hold `num_tokens` tokens.
inline int64_t PagesForTokens(int64_t num_tokens, int page_size) {
  return (num_tokens + page_size - 1) / page_size;
}

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_KV_PAGE_TABLE_H_
