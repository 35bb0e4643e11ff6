#include "kernels/cpu/cpu_layer.h"

#include <cmath>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace attnserve {

CpuLayer::CpuLayer(const LayerSpec& spec, const KvCacheConfig& kv_config,
                   const KvPageLayout& layout, ThreadPool* pool)
    : spec_(spec),
      kv_config_(kv_config),
      layout_(layout),
      pool_(pool),
      allocator_(kv_config.max_pages),
      store_(layout.page_elements * static_cast<int64_t>(DTypeSize(layout.dtype)),
             kv_config.max_pages) {}

SequenceId CpuLayer::CreateSequence() {
  absl::MutexLock lock(&mu_);
  const SequenceId id = next_id_++;
  sequences_.emplace(id, PageTable{});
  return id;
}

absl::Status CpuLayer::ReleaseSequence(SequenceId sequence) {
  absl::MutexLock lock(&mu_);
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
  return absl::OkStatus();
}

absl::StatusOr<int64_t> CpuLayer::SequenceLength(SequenceId sequence) const {
  absl::MutexLock lock(&mu_);
  auto it = sequences_.find(sequence);
  if (it == sequences_.end()) {
    return absl::NotFoundError(absl::StrCat("sequence ", sequence, " does not exist"));
  }
  return it->second.num_tokens;
}

void CpuLayer::FreePages(absl::Span<const int32_t> pages) {
  allocator_.Free(pages);
  if (kv_config_.budget != nullptr) {
    kv_config_.budget->Release(static_cast<int64_t>(pages.size()) * store_.page_bytes());
  }
}

CpuLayer::~CpuLayer() {
  // Sessions end by destroying their layer: give everything still held back to the shared budget.
  absl::MutexLock lock(&mu_);
  if (kv_config_.budget != nullptr) kv_config_.budget->Release(allocator_.used() * store_.page_bytes());
}

KvPoolUsage CpuLayer::PoolUsage() const {
  absl::MutexLock lock(&mu_);
  return {layout_.page_size, store_.page_bytes(), allocator_.capacity(), allocator_.used()};
}

absl::Status CpuLayer::CheckHidden(const Tensor& hidden, int64_t rows) const {
  if (hidden.rank() != 2 || hidden.dim(0) != rows || hidden.dim(1) != spec_.d_model) {
    return absl::InvalidArgumentError(absl::StrCat("hidden has shape ",
                                                   ShapeString(hidden.shape()), ", expected [",
                                                   rows, ", ", spec_.d_model, "]"));
  }
  if (hidden.num_bytes() != static_cast<size_t>(rows * spec_.d_model) * DTypeSize(hidden.dtype())) {
    return absl::InvalidArgumentError("hidden: byte count does not match its shape and dtype");
  }
  return absl::OkStatus();
}

absl::Status CpuLayer::Reserve(std::vector<BatchSequence>& batch,
                               absl::Span<const SequenceId> ids,
                               absl::Span<const int64_t> counts) {
  absl::flat_hash_set<SequenceId> seen;
  int64_t pages_needed = 0;
  int64_t row = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    auto it = sequences_.find(ids[i]);
    if (it == sequences_.end()) {
      return absl::NotFoundError(absl::StrCat("sequence ", ids[i], " does not exist"));
    }
    if (!seen.insert(ids[i]).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", ids[i], " appears more than once in one batch"));
    }
    if (counts[i] < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", ids[i], ": num_tokens = ", counts[i], ", must be >= 1"));
    }
    PageTable& table = it->second;
    pages_needed += PagesForTokens(table.num_tokens + counts[i], layout_.page_size) -
                    static_cast<int64_t>(table.pages.size());
    batch.push_back({&table, row, counts[i], table.num_tokens});
    row += counts[i];
  }
  // The shared budget (all sessions on the device) is checked first: when both would refuse, its
  // numbers are the ones a client can act on.
  const int64_t bytes = pages_needed * store_.page_bytes();
  const std::shared_ptr<KvMemoryBudget>& budget = kv_config_.budget;
  if (budget != nullptr && !budget->TryCharge(bytes)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "KV memory budget exhausted: this batch needs ", bytes, " bytes (", pages_needed,
        " pages of ", layout_.page_size, " tokens), ", budget->free_bytes(), " of ",
        budget->capacity_bytes(), " bytes are free"));
  }
  absl::StatusOr<std::vector<int32_t>> pages = allocator_.Allocate(pages_needed);
  if (!pages.ok()) {
    if (budget != nullptr) budget->Release(bytes);
    return absl::ResourceExhaustedError(absl::StrCat(
        "KV cache pool exhausted: this batch needs ", pages_needed, " more pages of ",
        layout_.page_size, " tokens (", bytes, " bytes), ", allocator_.free(), " of ",
        allocator_.capacity(), " pages of this layer are free"));
  }
  if (absl::Status s = store_.Commit(*pages); !s.ok()) {
    allocator_.Free(*pages);
    if (budget != nullptr) budget->Release(bytes);
    return s;
  }
  auto next_page = pages->begin();
  for (BatchSequence& seq : batch) {
    seq.table->num_tokens += seq.num_new;
    while (static_cast<int64_t>(seq.table->pages.size()) <
           PagesForTokens(seq.table->num_tokens, layout_.page_size)) {
      seq.table->pages.push_back(*next_page++);
    }
  }
  return absl::OkStatus();
}

void CpuLayer::EvictOutsideWindow(PageTable& table) {
  if (!spec_.causal || spec_.sliding_window <= 0) return;
  // The next query (index num_tokens) sees keys > num_tokens - W; page p is dead when its last
  // token (p + 1) * page_size - 1 is at most num_tokens - W.
  const int64_t dead_pages = (table.num_tokens - spec_.sliding_window + 1) / layout_.page_size;
  for (int64_t p = 0; p < dead_pages && p < static_cast<int64_t>(table.pages.size()); ++p) {
    if (table.pages[p] == kEvictedPage) continue;
    FreePages({&table.pages[p], 1});
    table.pages[p] = kEvictedPage;
  }
}

absl::StatusOr<Tensor> CpuLayer::Run(const Tensor& hidden, std::vector<BatchSequence> sequences,
                                     absl::Span<const int64_t> positions, bool decode) {
  const int64_t rows = hidden.dim(0);
  std::vector<int64_t> resolved(static_cast<size_t>(rows));
  for (const BatchSequence& seq : sequences) {
    for (int64_t i = 0; i < seq.num_new; ++i) {
      resolved[seq.first_row + i] =
          positions.empty() ? seq.first_index + i : positions[seq.first_row + i];
    }
  }
  const std::vector<float> x = hidden.ToFloats();
  Tensor out(DType::kF32, {rows, spec_.d_model});
  CpuBatch batch{x.data(), out.f32(), rows, resolved, std::move(sequences)};
  if (decode) {
    RunDecode(batch);
  } else {
    RunPrefill(batch);
  }
  for (const BatchSequence& seq : batch.sequences) EvictOutsideWindow(*seq.table);
  return out.CastTo(hidden.dtype());
}

namespace {
absl::Status CheckPositions(absl::Span<const int64_t> positions, int64_t rows) {
  if (positions.empty()) return absl::OkStatus();
  if (static_cast<int64_t>(positions.size()) != rows) {
    return absl::InvalidArgumentError(absl::StrCat("positions has ", positions.size(),
                                                   " entries, expected one per token (", rows,
                                                   ") or none"));
  }
  for (size_t i = 0; i < positions.size(); ++i) {
    if (positions[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("positions[", i, "] = ", positions[i], ", must be >= 0"));
    }
  }
  return absl::OkStatus();
}
}  // namespace

absl::StatusOr<Tensor> CpuLayer::Prefill(absl::Span<const PrefillChunk> chunks,
                                         const Tensor& hidden,
                                         absl::Span<const int64_t> positions) {
  if (chunks.empty()) return absl::InvalidArgumentError("prefill: no sequences given");
  std::vector<SequenceId> ids;
  std::vector<int64_t> counts;
  int64_t rows = 0;
  for (const PrefillChunk& chunk : chunks) {
    ids.push_back(chunk.sequence);
    counts.push_back(chunk.num_tokens);
    rows += chunk.num_tokens;
  }
  if (absl::Status s = CheckHidden(hidden, rows); !s.ok()) return s;
  if (absl::Status s = CheckPositions(positions, rows); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  std::vector<BatchSequence> batch;
  if (absl::Status s = Reserve(batch, ids, counts); !s.ok()) return s;
  return Run(hidden, std::move(batch), positions, /*decode=*/false);
}

absl::StatusOr<Tensor> CpuLayer::Decode(absl::Span<const SequenceId> sequences,
                                        const Tensor& hidden,
                                        absl::Span<const int64_t> positions) {
  if (sequences.empty()) return absl::InvalidArgumentError("decode: no sequences given");
  const int64_t rows = static_cast<int64_t>(sequences.size());
  if (absl::Status s = CheckHidden(hidden, rows); !s.ok()) return s;
  if (absl::Status s = CheckPositions(positions, rows); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  std::vector<BatchSequence> batch;
  const std::vector<int64_t> ones(sequences.size(), 1);
  if (absl::Status s = Reserve(batch, sequences, ones); !s.ok()) return s;
  return Run(hidden, std::move(batch), positions, /*decode=*/true);
}

void CpuLayer::StoreRow(const PageTable& table, int64_t index, int head, bool value,
                        const float* src, int64_t count) {
  const int slot = static_cast<int>(index % layout_.page_size);
  const int64_t element =
      value ? layout_.ValueElement(head, slot) : layout_.KeyElement(head, slot);
  std::byte* page = store_.page(table.PageOf(index, layout_.page_size));
  ConvertFromFloat(src, layout_.dtype, page + element * DTypeSize(layout_.dtype),
                   static_cast<size_t>(count));
}

}  // namespace attnserve
