// An MHA/MQA/GQA layer on the GPU. The call shell (checks, reservation, rollback, the upload and
// the download) is CudaLayerBase's; this class is the math. Per call: plan the batch on the host
// (page table, work items, split-KV plan), stage it with the input into pinned memory, upload it
// with one copy, then run on the layer's stream:
//   x -> activation dtype                  LaunchConvertActivations (when the wire's differs)
//   qkv = x . [Wq; Wk; Wv]^T (+ bias)      cuBLAS (Projection: sgemm, or GemmEx for 16-bit)
//   q/k norm, RoPE(q, k); k, v -> pages    RopeAppendKernel
//   attention                              prefill: MmaPrefillKernel (f16/bf16 pages, tensor
//                                          cores) or PrefillKernel (f32 pages); decode:
//                                          PagedDecodeKernel + combine; or FlashInfer's
//   out = attn . Wo^T (+ bias)             cuBLAS (Projection)
// then the finiteness check and the conversion to the caller's dtype on the device, and one
// download. The activation dtype (projections) is chosen from the KV storage format once, at
// creation: f32 pages compute in fp32; f16/bf16 pages run the projections and the prefill
// attention on tensor cores with 16-bit inputs and fp32 accumulation (decode reads the pages and
// accumulates in fp32).
#ifndef ATTNSERVE_KERNELS_CUDA_LAYER_CUDA_LAYER_H_
#define ATTNSERVE_KERNELS_CUDA_LAYER_CUDA_LAYER_H_

#include <cuda_runtime_api.h>

#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "kernels/backend.h"
#include "kernels/cuda/attention/batch_plan.h"
#include "kernels/cuda/attention/params.h"
#include "kernels/cuda/layer/cuda_layer_base.h"
#include "kernels/cuda/layer/flashinfer_attention.h"
#include "kernels/cuda/layer/projection.h"
#include "kernels/cuda/runtime/device_memory.h"

namespace attnserve::cuda {

class CudaGqaLayer : public CudaLayerBase {
 public:
  // Spec, weights and config must be validated (the backend does); uploads the weights.
  static absl::StatusOr<std::unique_ptr<AttentionLayer>> Create(const LayerSpec& spec,
                                                                const LayerWeights& weights,
                                                                const KvCacheConfig& kv_config,
                                                                const CudaContext& context);

  // The projections' device weights (16-bit for f16/bf16 layers, biases fp32), q/k norm scales
  // and sinks (fp32).
  int64_t ParameterBytes() const override;

 private:
  CudaGqaLayer(const LayerSpec& spec, const KvCacheConfig& kv_config, const CudaContext& context,
               int64_t page_bytes);
  absl::Status Init(const LayerWeights& weights);
  struct CallLayout;  // LayerCall with this kind's sections and FlashInfer's call plan.
  // How PlanBatch lays out this layer's calls (CudaLayerBase::plan_shape_, set by Init).
  BatchPlanShape PlanShape() const;
  // `fi`: the FlashInfer side of the call when FlashInfer computes the attention.
  using FlashInferCall = std::optional<FlashInferAttention::CallPlan>;
  // `wire`: the caller's dtype, in which the input is uploaded (converted to the activation dtype
  // on the device) and the output converted on the device and downloaded.
  absl::StatusOr<std::unique_ptr<LayerCall>> LayOutCall(const BatchPlan& plan, int64_t rows,
                                                        bool decode, DType wire) const override;
  // Upload, qkv projection, RoPE + KV append, attention, output projection, download and
  // synchronise; returns the output [rows, d_model] in the wire dtype.
  absl::StatusOr<Tensor> Launch(const BatchPlan& plan, const LayerCall& call, int64_t rows,
                                bool decode) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The attention step alone: the native kernels, or FlashInfer's when `fi` is set.
  absl::Status RunAttention(const BatchPlan& plan, const FlashInferCall& fi, const CallLayout& l,
                            int64_t rows, bool decode) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The native kernels' view of the pages, with this call's page table.
  PagedKv PagedView(const CallLayout& layout) const;

  const int q_width_;    // num_heads * head_dim
  const int kv_width_;   // num_kv_heads * head_dim
  const int qkv_width_;  // q_width_ + 2 * kv_width_
  // The projections' dtype (weights, inputs): f32, or the 16-bit page type. Not the page format
  // itself, which kernels read from kv_config_.storage.
  const DType activation_;

  Projection qkv_proj_;  // [Wq; Wk; Wv] stacked: q, k and v side by side in each row.
  Projection o_proj_;
  // Set when FlashInfer computes this layer's attention (--cuda_attention=flashinfer and
  // FlashInferAttention::Serves); else the native kernels do.
  std::optional<FlashInferAttention> flashinfer_;
  DeviceBuffer inv_freq_;       // RoPE frequencies (fp64).
  DeviceBuffer qk_norm_scale_;  // [2, head_dim] q then k RMSNorm scale; empty without q/k norm.
  DeviceBuffer sinks_;          // [num_heads] attention sinks; empty without them.
};

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_LAYER_CUDA_LAYER_H_
