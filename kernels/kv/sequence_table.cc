#include "kernels/kv/sequence_table.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
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

absl::Status KvBudgetExhaustedError(const KvMemoryBudget& budget, int64_t bytes, int64_t pages,
                                    int64_t page_size, absl::string_view what) {
  // The budget that refused: a named quota inside the pool (a tenant's), or the pool itself.
  const KvMemoryBudget* full = budget.Refuser(bytes);
  if (full == nullptr) full = &budget;  // Freed concurrently since.
  return absl::ResourceExhaustedError(absl::StrCat(
      "KV memory budget exhausted: ", what, " needs ", bytes, " bytes (", pages, " pages of ",
      page_size, " tokens), ", full->capacity_bytes() - full->used_bytes(), " of ",
      full->capacity_bytes(), " bytes are free",
      full->name().empty() ? "" : absl::StrCat(" in the KV quota of ", full->name())));
}

std::vector<int64_t> ResolvePositions(absl::Span<const BatchSequence> batch,
                                      absl::Span<const int64_t> positions, int64_t rows) {
  std::vector<int64_t> resolved(static_cast<size_t>(rows));
  for (const BatchSequence& seq : batch) {
    for (int64_t i = 0; i < seq.num_new; ++i) {
      resolved[seq.first_row + i] =
          positions.empty() ? seq.first_index + i : positions[seq.first_row + i];
    }
  }
  return resolved;
}

absl::Status KvReservations::Set(absl::Span<const SequenceId> ids, absl::Span<const int64_t> bytes,
                                 KvMemoryBudget* budget, RefusedFn refused) {
  int64_t delta = 0;  // Bytes to charge (> 0) or release (< 0) in all.
  for (size_t i = 0; i < ids.size(); ++i) delta += std::max<int64_t>(0, bytes[i]) - Held(ids[i]);
  if (budget != nullptr && delta > 0 && !budget->TryCharge(delta)) return refused(*budget, delta);
  if (budget != nullptr && delta < 0) budget->Release(-delta);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (bytes[i] > 0) {
      held_[ids[i]] = bytes[i];
    } else {
      held_.erase(ids[i]);
    }
  }
  total_ += delta;
  return absl::OkStatus();
}

int64_t KvReservations::Held(SequenceId sequence) const {
  auto it = held_.find(sequence);
  return it == held_.end() ? 0 : it->second;
}

int64_t KvReservations::Draw(SequenceId sequence, int64_t bytes) {
  auto it = held_.find(sequence);
  if (it == held_.end() || bytes <= 0) return 0;
  const int64_t taken = std::min(bytes, it->second);
  it->second -= taken;
  total_ -= taken;
  if (it->second == 0) held_.erase(it);
  return taken;
}

void KvReservations::Restore(SequenceId sequence, int64_t bytes) {
  if (bytes <= 0) return;
  held_[sequence] += bytes;
  total_ += bytes;
}

int64_t KvReservations::Release(SequenceId sequence) {
  auto it = held_.find(sequence);
  if (it == held_.end()) return 0;
  const int64_t bytes = it->second;
  held_.erase(it);
  total_ -= bytes;
  return bytes;
}

KvSequenceTable::KvSequenceTable(int page_size, int64_t page_bytes, int64_t max_pages,
                                 std::shared_ptr<KvMemoryBudget> budget, bool causal,
                                 int sliding_window)
    : page_size_(page_size),
      page_bytes_(page_bytes),
      budget_(std::move(budget)),
      causal_(causal),
      sliding_window_(sliding_window),
      allocator_(max_pages) {}

KvSequenceTable::~KvSequenceTable() {
  // Sessions end by destroying their layer: give everything still held back to the shared budget.
  if (budget_ != nullptr) budget_->Release(allocator_.used() * page_bytes_ + ahead_.total());
}

SequenceId KvSequenceTable::Create() {
  const SequenceId id = next_id_++;
  sequences_.emplace(id, PageTable{});
  return id;
}

absl::Status KvSequenceTable::Release(SequenceId sequence) {
  auto it = sequences_.find(sequence);
  if (it == sequences_.end()) {
    return absl::NotFoundError(absl::StrCat("sequence ", sequence, " does not exist"));
  }
  std::vector<int32_t> held;
  for (int32_t page : it->second.pages) {
    if (page != kEvictedPage) held.push_back(page);
  }
  FreePages(held);
  sequences_.erase(it);
  const int64_t reserved = ahead_.Release(sequence);
  if (budget_ != nullptr && reserved > 0) budget_->Release(reserved);
  return absl::OkStatus();
}

absl::Status KvSequenceTable::ReserveAhead(absl::Span<const SequenceId> ids,
                                           absl::Span<const int64_t> num_tokens,
                                           absl::string_view what) {
  absl::flat_hash_set<SequenceId> seen;
  std::vector<int64_t> wanted(ids.size(), 0);
  int64_t pages = 0;  // The new reservations' pages, for the message.
  for (size_t i = 0; i < ids.size(); ++i) {
    auto it = sequences_.find(ids[i]);
    if (it == sequences_.end()) {
      return absl::NotFoundError(absl::StrCat("sequence ", ids[i], " does not exist"));
    }
    if (!seen.insert(ids[i]).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", ids[i], " appears more than once in one reservation"));
    }
    if (num_tokens[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", ids[i], ": num_tokens = ", num_tokens[i], ", must be >= 0"));
    }
    const int64_t length = it->second.num_tokens;
    wanted[i] =
        std::max<int64_t>(0, HeldBytesAtLength(length + num_tokens[i]) - HeldBytesAtLength(length));
    pages += wanted[i] / page_bytes_;
  }
  return ahead_.Set(ids, wanted, budget_.get(), [&](const KvMemoryBudget& budget, int64_t bytes) {
    return KvBudgetExhaustedError(budget, bytes, pages, page_size_, what);
  });
}

int64_t KvSequenceTable::ReservedAhead(SequenceId sequence) const { return ahead_.Held(sequence); }

absl::StatusOr<int64_t> KvSequenceTable::Length(SequenceId sequence) const {
  auto it = sequences_.find(sequence);
  if (it == sequences_.end()) {
    return absl::NotFoundError(absl::StrCat("sequence ", sequence, " does not exist"));
  }
  return it->second.num_tokens;
}

void KvSequenceTable::FreePages(absl::Span<const int32_t> pages) {
  std::vector<int32_t> last_held;
  last_held.reserve(pages.size());
  for (int32_t page : pages) {
    auto shared = extra_references_.find(page);
    if (shared == extra_references_.end()) {
      last_held.push_back(page);
    } else if (--shared->second == 0) {
      extra_references_.erase(shared);
    }
  }
  allocator_.Free(last_held);
  if (budget_ != nullptr) budget_->Release(static_cast<int64_t>(last_held.size()) * page_bytes_);
}

absl::StatusOr<std::vector<SequenceId>> KvSequenceTable::Fork(SequenceId source, int count,
                                                              const CommitFn& commit,
                                                              const CopyPageFn& copy) {
  auto it = sequences_.find(source);
  if (it == sequences_.end()) {
    return absl::NotFoundError(absl::StrCat("sequence ", source, " does not exist"));
  }
  if (count < 1) {
    return absl::InvalidArgumentError(absl::StrCat("fork count = ", count, ", must be >= 1"));
  }
  const PageTable& original = it->second;
  // The last page is written by the next token unless it is full: that one is copied per fork.
  // (It is never evicted: it holds the newest token.)
  const bool copy_last = original.num_tokens % page_size_ != 0;
  const int64_t pages_needed = copy_last ? count : 0;
  const int64_t bytes = pages_needed * page_bytes_;
  std::vector<int32_t> copies;
  if (pages_needed > 0) {
    if (budget_ != nullptr && !budget_->TryCharge(bytes)) {
      return KvBudgetExhaustedError(*budget_, bytes, pages_needed, page_size_, "this fork");
    }
    absl::StatusOr<std::vector<int32_t>> pages = allocator_.Allocate(pages_needed);
    if (!pages.ok()) {
      if (budget_ != nullptr) budget_->Release(bytes);
      return absl::ResourceExhaustedError(
          absl::StrCat("KV cache pool exhausted: this fork needs ", pages_needed, " more pages of ",
                       page_size_, " tokens (", bytes, " bytes), ", allocator_.free(), " of ",
                       allocator_.capacity(), " pages of this layer are free"));
    }
    if (absl::Status s = commit(*pages); !s.ok()) {
      allocator_.Free(*pages);
      if (budget_ != nullptr) budget_->Release(bytes);
      return s;
    }
    if (absl::Status s = copy(original.pages.back(), *pages); !s.ok()) {
      ReturnNewPages(*pages);
      return s;
    }
    copies = *std::move(pages);
  }
  const size_t shared_pages = original.pages.size() - (copy_last ? 1 : 0);
  std::vector<SequenceId> forks;
  for (int i = 0; i < count; ++i) {
    PageTable table = original;  // `original` stays valid: node_hash_map keeps nodes in place.
    if (copy_last) table.pages.back() = copies[i];
    for (size_t p = 0; p < shared_pages; ++p) {
      if (table.pages[p] != kEvictedPage) ++extra_references_[table.pages[p]];
    }
    const SequenceId id = next_id_++;
    sequences_.emplace(id, std::move(table));
    forks.push_back(id);
  }
  return forks;
}

absl::StatusOr<PageTable> KvSequenceTable::Table(SequenceId sequence) const {
  auto it = sequences_.find(sequence);
  if (it == sequences_.end()) {
    return absl::NotFoundError(absl::StrCat("sequence ", sequence, " does not exist"));
  }
  return it->second;
}

absl::StatusOr<SequenceExport> KvSequenceTable::Export(SequenceId sequence,
                                                      const ReadPagesFn& read) const {
  auto it = sequences_.find(sequence);
  if (it == sequences_.end()) {
    return absl::NotFoundError(absl::StrCat("sequence ", sequence, " does not exist"));
  }
  const PageTable& table = it->second;
  SequenceExport exported;
  exported.num_tokens = table.num_tokens;
  exported.page_bytes = page_bytes_;
  while (exported.first_held_page < static_cast<int64_t>(table.pages.size()) &&
         table.pages[exported.first_held_page] == kEvictedPage) {
    ++exported.first_held_page;
  }
  const absl::Span<const int32_t> held =
      absl::MakeConstSpan(table.pages).subspan(static_cast<size_t>(exported.first_held_page));
  // Page bytes verbatim, whatever the storage format keeps in them (scales included).
  exported.pages.resize(held.size() * static_cast<size_t>(page_bytes_));
  if (!held.empty()) {
    if (absl::Status s = read(held, exported.pages.data()); !s.ok()) return s;
  }
  return exported;
}

absl::Status KvSequenceTable::Import(const SequenceExport& exported, SequenceId into,
                                     const CommitFn& commit, const WritePagesFn& write) {
  auto target = sequences_.find(into);
  if (target == sequences_.end()) {
    return absl::NotFoundError(absl::StrCat("sequence ", into, " does not exist"));
  }
  if (target->second.num_tokens != 0 || !target->second.pages.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("sequence ", into, " holds ",
                                                      target->second.num_tokens,
                                                      " tokens; an import fills a new sequence"));
  }
  if (exported.page_bytes != page_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat("page_bytes = ", exported.page_bytes,
                                                   ", this layer's pages have ", page_bytes_));
  }
  const int64_t num_tokens = exported.num_tokens;
  const int64_t first_held_page = exported.first_held_page;
  const int64_t num_pages = PagesForTokens(std::max<int64_t>(num_tokens, 0), page_size_);
  if (static_cast<int64_t>(exported.pages.size()) != (num_pages - first_held_page) * page_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pages: ", exported.pages.size(), " bytes, expected ", num_pages - first_held_page,
        " held pages of ", page_bytes_, " bytes (", num_tokens, " tokens from page ",
        first_held_page, ")"));
  }
  if (num_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence_length = ", num_tokens, ", must be >= 0"));
  }
  // Evicting fewer pages than the rule allows is harmless (evicted below); more would lose keys
  // a later query still attends to.
  const int64_t dead_pages = std::min(num_pages, DeadPages(num_tokens));
  if (first_held_page < 0 || first_held_page > dead_pages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "first_held_page = ", first_held_page, ", must be in [0, ", dead_pages, "]: a sequence of ",
        num_tokens, " tokens in pages of ", page_size_, " tokens",
        sliding_window_ > 0 && causal_ ? absl::StrCat(" with a window of ", sliding_window_)
                                       : std::string(" without a sliding window"),
        " holds every page from index ", dead_pages, " on"));
  }
  const int64_t held = num_pages - first_held_page;
  const int64_t bytes = held * page_bytes_;
  // The reservation is charged already: the pages draw on it first.
  const int64_t drawn = std::min(ahead_.Held(into), bytes);
  const int64_t charged = bytes - drawn;
  if (budget_ != nullptr && charged > 0 && !budget_->TryCharge(charged)) {
    return KvBudgetExhaustedError(*budget_, charged, charged / page_bytes_, page_size_,
                                  "this import");
  }
  // Undoes the charge; the reservation was not drawn yet.
  const auto uncharge = [&] {
    if (budget_ != nullptr && charged > 0) budget_->Release(charged);
  };
  absl::StatusOr<std::vector<int32_t>> pages = allocator_.Allocate(held);
  if (!pages.ok()) {
    uncharge();
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache pool exhausted: this import needs ", held, " pages of ", page_size_,
                     " tokens (", bytes, " bytes), ", allocator_.free(), " of ",
                     allocator_.capacity(), " pages of this layer are free"));
  }
  if (absl::Status s = commit(*pages); !s.ok()) {
    allocator_.Free(*pages);
    uncharge();
    return s;
  }
  if (!pages->empty()) {
    if (absl::Status s = write(*pages, exported.pages.data()); !s.ok()) {
      allocator_.Free(*pages);
      uncharge();
      return s;
    }
  }
  ahead_.Draw(into, drawn);
  // The import is the reservation's one use: what it held beyond the pages goes back.
  if (const int64_t left = ahead_.Release(into); budget_ != nullptr && left > 0) {
    budget_->Release(left);
  }
  PageTable& table = target->second;
  table.num_tokens = num_tokens;
  table.pages.assign(static_cast<size_t>(first_held_page), kEvictedPage);
  table.pages.insert(table.pages.end(), pages->begin(), pages->end());
  EvictOutsideWindow(table);
  return absl::OkStatus();
}

void KvSequenceTable::ReturnNewPages(absl::Span<const int32_t> pages) {
  allocator_.Free(pages);
  if (budget_ != nullptr) budget_->Release(static_cast<int64_t>(pages.size()) * page_bytes_);
}

KvPoolUsage KvSequenceTable::Usage() const {
  return {page_size_, page_bytes_, allocator_.capacity(), allocator_.used()};
}

absl::Status KvSequenceTable::Reserve(absl::Span<const SequenceId> ids,
                                      absl::Span<const int64_t> counts, const CommitFn& commit,
                                      std::vector<BatchSequence>& batch) {
  batch.clear();
  absl::flat_hash_set<SequenceId> seen;
  int64_t pages_needed = 0;
  int64_t row = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    auto it = sequences_.find(ids[i]);
    if (it == sequences_.end()) {
      batch.clear();
      return absl::NotFoundError(absl::StrCat("sequence ", ids[i], " does not exist"));
    }
    if (!seen.insert(ids[i]).second) {
      batch.clear();
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", ids[i], " appears more than once in one batch"));
    }
    if (counts[i] < 1) {
      batch.clear();
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", ids[i], ": num_tokens = ", counts[i], ", must be >= 1"));
    }
    PageTable& table = it->second;
    const int64_t pages_before = static_cast<int64_t>(table.pages.size());
    const int64_t new_pages =
        PagesForTokens(table.num_tokens + counts[i], page_size_) - pages_before;
    pages_needed += new_pages;
    // Its reservation (ReserveAhead) is charged already: its new pages draw on that first.
    const int64_t ahead = ReservedAhead(ids[i]);
    batch.push_back({&table, row, counts[i], table.num_tokens, pages_before,
                     std::min(ahead, new_pages * page_bytes_), ids[i]});
    row += counts[i];
  }
  int64_t drawn = 0;
  for (const BatchSequence& seq : batch) drawn += seq.ahead_used;
  // The shared budget (all sessions on the device) is checked first: when both would refuse, its
  // numbers are the ones a client can act on.
  const int64_t bytes = pages_needed * page_bytes_;
  const int64_t charged = bytes - drawn;
  if (budget_ != nullptr && charged > 0 && !budget_->TryCharge(charged)) {
    batch.clear();
    return KvBudgetExhaustedError(*budget_, charged, charged / page_bytes_, page_size_,
                                  "this batch");
  }
  // Undoes the charge; the reservations were not drawn yet.
  const auto uncharge = [&] {
    if (budget_ != nullptr && charged > 0) budget_->Release(charged);
  };
  absl::StatusOr<std::vector<int32_t>> pages = allocator_.Allocate(pages_needed);
  if (!pages.ok()) {
    uncharge();
    batch.clear();
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache pool exhausted: this batch needs ", pages_needed, " more pages of ",
                     page_size_, " tokens (", bytes, " bytes), ", allocator_.free(), " of ",
                     allocator_.capacity(), " pages of this layer are free"));
  }
  if (absl::Status s = commit(*pages); !s.ok()) {
    allocator_.Free(*pages);
    uncharge();
    batch.clear();
    return s;
  }
  for (const BatchSequence& seq : batch) ahead_.Draw(seq.sequence, seq.ahead_used);
  auto next_page = pages->begin();
  for (BatchSequence& seq : batch) {
    seq.table->num_tokens += seq.num_new;
    while (static_cast<int64_t>(seq.table->pages.size()) <
           PagesForTokens(seq.table->num_tokens, page_size_)) {
      seq.table->pages.push_back(*next_page++);
    }
  }
  return absl::OkStatus();
}

void KvSequenceTable::Rollback(absl::Span<const BatchSequence> batch) {
  for (const BatchSequence& seq : batch) {
    PageTable& table = *seq.table;
    // The pages this call added are held by it alone (no fork ran in between): back to the
    // allocator, and their bytes to the budget, less what they drew on the sequence's
    // reservation, which goes back to the reservation still charged.
    std::vector<int32_t> added(table.pages.begin() + seq.pages_before, table.pages.end());
    allocator_.Free(added);
    const int64_t bytes = static_cast<int64_t>(added.size()) * page_bytes_;
    if (budget_ != nullptr && bytes > seq.ahead_used) budget_->Release(bytes - seq.ahead_used);
    ahead_.Restore(seq.sequence, seq.ahead_used);
    table.pages.resize(static_cast<size_t>(seq.pages_before));
    table.num_tokens = seq.first_index;
  }
}

int64_t KvSequenceTable::DeadPages(int64_t num_tokens) const {
  if (!causal_ || sliding_window_ <= 0) return 0;
  // The next query (index num_tokens) sees keys > num_tokens - W; page p is dead when its last
  // token (p + 1) * page_size - 1 is at most num_tokens - W.
  return std::max<int64_t>(0, (num_tokens - sliding_window_ + 1) / page_size_);
}

absl::StatusOr<int64_t> KvSequenceTable::HeldBytes(SequenceId sequence) const {
  auto it = sequences_.find(sequence);
  if (it == sequences_.end()) {
    return absl::NotFoundError(absl::StrCat("sequence ", sequence, " does not exist"));
  }
  int64_t held = 0;
  for (int32_t page : it->second.pages) held += page != kEvictedPage ? 1 : 0;
  return held * page_bytes_;
}

int64_t KvSequenceTable::HeldBytesAtLength(int64_t num_tokens) const {
  const int64_t pages = PagesForTokens(num_tokens, page_size_);
  return (pages - std::min(pages, DeadPages(num_tokens))) * page_bytes_;
}

void KvSequenceTable::EvictOutsideWindow(PageTable& table) {
  const int64_t dead_pages = DeadPages(table.num_tokens);
  for (int64_t p = 0; p < dead_pages && p < static_cast<int64_t>(table.pages.size()); ++p) {
    if (table.pages[p] == kEvictedPage) continue;
    FreePages({&table.pages[p], 1});
    table.pages[p] = kEvictedPage;
  }
}

}  // namespace attnserve
