// The KV ledger: a layer's sequences and their KV pages, independent of where the pages live —
// each sequence's page table, the allocator of page ids, all-or-nothing page reservation against
// that allocator and the shared byte budget (KvMemoryBudget, here too), reservations held by a
// sequence ahead of its growth (ReserveAhead), rollback, and sliding-window eviction. The CPU and
// CUDA layers share it, so both backends refuse, reserve and evict identically; each supplies only
// a commit hook that backs page ids with memory. One file, so a page and its bytes are counted in
// one place.
//
// Not thread-safe: the owning layer serialises calls (it holds its own mutex around every call).
#ifndef ATTNSERVE_KERNELS_KV_SEQUENCE_TABLE_H_
#define ATTNSERVE_KERNELS_KV_SEQUENCE_TABLE_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace attnserve {

// Identifies one sequence within a layer. Ids are never reused by the same layer.
using SequenceId = int64_t;

// One sequence's share of a Prefill call.
struct PrefillChunk {
  SequenceId sequence = 0;
  int64_t num_tokens = 0;  // Rows of the batch's hidden-state tensor that belong to this sequence.
};

// One layer's share of a stack's SequenceExport (see SequenceExport::layers).
struct LayerExtent {
  int64_t num_tokens = 0;       // Tokens cached (every layer holds the same between steps).
  int64_t first_held_page = 0;  // Leading pages this layer's window evicted: not sent.
  int64_t held_pages = 0;       // This layer's pages in SequenceExport::pages.
};

// One sequence's cached tokens as bytes (AttentionLayer::ExportSequence), to recreate it in another
// layer of the same spec, KV storage format and page size (ImportSequence) — on another replica.
struct SequenceExport {
  int64_t num_tokens = 0;       // Tokens cached.
  int64_t first_held_page = 0;  // Leading pages a sliding window evicted: not in `pages`.
  int64_t page_bytes = 0;       // Bytes per page as the layer stores it (any scales included).
  // Pages [first_held_page, ceil(num_tokens / page_size)) verbatim, in order, page_bytes each.
  std::string pages;
  // A stack's export (LayerStack::ExportSequence): one extent per layer, in layer order, and
  // `pages` holds layer 0's held pages, then layer 1's, and so on (each layer's window evicts its
  // own leading pages, so each has its own first_held_page; the top-level one is then 0). Empty
  // for one layer.
  std::vector<LayerExtent> layers;
};

// Pool usage, in pages of this layer's page size.
struct KvPoolUsage {
  int64_t page_size = 0;   // Tokens per page.
  int64_t page_bytes = 0;  // Bytes per page.
  int64_t capacity_pages = 0;
  int64_t used_pages = 0;
};

// A sequence's page table: which pool pages hold its tokens (vLLM's PagedAttention layout).
//
// Token t of a sequence lives in page pages[t / page_size], slot t % page_size. Pages that a
// sliding window has left behind for good are returned to the pool and marked kEvictedPage; the
// table keeps its length so token indices never shift. This one value type is shared by the CPU
// and CUDA backends.
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

// Hands out page ids [0, capacity) from a free list. Storage lives elsewhere (host slabs or one
// device allocation); this class only decides which ids are in use. Memory is proportional to the
// ids ever handed out, not to the capacity: a layer sized for a whole device pool of tiny pages
// (hundreds of millions of ids) costs nothing until it is used.
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

// A byte budget shared by every layer on one device: the server's "KV pool" limit. Each layer's
// pages are charged here when reserved and credited when released or evicted, so the sum of all
// sessions' KV memory never passes the budget and the server can report exact use.
//
// A budget may have a parent (a tenant's quota inside the device pool): a charge then succeeds
// only when both have room, and is made to both or to neither; a release credits both.
//
// Bytes held ahead of their pages (a chunked Forward's, an import's) are a reservation in the
// ledger of the layer that will hold the pages (KvReservations, below), charged here once.
class KvMemoryBudget {
 public:
  explicit KvMemoryBudget(int64_t capacity_bytes) : capacity_(capacity_bytes) {}
  // A budget inside `parent` (which must not be null). `name` says what it limits, for error
  // messages (e.g. "tenant 'alice' (--tenant_max_kv_bytes)").
  KvMemoryBudget(int64_t capacity_bytes, std::shared_ptr<KvMemoryBudget> parent, std::string name)
      : capacity_(capacity_bytes), parent_(std::move(parent)), name_(std::move(name)) {}

  // Charges `bytes` if they fit here and in every ancestor; false (and nothing charged anywhere)
  // otherwise. Thread-safe.
  bool TryCharge(int64_t bytes) {
    if (!TryChargeOwn(bytes)) return false;
    if (parent_ != nullptr && !parent_->TryCharge(bytes)) {
      used_.fetch_sub(bytes, std::memory_order_relaxed);
      return false;
    }
    return true;
  }
  void Release(int64_t bytes) {
    used_.fetch_sub(bytes, std::memory_order_relaxed);
    if (parent_ != nullptr) parent_->Release(bytes);
  }

  int64_t capacity_bytes() const { return capacity_; }
  int64_t used_bytes() const { return used_.load(std::memory_order_relaxed); }
  // What a charge could take now: the least room of this budget and its ancestors.
  int64_t free_bytes() const {
    const int64_t own = capacity_ - used_bytes();
    return parent_ == nullptr ? own : std::min(own, parent_->free_bytes());
  }
  // "" for a root budget (the device pool).
  const std::string& name() const { return name_; }

  // The budget (this or an ancestor) that a charge of `bytes` would not fit now, nullptr if it
  // would fit; for error messages after TryCharge failed (the nearest one is named first).
  const KvMemoryBudget* Refuser(int64_t bytes) const {
    if (used_bytes() + bytes > capacity_) return this;
    return parent_ == nullptr ? nullptr : parent_->Refuser(bytes);
  }

 private:
  bool TryChargeOwn(int64_t bytes) {
    int64_t used = used_.load(std::memory_order_relaxed);
    do {
      if (used + bytes > capacity_) return false;
    } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
    return true;
  }

  const int64_t capacity_;
  const std::shared_ptr<KvMemoryBudget> parent_;
  const std::string name_;
  std::atomic<int64_t> used_{0};
};

// RESOURCE_EXHAUSTED for a charge of `bytes` (`pages` pages of `page_size` tokens) that
// `budget` refused, for `what` ("this batch", "this Forward"): the numbers of the budget that
// refused it, a named tenant quota or the device pool itself.
absl::Status KvBudgetExhaustedError(const KvMemoryBudget& budget, int64_t bytes, int64_t pages,
                                    int64_t page_size, absl::string_view what);

// Bytes charged to a KV byte budget ahead of sequences' growth, by sequence, drawn on as their
// pages are taken: the ledger below (KvSequenceTable::ReserveAhead) and a stack of layers
// (LayerStack::ReserveKv) hold a chunked Forward's bytes so (AttentionLayer::ReserveKv), and an
// import its sequence's, so the pages the chunks take are paid for by the reservation instead of
// being charged again, and no other charger on the budget can take the bytes in between. One type
// for every owner (they kept near-copies of this bookkeeping before); here, beside the budget,
// because a reservation is bytes of that budget counted ahead of their pages.
//
// Charges the budget only when a reservation is set. A draw moves bytes from a reservation to the
// pages its owner holds (still charged, now as pages); what Release forgets is still charged, and
// its owner gives it back (or counts on it, as LayerStack's Settle does). Not thread-safe: its
// owner's lock guards it.
class KvReservations {
 public:
  // Makes the error for a growth of `bytes` that `budget` refused.
  using RefusedFn = absl::FunctionRef<absl::Status(const KvMemoryBudget& budget, int64_t bytes)>;

  // Sets each ids[i]'s reservation to bytes[i] (0 or less: none) and settles the difference from
  // what they hold now with `budget` (none when null) in one step: a growth is charged all or
  // nothing (TryCharge), a shrink released. The ids must be distinct (the owners check them, with
  // their own messages). When the budget refuses, nothing changed and the result is
  // refused(budget, growth).
  absl::Status Set(absl::Span<const SequenceId> ids, absl::Span<const int64_t> bytes,
                   KvMemoryBudget* budget, RefusedFn refused);

  // Bytes reserved for `sequence` now (0 for none or an unknown id).
  int64_t Held(SequenceId sequence) const;
  // Takes up to `bytes` off `sequence`'s reservation (they now pay for pages it holds) and returns
  // what it took: never more than is held, 0 for none.
  int64_t Draw(SequenceId sequence, int64_t bytes);
  // Puts `bytes` drawn from `sequence`'s reservation back, still charged (the pages they paid for
  // were given back unused: a failed call's rollback).
  void Restore(SequenceId sequence, int64_t bytes);
  // Forgets `sequence`'s reservation and returns its bytes, still charged: the owner gives them
  // back. 0 for none or an unknown id.
  int64_t Release(SequenceId sequence);

  // Bytes reserved over all sequences (charged to the budget besides the pages held).
  int64_t total() const { return total_; }

 private:
  absl::flat_hash_map<SequenceId, int64_t> held_;  // Absent: none.
  int64_t total_ = 0;
};

// One sequence's share of a batch, after validation and page reservation.
struct BatchSequence {
  PageTable* table = nullptr;  // num_tokens already counts the new tokens; pages reserved.
  int64_t first_row = 0;       // Row of the batch holding its first new token.
  int64_t num_new = 0;         // New tokens (rows).
  int64_t first_index = 0;     // Index within the sequence of its first new token.
  int64_t pages_before = 0;    // table->pages.size() before the reservation (for rollback).
  int64_t ahead_used = 0;      // Bytes of its new pages drawn on its reservation (ReserveAhead).
  SequenceId sequence = 0;
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
  // tokens, all or nothing: the shared budget first, then the allocator, then `commit`. A
  // sequence's new pages draw on its reservation (ReserveAhead) first, charging the budget only
  // for the rest. On success each table's num_tokens counts the new tokens and `batch` describes
  // the rows (in the order given, rows consecutive). On error nothing changed. RESOURCE_EXHAUSTED
  // names the numbers.
  absl::Status Reserve(absl::Span<const SequenceId> ids, absl::Span<const int64_t> counts,
                       const CommitFn& commit, std::vector<BatchSequence>& batch);
  // AttentionLayer::ReserveKv: sets each sequence's reservation to the bytes growing it by
  // `num_tokens[i]` more tokens will hold (HeldBytesAtLength of the longer sequence less that of
  // the present one; 0 tokens gives the reservation back). The bytes are charged to the budget
  // here, once: later Reserve calls on the sequence draw on them instead of charging again, so no
  // other charger on the budget can take them in between. The difference from the reservations
  // held now is charged (or released) in one step, all or nothing: NOT_FOUND for an unknown id,
  // INVALID_ARGUMENT for a repeated id or num_tokens < 0, RESOURCE_EXHAUSTED (naming `what`, as
  // "this Forward") when the budget cannot hold it. Release gives a sequence's reservation back
  // with its pages.
  absl::Status ReserveAhead(absl::Span<const SequenceId> ids, absl::Span<const int64_t> num_tokens,
                            absl::string_view what);
  // Bytes still reserved ahead for `sequence` (0 for none or an unknown id).
  int64_t ReservedAhead(SequenceId sequence) const;
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
  // AttentionLayer::ImportSequenceInto: checks `exported` against this table (page_bytes, the
  // byte count, first_held_page against the eviction rule) and `into` (known, no tokens yet), then
  // gives `into` the exported tokens: its first `first_held_page` pages evicted, its other pages
  // new, backed by `commit` and filled by `write`. The pages draw on `into`'s reservation
  // (ReserveAhead, as AttentionLayer::ReserveImport makes it) first and charge the budget for the
  // rest; what the reservation holds beyond them is given back, so an imported sequence holds no
  // reservation. Budget, allocator, commit and write are all or nothing: on error `into` and its
  // reservation are unchanged.
  absl::Status Import(const SequenceExport& exported, SequenceId into, const CommitFn& commit,
                      const WritePagesFn& write);
  // Undoes a successful Reserve (when the compute after it failed): num_tokens and the page lists
  // return to what they were and the new pages go back to the pool and the budget (what they drew
  // on a reservation goes back to the reservation).
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
  // Gives pages just taken for a fork (held by nobody else) back to the allocator and the budget,
  // when filling them failed.
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
  // Bytes charged to the budget ahead of a sequence's growth (ReserveAhead). Counted in the budget
  // besides the held pages.
  KvReservations ahead_;
  SequenceId next_id_ = 1;
};

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_KV_SEQUENCE_TABLE_H_
