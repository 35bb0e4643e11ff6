// A CUDA layer's sequences and the device pages behind them: the CPU backend's KvSequenceTable
// (reservation, rollback, eviction, forks, export and import) over a DevicePageStore, with the
// page copies a fork, an export or an import needs queued on the layer's stream and waited for
// before the table changes. Every CUDA layer kind (CudaGqaLayer, CudaMlaLayer) holds one, so they
// share one implementation of ForkSequence / ExportSequence / ImportSequence and one page byte format with
// the CPU backend (kernels/kv/page_layout.h).
//
// Not thread-safe: the owning layer holds its mutex around every call, as around the table.
#ifndef ATTNSERVE_KERNELS_CUDA_LAYER_DEVICE_SEQUENCES_H_
#define ATTNSERVE_KERNELS_CUDA_LAYER_DEVICE_SEQUENCES_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/backend.h"
#include "kernels/cuda/runtime/device_memory.h"
#include "kernels/kv/cache_config.h"
#include "kernels/kv/sequence_table.h"

namespace attnserve::cuda {

class DeviceSequences {
 public:
  // page_bytes <= pool->slab_bytes() (the layer checks at creation). causal/sliding_window as in
  // LayerSpec (the eviction rule).
  DeviceSequences(const KvCacheConfig& kv_config, int64_t page_bytes, bool causal,
                  int sliding_window, std::shared_ptr<DeviceSlabPool> pool);

  // The stream page copies and poisoning are queued on (the layer's; set once it exists).
  void set_stream(cudaStream_t stream) { stream_ = stream; }

  KvSequenceTable& table() { return table_; }
  const KvSequenceTable& table() const { return table_; }
  const DevicePageStore& store() const { return store_; }

  // Backs new page ids with slabs (the table's commit hook); with the pool's poison_for_testing,
  // fills them with NaN bytes so a slot read before it is written fails the tests.
  absl::Status CommitPages(absl::Span<const int32_t> pages);
  // Reserve through CommitPages (KvSequenceTable::Reserve).
  absl::Status Reserve(absl::Span<const SequenceId> ids, absl::Span<const int64_t> counts,
                       std::vector<BatchSequence>& batch);

  // AttentionLayer::ForkSequence: full pages shared by reference count, the partly filled last
  // page copied device to device for each fork.
  absl::StatusOr<std::vector<SequenceId>> Fork(SequenceId source, int count);
  // AttentionLayer::ExportSequence: the held pages, device to host, verbatim.
  absl::StatusOr<SequenceExport> Export(SequenceId sequence) const;
  // AttentionLayer::ImportSequenceInto: the exported pages, host to device, into new pages of
  // `into`.
  absl::Status Import(const SequenceExport& exported, SequenceId into);

 private:
  // Waits for the copies `queued` (their launch status) put on the stream, so every copy's error
  // is reported before the table changes; the first error wins.
  absl::Status AwaitPageCopies(absl::Status queued, absl::string_view what) const;

  std::shared_ptr<DeviceSlabPool> pool_;
  KvSequenceTable table_;
  DevicePageStore store_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_LAYER_DEVICE_SEQUENCES_H_
