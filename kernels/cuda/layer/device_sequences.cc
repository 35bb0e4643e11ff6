#include "kernels/cuda/layer/device_sequences.h"

#include <utility>

#include "kernels/cuda/runtime/cuda_status.h"

namespace attnserve::cuda {

DeviceSequences::DeviceSequences(const KvCacheConfig& kv_config, int64_t page_bytes, bool causal,
                                 int sliding_window, std::shared_ptr<DeviceSlabPool> pool)
    : pool_(pool),
      table_(kv_config.page_size, page_bytes, kv_config.max_pages, kv_config.budget, causal,
             sliding_window),
      store_(std::move(pool), page_bytes) {}

absl::Status DeviceSequences::CommitPages(absl::Span<const int32_t> pages) {
  if (absl::Status s = store_.Commit(pages); !s.ok()) return s;
  if (!pool_->poison()) return absl::OkStatus();
  for (int32_t page : pages) {
    ATTNSERVE_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(static_cast<char*>(store_.pool_base()) + store_.PageOffset(page), 0xFF,
                        static_cast<size_t>(store_.page_bytes()), stream_),
        "poisoning new KV pages");
  }
  return absl::OkStatus();
}

absl::Status DeviceSequences::Reserve(absl::Span<const SequenceId> ids,
                                      absl::Span<const int64_t> counts,
                                      std::vector<BatchSequence>& batch) {
  return table_.Reserve(
      ids, counts, [this](absl::Span<const int32_t> pages) { return CommitPages(pages); }, batch);
}

absl::StatusOr<std::vector<SequenceId>> DeviceSequences::Fork(SequenceId source, int count) {
  return table_.Fork(
      source, count, [this](absl::Span<const int32_t> pages) { return CommitPages(pages); },
      [this](int32_t from, absl::Span<const int32_t> to) {
        return AwaitPageCopies(store_.CopyPage(from, to, stream_), "forking the last KV page");
      });
}

absl::StatusOr<SequenceExport> DeviceSequences::Export(SequenceId sequence) const {
  return table_.Export(sequence, [this](absl::Span<const int32_t> pages, char* out) {
    return AwaitPageCopies(store_.Download(pages, out, stream_), "exporting KV pages");
  });
}

absl::Status DeviceSequences::Import(const SequenceExport& exported, SequenceId into) {
  return table_.Import(
      exported, into, [this](absl::Span<const int32_t> pages) { return CommitPages(pages); },
      [this](absl::Span<const int32_t> pages, const char* src) {
        return AwaitPageCopies(store_.Upload(pages, src, stream_), "importing KV pages");
      });
}

absl::Status DeviceSequences::AwaitPageCopies(absl::Status queued, absl::string_view what) const {
  // Always wait, even after a refused copy: one still in flight would write into an export's host
  // buffer after it is gone, or into pages the failed call gives back.
  const absl::Status done = CudaStatus(cudaStreamSynchronize(stream_), what);
  return queued.ok() ? done : queued;
}

}  // namespace attnserve::cuda
