// A DeepSeek-V2/V3 multi-head latent attention (MLA) layer on the GPU, in the absorbed form. The
// call shell (checks, reservation, rollback, the upload and the download) is CudaLayerBase's; this
// class is the math. The pages are the CPU's ([page_size][kv_lora_rank + qk_rope_head_dim],
// kernels/kv/page_layout.h), so Fork/Export/Import move the same bytes as on the CPU
// (DeviceSequences, shared with any CUDA layer kind). Per call: validate and reserve pages, plan
// the batch on the host (PlanBatch with every head a query row of one shared KV head), upload the
// input and the plan in one copy, then on the layer's stream:
//   q_a = x Wq_a^T, or q = x Wq^T          cuBLAS (Projection: sgemm, or GemmEx for 16-bit)
//   lat = x Wkv_a^T                        cuBLAS
//   RMSNorm(q_a), RMSNorm(c), RoPE(k_pe),
//   [c | k_pe] -> pages                    MlaAppendKernel
//   q = q_a Wq_b^T                         cuBLAS (q_lora_rank > 0)
//   q_lat = [q_nope W_UK | RoPE(q_pe)]     MlaQueryKernel (W_UK absorbed into the query)
//   o_lat = attention over the pages       MlaPrefillKernel, or MlaDecodeKernel + combine;
//                                          FlashInfer's BatchMLAPagedAttention under
//                                          --cuda_attention=flashinfer|auto (bf16 pages, 512 + 64,
//                                          not run on a device yet)
//   attn = o_lat W_UV^T                    MlaOutputKernel
//   out = attn Wo^T                        cuBLAS
// and copy the output back. The input is uploaded in the caller's dtype and the output downloaded
// in it, converted on the device. The projections run as CudaGqaLayer's: fp32 with f32 pages, and
// with f16/bf16 pages on 16-bit resident weights and 16-bit inputs (the fp32 q_a and attention
// output rounded on the device) with fp32 accumulation. The absorbed W_UK/W_UV and the norms stay
// fp32; the attention reads 16-bit pages and accumulates in fp32. 8-bit pages (fp8 e4m3, int8)
// compute in fp32 and hold the CPU's bytes (quantized on append, dequantized in the gather).
// A failure after the reservation rolls it back, so calls stay all-or-nothing as on the CPU.
#ifndef ATTNSERVE_KERNELS_CUDA_LAYER_CUDA_MLA_LAYER_H_
#define ATTNSERVE_KERNELS_CUDA_LAYER_CUDA_MLA_LAYER_H_

#include <cuda_runtime_api.h>

#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "kernels/backend.h"
#include "kernels/cuda/attention/batch_plan.h"
#include "kernels/cuda/layer/cuda_layer_base.h"
#include "kernels/cuda/layer/flashinfer_mla_attention.h"
#include "kernels/cuda/layer/projection.h"
#include "kernels/cuda/runtime/device_memory.h"

namespace attnserve::cuda {

class CudaMlaLayer : public CudaLayerBase {
 public:
  // Spec, weights and config must be validated (the backend does); checks the widths against the
  // kernels (CheckMlaKernelDims) and uploads the weights.
  static absl::StatusOr<std::unique_ptr<AttentionLayer>> Create(const LayerSpec& spec,
                                                                const LayerWeights& weights,
                                                                const KvCacheConfig& kv_config,
                                                                const CudaContext& context);

  // Device weights: the projections in the activation dtype; norms, kv_b_proj and its transposed
  // W_UV in fp32.
  int64_t ParameterBytes() const override;
  // Whether FlashInfer's MLA kernel computes the attention (FlashInferMlaAttention::Serves under
  // --cuda_attention=flashinfer or auto).
  bool uses_flashinfer() const { return flashinfer_.has_value(); }

 private:
  CudaMlaLayer(const LayerSpec& spec, const KvCacheConfig& kv_config, const CudaContext& context,
               int64_t page_bytes);
  absl::Status Init(const LayerWeights& weights);
  struct CallLayout;  // LayerCall with this kind's sections and FlashInfer's call plan.
  // How PlanBatch lays out this layer's calls (CudaLayerBase::plan_shape_, set by Init).
  BatchPlanShape PlanShape() const;
  // `fi`: the FlashInfer side of the call when FlashInfer computes the attention.
  using FlashInferCall = std::optional<FlashInferMlaAttention::CallPlan>;
  absl::StatusOr<std::unique_ptr<LayerCall>> LayOutCall(const BatchPlan& plan, int64_t rows,
                                                        bool decode, DType wire) const override;
  absl::StatusOr<Tensor> Launch(const BatchPlan& plan, const LayerCall& call, int64_t rows,
                                bool decode) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RunAttention(const BatchPlan& plan, const FlashInferCall& fi, const CallLayout& l,
                            int64_t rows, bool decode) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const MlaDims dims_;
  const int qk_dim_;      // nope + rope: one head of q.
  const int row_width_;   // kv_lora_rank + rope: one cached row, and one absorbed query head.
  const int kv_b_width_;  // nope + v: rows of kv_b_proj per head.
  // The projections' dtype (weights, inputs): f32 with f32 and 8-bit pages, else the 16-bit page
  // type.
  const DType activation_;

  Projection q_proj_;    // x -> q (q_lora_rank == 0), or x -> q latent (q_a_proj).
  Projection q_b_proj_;  // q latent -> q (q_lora_rank > 0).
  Projection kv_a_proj_;
  Projection o_proj_;
  DeviceBuffer q_norm_;    // [q_lora] (q_a_layernorm)
  DeviceBuffer kv_norm_;   // [kv_lora] (kv_a_layernorm)
  DeviceBuffer w_kv_b_;    // [H * (nope + v), kv_lora] kv_b_proj, read in place as W_UK.
  DeviceBuffer w_uv_t_;    // [H, kv_lora, v] W_UV transposed.
  DeviceBuffer inv_freq_;  // RoPE frequencies (fp64).
  // Set when FlashInfer computes this layer's attention; else the native kernels do.
  std::optional<FlashInferMlaAttention> flashinfer_;
};

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_LAYER_CUDA_MLA_LAYER_H_
