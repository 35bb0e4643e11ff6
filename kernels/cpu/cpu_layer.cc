#include "kernels/cpu/cpu_layer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/host_page_store.h"
#include "kernels/kv/quantization.h"

namespace attnserve {

CpuLayer::CpuLayer(const LayerSpec& spec, const KvCacheConfig& kv_config,
                   const KvPageLayout& layout, ThreadPool* pool)
    : spec_(spec),
      kv_config_(kv_config),
      layout_(layout),
      pool_(pool),
      store_(KvPageBytes(spec, kv_config.storage, layout.page_size)),  // 8-bit: scales included.
      sequences_(layout.page_size, store_.page_bytes(), kv_config.max_pages, kv_config.budget,
                 spec.causal, spec.sliding_window) {}

CpuLayer::~CpuLayer() = default;

SequenceId CpuLayer::CreateSequence() {
  absl::MutexLock lock(&mu_);
  return sequences_.Create();
}

absl::Status CpuLayer::ReleaseSequence(SequenceId sequence) {
  absl::MutexLock lock(&mu_);
  return sequences_.Release(sequence);
}

absl::StatusOr<int64_t> CpuLayer::SequenceLength(SequenceId sequence) const {
  absl::MutexLock lock(&mu_);
  return sequences_.Length(sequence);
}

absl::StatusOr<std::vector<SequenceId>> CpuLayer::ForkSequence(SequenceId source, int count) {
  absl::MutexLock lock(&mu_);
  return sequences_.Fork(
      source, count, [this](absl::Span<const int32_t> pages) { return store_.Commit(pages); },
      [this](int32_t from, absl::Span<const int32_t> to) {
        for (int32_t page : to) {
          std::memcpy(store_.page(page), store_.page(from),
                      static_cast<size_t>(store_.page_bytes()));
        }
        return absl::OkStatus();
      });
}

absl::StatusOr<SequenceExport> CpuLayer::ExportSequence(SequenceId sequence) const {
  absl::MutexLock lock(&mu_);
  const size_t page_bytes = static_cast<size_t>(store_.page_bytes());
  return sequences_.Export(sequence, [this, page_bytes](absl::Span<const int32_t> pages,
                                                        char* out) {
    for (size_t i = 0; i < pages.size(); ++i) {
      std::memcpy(out + i * page_bytes, store_.page(pages[i]), page_bytes);
    }
    return absl::OkStatus();
  });
}

absl::Status CpuLayer::ImportSequenceInto(const SequenceExport& exported, SequenceId into) {
  absl::MutexLock lock(&mu_);
  const size_t page_bytes = static_cast<size_t>(store_.page_bytes());
  return sequences_.Import(
      exported, into, [this](absl::Span<const int32_t> pages) { return store_.Commit(pages); },
      [this, page_bytes](absl::Span<const int32_t> pages, const char* src) {
        for (size_t i = 0; i < pages.size(); ++i) {
          std::memcpy(store_.page(pages[i]), src + i * page_bytes, page_bytes);
        }
        return absl::OkStatus();
      });
}

KvPoolUsage CpuLayer::PoolUsage() const {
  absl::MutexLock lock(&mu_);
  return sequences_.Usage();
}

absl::StatusOr<int64_t> CpuLayer::SequenceKvBytes(SequenceId sequence) const {
  absl::MutexLock lock(&mu_);
  return sequences_.HeldBytes(sequence);
}

int64_t CpuLayer::KvBytesAtLength(int64_t num_tokens) const {
  absl::MutexLock lock(&mu_);
  return sequences_.HeldBytesAtLength(num_tokens);
}

absl::Status CpuLayer::ReserveKvFor(absl::Span<const SequenceId> sequences,
                                    absl::Span<const int64_t> num_tokens, absl::string_view what) {
  absl::MutexLock lock(&mu_);
  return sequences_.ReserveAhead(sequences, num_tokens, what);
}

int64_t CpuLayer::ParameterBytes() const {
  return ParameterCount(spec_) * static_cast<int64_t>(sizeof(float));
}

absl::Status CpuLayer::Reserve(std::vector<BatchSequence>& batch, absl::Span<const SequenceId> ids,
                               absl::Span<const int64_t> counts) {
  return sequences_.Reserve(
      ids, counts, [this](absl::Span<const int32_t> pages) { return store_.Commit(pages); }, batch);
}

absl::StatusOr<Tensor> CpuLayer::Run(const Tensor& hidden, std::vector<BatchSequence> sequences,
                                     absl::Span<const int64_t> positions, bool decode) {
  const int64_t rows = hidden.dim(0);
  // Positions given (the server always gives one per row, resolved once by Session::Plan) are
  // used as they are; only a caller that gave none gets them resolved here.
  std::vector<int64_t> resolved;
  if (positions.empty()) resolved = ResolvePositions(sequences, positions, rows);
  const absl::Span<const int64_t> row_positions =
      positions.empty() ? absl::MakeConstSpan(resolved) : positions;
  // An f32 input is read in place and the f32 output returned as it is: at 2048 prefill tokens
  // each copy is megabytes of fresh pages, paid on the calling thread while the pool waits.
  std::vector<float> widened;
  if (hidden.dtype() != DType::kF32) widened = hidden.ToFloats();
  const float* x = hidden.dtype() == DType::kF32 ? hidden.f32() : widened.data();
  Tensor out(DType::kF32, {rows, spec_.d_model});
  CpuBatch batch{x, out.f32(), rows, row_positions, std::move(sequences)};
  if (decode) {
    RunDecode(batch);
  } else {
    RunPrefill(batch);
  }
  // Checked in the caller's dtype: an f32 output may still overflow f16.
  Tensor result = hidden.dtype() == DType::kF32 ? std::move(out) : out.CastTo(hidden.dtype());
  if (absl::Status s = CheckOutputFinite(result); !s.ok()) {
    sequences_.Rollback(batch.sequences);  // Before any eviction: the pages are all still held.
    return s;
  }
  for (const BatchSequence& seq : batch.sequences) sequences_.EvictOutsideWindow(*seq.table);
  return result;
}

absl::StatusOr<Tensor> CpuLayer::PrefillChecked(absl::Span<const PrefillChunk> chunks,
                                                const Tensor& hidden,
                                                absl::Span<const int64_t> positions) {
  const ChunkSequences split = SplitChunks(chunks);
  absl::MutexLock lock(&mu_);
  std::vector<BatchSequence> batch;
  if (absl::Status s = Reserve(batch, split.ids, split.counts); !s.ok()) return s;
  return Run(hidden, std::move(batch), positions, /*decode=*/false);
}

absl::StatusOr<Tensor> CpuLayer::DecodeChecked(absl::Span<const SequenceId> sequences,
                                               const Tensor& hidden,
                                               absl::Span<const int64_t> positions) {
  absl::MutexLock lock(&mu_);
  std::vector<BatchSequence> batch;
  const std::vector<int64_t> ones(sequences.size(), 1);
  if (absl::Status s = Reserve(batch, sequences, ones); !s.ok()) return s;
  return Run(hidden, std::move(batch), positions, /*decode=*/true);
}

void CpuLayer::StoreRow(const PageTable& table, int64_t index, int head, bool value,
                        const float* src, int64_t count) {
  const int slot = static_cast<int>(index % layout_.page_size);
  WritePageRow(layout_, store_.page(table.PageOf(index, layout_.page_size)), head, value, slot, src,
               count);
}

void CpuLayer::ForRowRuns(int64_t rows, absl::FunctionRef<void(int64_t, int64_t)> fn) const {
  if (rows < kMinParallelRows || pool_->num_threads() == 1) {
    if (rows > 0) fn(0, rows);
    return;
  }
  pool_->ParallelFor((rows + kRowsPerRun - 1) / kRowsPerRun, [&](int64_t i) {
    fn(i * kRowsPerRun, std::min(rows, (i + 1) * kRowsPerRun));
  });
}

void CpuLayer::StoreKvRows(const CpuBatch& batch, int num_kv_heads, int dim, const float* keys,
                           const float* values, int64_t row_stride) {
  // Runs of whole pages, about 256 tokens each: a task owns its pages' rows (and an 8-bit page's
  // scales) of one KV head, so tasks never touch the same bytes. On the calling thread alone this
  // loop was about 2% of a 2048-token MHA prefill while the pool's other threads waited.
  const int64_t page_size = layout_.page_size;
  const int64_t run = std::max<int64_t>(1, 256 / page_size) * page_size;
  struct Task {
    const BatchSequence* seq;
    int head;
    int64_t begin;  // Sequence indices [begin, end) of new tokens.
    int64_t end;
  };
  std::vector<Task> tasks;
  for (const BatchSequence& seq : batch.sequences) {
    const int64_t end = seq.first_index + seq.num_new;
    for (int h = 0; h < num_kv_heads; ++h) {
      for (int64_t begin = seq.first_index; begin < end;) {
        const int64_t next = std::min(end, (begin / run + 1) * run);  // Run boundaries are pages'.
        tasks.push_back({&seq, h, begin, next});
        begin = next;
      }
    }
  }
  auto store = [&](const Task& t) {
    for (int64_t index = t.begin; index < t.end; ++index) {
      const int64_t offset = (t.seq->first_row + index - t.seq->first_index) * row_stride +
                             int64_t{t.head} * dim;
      StoreRow(*t.seq->table, index, t.head, /*value=*/false, keys + offset, dim);
      if (values != nullptr) {
        StoreRow(*t.seq->table, index, t.head, /*value=*/true, values + offset, dim);
      }
    }
  };
  // A decode step's few rows (under 512 row-heads, 256 KiB of f32 rows at head dim 64): not
  // worth waking the pool.
  if (batch.rows * num_kv_heads < 512) {
    for (const Task& t : tasks) store(t);
    return;
  }
  pool_->ParallelFor(static_cast<int64_t>(tasks.size()), [&](int64_t i) { store(tasks[i]); });
}

}  // namespace attnserve
