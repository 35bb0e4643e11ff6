// An MHA/MQA/GQA layer on the GPU. Per call: validate and reserve pages (KvSequenceTable, shared
// with the CPU backend), plan the batch on the host (page table, work items, split-KV plan) into
// one pinned buffer, upload it with one copy, then run on the layer's stream:
//   qkv = x . [Wq; Wk; Wv]^T (+ bias)      cuBLAS (Projection: sgemm, or GemmEx for 16-bit)
//   q/k norm, RoPE(q, k); k, v -> pages    RopeAppendKernel
//   attention                              prefill: MmaPrefillKernel (f16/bf16 pages, tensor
//                                          cores) or PrefillKernel (f32 pages); decode:
//                                          PagedDecodeKernel + combine
//   out = attn . Wo^T (+ bias)             cuBLAS (Projection)
// and copy the output back. The activation dtype (projections) is chosen from the KV storage
// format once, at creation: f32 pages compute in fp32; f16/bf16 pages run the projections and the
// prefill attention on tensor cores with 16-bit inputs and fp32 accumulation (decode reads the
// pages and accumulates in fp32). A failure after
// the reservation rolls it back, so calls stay all-or-nothing as on the CPU.
#ifndef ATTNSERVE_KERNELS_CUDA_LAYER_CUDA_LAYER_H_
#define ATTNSERVE_KERNELS_CUDA_LAYER_CUDA_LAYER_H_

#include <cuda_runtime_api.h>

#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "kernels/backend.h"
#include "kernels/cuda/attention/batch_plan.h"
#include "kernels/cuda/runtime/cublas_api.h"
#include "kernels/cuda/runtime/cuda_backend.h"
#include "kernels/cuda/runtime/device_memory.h"
#include "kernels/cuda/layer/device_sequences.h"
#include "kernels/cuda/layer/flashinfer_attention.h"
#include "kernels/cuda/layer/projection.h"
#include "kernels/cuda/layer/stage_timer.h"
#include "kernels/kv/sequence_table.h"

namespace attnserve::cuda {

struct CudaContext {
  int device = 0;
  int multiprocessors = 0;
  const CublasApi* cublas = nullptr;
  std::shared_ptr<DeviceSlabPool> pool;
  // FlashInfer for 16-bit pages where it has an instance; f32 pages always run the native kernels.
  CudaAttentionImpl attention = CudaAttentionImpl::kNative;
};

class CudaGqaLayer : public AttentionLayer {
 public:
  // Spec, weights and config must be validated (the backend does); uploads the weights.
  static absl::StatusOr<std::unique_ptr<AttentionLayer>> Create(const LayerSpec& spec,
                                                                const LayerWeights& weights,
                                                                const KvCacheConfig& kv_config,
                                                                const CudaContext& context);
  ~CudaGqaLayer() override;

  const LayerSpec& spec() const override { return spec_; }
  const KvCacheConfig& kv_config() const override { return kv_config_; }
  SequenceId CreateSequence() override;
  absl::Status ReleaseSequence(SequenceId sequence) override;
  absl::StatusOr<int64_t> SequenceLength(SequenceId sequence) const override;
  // Full pages shared by reference count (KvSequenceTable::Fork); the partly filled last page
  // copied device to device for each fork.
  absl::StatusOr<std::vector<SequenceId>> ForkSequence(SequenceId source, int count) override;
  // The held pages, device to host, in the CPU backend's byte format (the pages verbatim, one
  // page layout for both backends: kernels/kv/page_layout.h), so a sequence moves between CPU and
  // CUDA layers of the same spec, storage format and page size.
  absl::StatusOr<SequenceExport> ExportSequence(SequenceId sequence) const override;
  // The exported pages, host to device, into new pages; checks as CpuLayer::ImportSequence.
  absl::StatusOr<SequenceId> ImportSequence(const SequenceExport& exported) override;
  absl::StatusOr<Tensor> Prefill(absl::Span<const PrefillChunk> chunks, const Tensor& hidden,
                                 absl::Span<const int64_t> positions) override;
  absl::StatusOr<Tensor> Decode(absl::Span<const SequenceId> sequences, const Tensor& hidden,
                                absl::Span<const int64_t> positions) override;
  KvPoolUsage PoolUsage() const override;
  absl::StatusOr<int64_t> SequenceKvBytes(SequenceId sequence) const override;
  int64_t KvBytesAtLength(int64_t num_tokens) const override;
  // The projections' device weights (16-bit for f16/bf16 layers, biases fp32), q/k norm scales
  // and sinks (fp32).
  int64_t ParameterBytes() const override;

 private:
  CudaGqaLayer(const LayerSpec& spec, const KvCacheConfig& kv_config, const CudaContext& context,
               int64_t page_bytes);
  absl::Status Init(const LayerWeights& weights);
  absl::StatusOr<Tensor> Run(const Tensor& hidden, absl::Span<const SequenceId> ids,
                             absl::Span<const int64_t> counts, absl::Span<const int64_t> positions,
                             bool decode);
  // Plans and runs one reserved batch; on error the caller rolls the reservation back. In three
  // steps: the host plan (PlanBatch, attention/batch_plan.h), staging it with the input in pinned
  // memory, and the launch sequence on the layer's stream.
  absl::StatusOr<Tensor> Compute(const Tensor& hidden, const std::vector<BatchSequence>& batch,
                                 absl::Span<const int64_t> positions, bool decode)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  struct CallLayout;  // Where one call's buffers sit in the workspace and the staging buffer.
  BatchPlanShape PlanShape() const;
  // `fi`: the FlashInfer side of the call when FlashInfer computes the attention.
  using FlashInferCall = std::optional<FlashInferAttention::CallPlan>;
  // `wire`: the caller's dtype, in which the input is uploaded (converted to the activation dtype
  // on the device) and the output converted on the device and downloaded.
  CallLayout LayOut(const BatchPlan& plan, const FlashInferCall& fi, int64_t rows, bool decode,
                    DType wire) const;
  // Sizes the workspace and staging buffers and writes the input and the plan into staging.
  absl::Status Stage(const Tensor& hidden, const BatchPlan& plan, const FlashInferCall& fi,
                     const CallLayout& layout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Upload, qkv projection, RoPE + KV append, attention, output projection, download and
  // synchronise; returns the output [rows, d_model] in the wire dtype.
  absl::StatusOr<Tensor> Launch(const BatchPlan& plan, const FlashInferCall& fi,
                                const CallLayout& layout, int64_t rows, bool decode)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The attention step alone: the native kernels, or FlashInfer's when `fi` is set.
  absl::Status RunAttention(const BatchPlan& plan, const FlashInferCall& fi, const CallLayout& l,
                            int64_t rows, bool decode) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

 public:
  // Per-stage times of each call from now on (attnserve_cuda_bench); last_call_stages() reads
  // the last call's.
  void EnableStageTiming(bool on);
  LayerCallStages last_call_stages() const;

 private:
  // The native kernels' view of the pages, with this call's page table.
  PagedKv PagedView(const CallLayout& layout) const;

  const LayerSpec spec_;
  const KvCacheConfig kv_config_;
  const CudaContext context_;
  const int q_width_;    // num_heads * head_dim
  const int kv_width_;   // num_kv_heads * head_dim
  const int qkv_width_;  // q_width_ + 2 * kv_width_
  // The projections' dtype (weights, inputs): f32, or the 16-bit page type. Not the page format
  // itself, which kernels read from kv_config_.storage.
  const DType activation_;

  mutable absl::Mutex mu_;  // One call at a time per layer.
  // Sequences, device pages, and Fork/Export/Import's page copies: shared with CudaMlaLayer.
  DeviceSequences pages_ ABSL_GUARDED_BY(mu_);
  // Names the call path uses for the table and the page store inside pages_.
  KvSequenceTable& sequences_ = pages_.table();
  const DevicePageStore& store_ = pages_.store();
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  Projection qkv_proj_;  // [Wq; Wk; Wv] stacked: q, k and v side by side in each row.
  Projection o_proj_;
  // Set when FlashInfer computes this layer's attention (--cuda_attention=flashinfer and
  // FlashInferAttention::Serves); else the native kernels do.
  std::optional<FlashInferAttention> flashinfer_;
  DeviceBuffer inv_freq_;   // RoPE frequencies (fp64).
  DeviceBuffer qk_norm_scale_;  // [2, head_dim] q then k RMSNorm scale; empty without q/k norm.
  DeviceBuffer sinks_;          // [num_heads] attention sinks; empty without them.
  DeviceBuffer workspace_;  // Upload region, activations and split-KV partials of one call.
  PinnedBuffer staging_;    // Host side of the upload and of the output.
  StageTimer timer_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_LAYER_CUDA_LAYER_H_
