// What every CUDA layer kind (CudaGqaLayer, CudaMlaLayer) shares, so that the two differ only in
// their math (issue 18): the call shell (input checks, one call at a time, cudaSetDevice, the
// reservation and its rollback on any error, eviction outside a sliding window), the sequences over
// device pages with Fork/Export/Import (DeviceSequences), the stream and cuBLAS handle, the
// reusable workspace and pinned staging buffers, the per-stage timer, a call's host tail (the plan,
// the kind's layout, staging, the kind's launch: Compute, behind LayOutCall and Launch), and the
// two ends of a call's device work: one upload with the input converted to the activation dtype
// on the device, and the finiteness check, the conversion to the caller's dtype and one download.
#ifndef ATTNSERVE_KERNELS_CUDA_LAYER_CUDA_LAYER_BASE_H_
#define ATTNSERVE_KERNELS_CUDA_LAYER_CUDA_LAYER_BASE_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "kernels/backend.h"
#include "kernels/cuda/attention/batch_plan.h"
#include "kernels/cuda/layer/call_layout.h"
#include "kernels/cuda/layer/device_sequences.h"
#include "kernels/cuda/layer/stage_timer.h"
#include "kernels/cuda/runtime/cublas_api.h"
#include "kernels/cuda/runtime/cuda_backend.h"
#include "kernels/cuda/runtime/device_memory.h"
#include "kernels/spec/attention_variation.h"

namespace attnserve::cuda {

struct CudaContext {
  int device = 0;
  int multiprocessors = 0;
  const CublasApi* cublas = nullptr;
  std::shared_ptr<DeviceSlabPool> pool;
  // FlashInfer for 16-bit pages where it has an instance; f32 pages always run the native kernels.
  CudaAttentionImpl attention = CudaAttentionImpl::kNative;
};

class CudaLayerBase : public AttentionLayer {
 public:
  ~CudaLayerBase() override;

  const LayerSpec& spec() const final { return spec_; }
  const KvCacheConfig& kv_config() const final { return kv_config_; }
  SequenceId CreateSequence() final;
  absl::Status ReleaseSequence(SequenceId sequence) final;
  absl::StatusOr<int64_t> SequenceLength(SequenceId sequence) const final;
  // Full pages shared by reference count (KvSequenceTable::Fork); the partly filled last page
  // copied device to device for each fork.
  absl::StatusOr<std::vector<SequenceId>> ForkSequence(SequenceId source, int count) final;
  // The held pages, device to host, in the CPU backend's byte format (the pages verbatim, one page
  // layout for both backends: kernels/kv/page_layout.h), so a sequence moves between CPU and CUDA
  // layers of the same spec, storage format and page size.
  absl::StatusOr<SequenceExport> ExportSequence(SequenceId sequence) const final;
  // The exported pages, host to device, into new pages; checks as CpuLayer::ImportSequenceInto.
  absl::Status ImportSequenceInto(const SequenceExport& exported, SequenceId into) final;
  KvPoolUsage PoolUsage() const final;
  absl::StatusOr<int64_t> SequenceKvBytes(SequenceId sequence) const final;
  int64_t KvBytesAtLength(int64_t num_tokens) const final;

  // Per-stage times of each call from now on (attnserve_cuda_bench); last_call_stages() reads the
  // last call's.
  void EnableStageTiming(bool on);
  LayerCallStages last_call_stages() const;

 protected:
  // AttentionLayer::Prefill / Decode after their input checks (kernels/backend.cc): one Run each.
  absl::StatusOr<Tensor> PrefillChecked(absl::Span<const PrefillChunk> chunks,
                                        const Tensor& hidden,
                                        absl::Span<const int64_t> positions) final;
  absl::StatusOr<Tensor> DecodeChecked(absl::Span<const SequenceId> sequences,
                                       const Tensor& hidden,
                                       absl::Span<const int64_t> positions) final;
  absl::Status ReserveKvFor(absl::Span<const SequenceId> sequences,
                            absl::Span<const int64_t> num_tokens, absl::string_view what) final;

  // One page's bytes for `spec` (8-bit pages with their scales); INVALID_ARGUMENT when a page does
  // not fit the pool's slab.
  static absl::StatusOr<int64_t> PageBytes(const LayerSpec& spec, const KvCacheConfig& kv_config,
                                           const CudaContext& context);
  CudaLayerBase(const LayerSpec& spec, const KvCacheConfig& kv_config, const CudaContext& context,
                int64_t page_bytes);
  // Selects the device, creates the layer's stream and cuBLAS handle (plain fp32 math, no TF32: the
  // projections must match the CPU engine to fp32 rounding). First in a layer's Init.
  absl::Status InitDevice();

  // Where one call's buffers sit in the workspace and the staging buffer: the upload region and
  // the output, which the shell stages and downloads. Each layer kind's layout extends it with its
  // own sections and, when FlashInfer computes the attention, FlashInfer's plan of the call.
  struct LayerCall {
    virtual ~LayerCall() = default;
    UploadSections up;
    OutputSections o;
    size_t device_bytes = 0;
    // FlashInfer's plan words, uploaded with the plan (they point into the kind's own layout,
    // which owns them); empty for the native kernels.
    absl::Span<const int32_t> flashinfer_words;
  };

  // The two steps each layer kind supplies to Compute, between the shared host plan and staging:
  // lay this call's buffers out for `plan` (with FlashInfer's plan, when it computes the
  // attention), then launch the call's device work on the layer's stream (upload, projections,
  // attention, download and synchronise), returning the output [rows, d_model] in `wire` dtype.
  // `call` is what LayOutCall returned for `plan`.
  virtual absl::StatusOr<std::unique_ptr<LayerCall>> LayOutCall(const BatchPlan& plan, int64_t rows,
                                                                bool decode, DType wire) const = 0;
  virtual absl::StatusOr<Tensor> Launch(const BatchPlan& plan, const LayerCall& call, int64_t rows,
                                        bool decode) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;

  // Grows the workspace to `device_bytes` and the staging buffer to the upload region plus the
  // output's download, and writes the input and the plan into staging.
  absl::Status StageUpload(const UploadSections& up, const OutputSections& out, size_t device_bytes,
                           const Tensor& hidden, const BatchPlan& plan,
                           absl::Span<const int32_t> flashinfer_words)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The first device stage: starts the device clock, copies the upload region up, poisons the rest
  // of the workspace (to `device_bytes`) under poison_for_testing, and converts the input from the
  // wire dtype into `x_act` when `activation` differs. Returns the projections' input (the upload's
  // x, or x_act).
  absl::StatusOr<const void*> Upload(const UploadSections& up, size_t device_bytes, DType wire,
                                     DType activation, const Section& x_act, int64_t rows)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The last device stages, after the output projection wrote `out.out`: the finiteness check in
  // the wire dtype, the conversion to it, one download after the upload region (`upload_bytes` into
  // staging), the stream's synchronisation, and the output tensor.
  absl::StatusOr<Tensor> Download(const OutputSections& out, size_t upload_bytes, int64_t rows)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A section's address in the workspace.
  std::byte* device(const Section& section) const {
    return static_cast<std::byte*>(workspace_.data()) + section.offset;
  }
  float* device_floats(const Section& section) const {
    return reinterpret_cast<float*>(device(section));
  }

  const LayerSpec spec_;
  // The layer's variations (the softmax scale, the mask, ALiBi, ...), built once here, not per
  // call.
  const AttentionVariation variation_;
  const KvCacheConfig kv_config_;
  const CudaContext context_;

  mutable absl::Mutex mu_;  // One call at a time per layer.
  // Sequences, device pages, and Fork/Export/Import's page copies.
  DeviceSequences pages_ ABSL_GUARDED_BY(mu_);
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  DeviceBuffer workspace_;  // One call's device buffers (call_layout.h), grown on demand.
  PinnedBuffer staging_;    // Host side of the upload and of the download, grown on demand.
  StageTimer timer_ ABSL_GUARDED_BY(mu_);
  // Set once by each kind's Init, once it knows whether FlashInfer computes the attention: how
  // PlanBatch lays a call out, and the widest row of any buffer (a call's rows times it must fit an
  // int).
  BatchPlanShape plan_shape_;
  int64_t widest_row_ = 1;

 private:
  // Plans and runs one reserved batch (the pages are reserved, `hidden` and `positions` checked);
  // on error Run rolls the reservation back: the host plan (PlanBatch), the kind's layout
  // (LayOutCall), staging the input and the plan in pinned memory, and the kind's Launch.
  absl::StatusOr<Tensor> Compute(const Tensor& hidden, const std::vector<BatchSequence>& batch,
                                 absl::Span<const int64_t> positions, bool decode)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Tensor> Run(const Tensor& hidden, absl::Span<const SequenceId> ids,
                             absl::Span<const int64_t> counts, absl::Span<const int64_t> positions,
                             bool decode);
};

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_LAYER_CUDA_LAYER_BASE_H_
