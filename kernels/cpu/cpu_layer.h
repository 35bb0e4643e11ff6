// What every CPU layer shares: the sequence table, page reservation and window eviction, and
// dtype conversion (AttentionLayer::Prefill/Decode checked the inputs). Variants (GqaLayer, MlaLayer) supply only the compute, through
// RunPrefill/RunDecode, which are called after all checks passed and all pages were reserved, and
// so cannot fail: that is what makes Prefill and Decode all-or-nothing.
#ifndef ATTNSERVE_KERNELS_CPU_CPU_LAYER_H_
#define ATTNSERVE_KERNELS_CPU_CPU_LAYER_H_

#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "kernels/backend.h"
#include "kernels/cpu/host_page_store.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/kv/sequence_table.h"

namespace attnserve {

// BatchSequence (one sequence's share of a batch) comes from kernels/kv/sequence_table.h.

// Inputs and outputs of one compute call, all float32 and dense.
struct CpuBatch {
  const float* hidden = nullptr;  // [rows, d_model]
  float* out = nullptr;           // [rows, d_model]
  int64_t rows = 0;
  absl::Span<const int64_t> positions;  // [rows] RoPE positions.
  std::vector<BatchSequence> sequences;
};

class CpuLayer : public AttentionLayer {
 public:
  CpuLayer(const LayerSpec& spec, const KvCacheConfig& kv_config, const KvPageLayout& layout,
           ThreadPool* pool);
  ~CpuLayer() override;

  const LayerSpec& spec() const final { return spec_; }
  const KvCacheConfig& kv_config() const final { return kv_config_; }
  SequenceId CreateSequence() final;
  absl::Status ReleaseSequence(SequenceId sequence) final;
  absl::StatusOr<int64_t> SequenceLength(SequenceId sequence) const final;
  absl::StatusOr<std::vector<SequenceId>> ForkSequence(SequenceId source, int count) final;
  absl::StatusOr<SequenceExport> ExportSequence(SequenceId sequence) const final;
  absl::Status ImportSequenceInto(const SequenceExport& exported, SequenceId into) final;
  KvPoolUsage PoolUsage() const final;
  absl::StatusOr<int64_t> SequenceKvBytes(SequenceId sequence) const final;
  int64_t KvBytesAtLength(int64_t num_tokens) const final;
  // Every parameter of the spec, converted once to fp32 at creation (a layer keeping some in
  // another dtype overrides this).
  int64_t ParameterBytes() const override;

 protected:
  absl::StatusOr<Tensor> PrefillChecked(absl::Span<const PrefillChunk> chunks,
                                        const Tensor& hidden,
                                        absl::Span<const int64_t> positions) final;
  absl::StatusOr<Tensor> DecodeChecked(absl::Span<const SequenceId> sequences,
                                       const Tensor& hidden,
                                       absl::Span<const int64_t> positions) final;
  absl::Status ReserveKvFor(absl::Span<const SequenceId> sequences,
                            absl::Span<const int64_t> num_tokens, absl::string_view what) final;

  // Prefill: each sequence gets `num_new` rows (>= 1). Decode: exactly one row per sequence.
  virtual void RunPrefill(const CpuBatch& batch) = 0;
  virtual void RunDecode(const CpuBatch& batch) = 0;

  const KvPageLayout& layout() const { return layout_; }
  const HostPageStore& store() const { return store_; }
  ThreadPool& pool() const { return *pool_; }

  // Writes `count` floats to slot (token `index`, KV head `head`) of a sequence's pages in the
  // page's storage format (kernels/cpu/host_page_store.h). `value` false writes the key row, true the
  // value row. A page's rows are written in slot order (8-bit pages rescale as they fill).
  void StoreRow(const PageTable& table, int64_t index, int head, bool value, const float* src,
                int64_t count);
  // Writes the key and value rows of every new token of the batch: KV head h of batch row r is
  // keys + r * row_stride + h * dim (values alike). Spread over the pool, one task per (sequence,
  // KV head, run of whole pages), each writing its pages' rows in slot order. `values` null: key
  // rows only (MLA caches its latent as the key row).
  void StoreKvRows(const CpuBatch& batch, int num_kv_heads, int dim, const float* keys,
                   const float* values, int64_t row_stride);
  // Runs fn(begin, end) over rows [0, rows) of per-row work that rows do not share (norms, RoPE,
  // reads of cached rows): in runs of kRowsPerRun over the pool for a prefill's rows, on the
  // calling thread alone below kMinParallelRows (a decode step is not worth waking the pool; a
  // FunctionRef, so the step builds no std::function and allocates nothing).
  // On the calling thread alone these loops were ~1.5% of a 2048-token MHA prefill's CPU time
  // and ~5% of an MLA one's, with the pool's other threads waiting.
  static constexpr int64_t kRowsPerRun = 64;
  static constexpr int64_t kMinParallelRows = 256;
  void ForRowRuns(int64_t rows, absl::FunctionRef<void(int64_t, int64_t)> fn) const;

 private:
  // Checks ids and reserves pages for each sequence's new tokens (all or nothing), advancing
  // num_tokens; on error nothing changed.
  absl::Status Reserve(std::vector<BatchSequence>& sequences, absl::Span<const SequenceId> ids,
                       absl::Span<const int64_t> counts) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Tensor> Run(const Tensor& hidden, std::vector<BatchSequence> sequences,
                             absl::Span<const int64_t> positions, bool decode)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const LayerSpec spec_;
  const KvCacheConfig kv_config_;
  const KvPageLayout layout_;
  ThreadPool* const pool_;

  mutable absl::Mutex mu_;  // Serialises calls: one batch at a time per layer.
  HostPageStore store_;
  // Sequences, reservation and eviction, shared with the CUDA backend.
  KvSequenceTable sequences_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_CPU_CPU_LAYER_H_
