// A layer's sequences and their KV pages, independent of where the pages live: the sequence
// table, all-or-nothing page reservation against the layer's allocator and the shared byte budget,
// rollback, and sliding-window eviction. The CPU and CUDA layers share it, so both backends refuse,
// reserve and evict identically; each supplies only a commit hook that backs page ids with memory.
//
// Not thread-safe: the owning layer serialises calls (it holds its own mutex around every call).
#ifndef ATTNSERVE_KERNELS_KV_SEQUENCE_TABLE_H_
#define ATTNSERVE_KERNELS_KV_SEQUENCE_TABLE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/backend.h"
#include "kernels/kv/memory_budget.h"
#include "kernels/kv/page_allocator.h"
#include "kernels/kv/page_table.h"

namespace attnserve {

// One sequence's share of a batch, after validation and page reservation.
// RESOURCE_EXHAUSTED for a charge of `bytes` (`pages` pages of `page_size` tokens) that
// `budget` refused, for `what` ("this batch", "this Forward"): the numbers of the budget that
// refused it, a named tenant quota or the device pool itself.
absl::Status KvBudgetExhaustedError(const KvMemoryBudget& budget, int64_t bytes, int64_t pages,
                                    int64_t page_size, absl::string_view what);

struct BatchSequence {
  PageTable* table = nullptr;  // num_tokens already counts the new tokens; pages reserved.
  int64_t first_row = 0;       // Row of the batch holding its first new token.
  int64_t num_new = 0;         // New tokens (rows).
  int64_t first_index = 0;     // Index within the sequence of its first new token.
  int64_t pages_before = 0;    // table->pages.size() before the reservation (for rollback).
};

// Each row's RoPE position for a reserved batch of `rows` rows: positions[row] when `positions` is
// given (one per row), else the row's index in its sequence (each sequence continues from its
// length). For callers that give no positions: the server resolves them once (Session::Plan) and
// gives one per row, which the CPU backend uses as they are (the CUDA backend's PlanBatch copies
// them through here into the plan it uploads).
std::vector<int64_t> ResolvePositions(absl::Span<const BatchSequence> batch,
                                      absl::Span<const int64_t> positions, int64_t rows);

class KvSequenceTable {
 public:
  // Backs newly allocated page ids with memory; an error makes the reservation fail unchanged.
  using CommitFn = std::function<absl::Status(absl::Span<const int32_t> pages)>;
  // Copies page `from`'s bytes to each page of `to` (all committed). An error fails the fork
  // unchanged.
  using CopyPageFn = std::function<absl::Status(int32_t from, absl::Span<const int32_t> to)>;
  // Copies `pages` (committed) in order into `out`, page_bytes each (ExportSequence).
  using ReadPagesFn = std::function<absl::Status(absl::Span<const int32_t> pages, char* out)>;
  // Copies `src`, page_bytes per page, into `pages` (committed, in order) (ImportSequence). An
  // error fails the import unchanged.
  using WritePagesFn =
      std::function<absl::Status(absl::Span<const int32_t> pages, const char* src)>;

  // causal/sliding_window as in LayerSpec (window 0 = unlimited: nothing is ever evicted).
  KvSequenceTable(int page_size, int64_t page_bytes, int64_t max_pages,
                  std::shared_ptr<KvMemoryBudget> budget, bool causal, int sliding_window);
  // Gives every page still held back to the shared budget.
  ~KvSequenceTable();

  SequenceId Create();
  // Frees the sequence's pages. NOT_FOUND for an unknown id.
  absl::Status Release(SequenceId sequence);
  // NOT_FOUND for an unknown id.
  absl::StatusOr<int64_t> Length(SequenceId sequence) const;

  // Checks ids (known, distinct) and counts (>= 1), then reserves pages for every sequence's new
  // tokens, all or nothing: the shared budget first, then the allocator, then `commit`. On success
  // each table's num_tokens counts the new tokens and `batch` describes the rows (in the order
  // given, rows consecutive). On error nothing changed. RESOURCE_EXHAUSTED names the numbers.
  absl::Status Reserve(absl::Span<const SequenceId> ids, absl::Span<const int64_t> counts,
                       const CommitFn& commit, std::vector<BatchSequence>& batch);
  // AttentionLayer::ForkSequence: `count` new sequences sharing `source`'s full pages (each gains
  // a reference) and each holding a copy of its partly filled last page, made with `copy` after
  // `commit`; budget, allocator and commit are charged for those copies only, all or nothing.
  absl::StatusOr<std::vector<SequenceId>> Fork(SequenceId source, int count, const CommitFn& commit,
                                               const CopyPageFn& copy);
  // The page table of `sequence` (a copy). NOT_FOUND for an unknown id.
  absl::StatusOr<PageTable> Table(SequenceId sequence) const;
  // AttentionLayer::ExportSequence, wherever the pages live: the held pages' bytes as `read`
  // copies them, the length and the first held page. The same byte format for every backend
  // (the pages verbatim, kernels/kv/page_layout.h), so CPU and CUDA layers of one spec, storage
  // format and page size exchange sequences.
  absl::StatusOr<SequenceExport> Export(SequenceId sequence, const ReadPagesFn& read) const;
  // AttentionLayer::ImportSequence: checks `exported` against this table (page_bytes, the byte
  // count, first_held_page against the eviction rule), then makes a new sequence whose first
  // `first_held_page` pages are evicted and whose other pages are new, backed by `commit` and
  // filled by `write`; budget, allocator, commit and write are all or nothing.
  absl::StatusOr<SequenceId> Import(const SequenceExport& exported, const CommitFn& commit,
                                    const WritePagesFn& write);
  // Undoes a successful Reserve (when the compute after it failed): num_tokens and the page lists
  // return to what they were and the new pages go back to the pool and the budget.
  void Rollback(absl::Span<const BatchSequence> batch);
  // Returns pages that no future query can see (causal sliding window) to the pool.
  void EvictOutsideWindow(PageTable& table);

  // Bytes of the pages `sequence` holds now (evicted pages not counted). NOT_FOUND for an
  // unknown id.
  absl::StatusOr<int64_t> HeldBytes(SequenceId sequence) const;
  // Bytes a sequence of `num_tokens` tokens holds between calls: whole pages, less those that
  // EvictOutsideWindow has returned. What a caller reserves ahead of growing a sequence.
  int64_t HeldBytesAtLength(int64_t num_tokens) const;

  KvPoolUsage Usage() const;
  int page_size() const { return page_size_; }
  int64_t page_bytes() const { return page_bytes_; }

 private:
  // Drops one reference to each page; a page goes back to the allocator and the budget when its
  // last holder lets it go.
  void FreePages(absl::Span<const int32_t> pages);
  // Gives pages just taken for a fork or an import (held by nobody else) back to the allocator
  // and the budget, when filling them failed.
  void ReturnNewPages(absl::Span<const int32_t> pages);
  // The eviction rule: how many leading pages of a sequence of `num_tokens` tokens no future
  // query can see (0 without a causal sliding window).
  int64_t DeadPages(int64_t num_tokens) const;

  const int page_size_;
  const int64_t page_bytes_;
  const std::shared_ptr<KvMemoryBudget> budget_;
  const bool causal_;
  const int sliding_window_;
  PageAllocator allocator_;
  absl::node_hash_map<SequenceId, PageTable> sequences_;
  // References beyond the first, for pages that forks share (absent = one holder).
  absl::flat_hash_map<int32_t, int32_t> extra_references_;
  SequenceId next_id_ = 1;
};

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_KV_SEQUENCE_TABLE_H_
