// DeepSeek-V2/V3 multi-head latent attention on the CPU.
//
// Each token caches only [c_kv (kv_lora_rank) | k_pe (qk_rope_head_dim)]: the RMS-normalised
// latent and the RoPE key shared by all heads. Prefill uses the expanded form: it up-projects the
// latents it attends to (kv_b_proj) into per-head k_nope and v. Decode uses the absorbed form by
// default: W_UK is folded into each head's query (q_nope · W_UK -> a query in latent space), the
// softmax runs over the cached rows directly (like MQA with num_heads query rows and a 576-wide
// key at DeepSeek-V3 sizes), and W_UV is applied to the attended latent afterwards.
#ifndef ATTNSERVE_KERNELS_CPU_MLA_LAYER_H_
#define ATTNSERVE_KERNELS_CPU_MLA_LAYER_H_

#include <vector>

#include "kernels/cpu/cpu_layer.h"
#include "kernels/cpu/scratch_floats.h"
#include "kernels/spec/attention_variation.h"

namespace attnserve {

class MlaLayer : public CpuLayer {
 public:
  // `weights` must have passed ValidateLayerWeights for `spec`.
  MlaLayer(const LayerSpec& spec, const LayerWeights& weights, const KvCacheConfig& kv_config,
           bool absorbed_decode, ThreadPool* pool);

  // Page layout [page_size][kv_lora_rank + qk_rope_head_dim].
  static KvPageLayout MakePageLayout(const LayerSpec& spec, const KvCacheConfig& kv_config);

 protected:
  void RunPrefill(const CpuBatch& batch) override;
  void RunDecode(const CpuBatch& batch) override;

 private:
  // Queries [rows, num_heads * (nope + rope)] with RoPE applied to each head's q_pe, in
  // `q_buffer` (resized).
  const float* ComputeQueries(const CpuBatch& batch, ScratchFloats& q_buffer);
  // Computes each new token's [c_kv | k_pe] and writes it to the sequence's pages.
  void ComputeAndCacheLatents(const CpuBatch& batch);
  void AbsorbedDecode(const CpuBatch& batch, const float* q,
                      std::vector<float>& attention);
  void OutputProjection(const CpuBatch& batch, const float* attention);

  MlaDims dims_;
  int qk_dim_;      // nope + rope
  int latent_dim_;  // kv_lora_rank + rope: one cached row.
  int kv_b_width_;  // nope + v: rows of kv_b_proj per head.
  bool absorbed_decode_;
  std::vector<float> wq_;         // [H * qk, d_model]        (q_lora_rank == 0)
  std::vector<float> wq_a_;       // [q_lora, d_model]        (q_lora_rank > 0)
  std::vector<float> q_a_norm_;   // [q_lora]
  std::vector<float> wq_b_;       // [H * qk, q_lora]
  std::vector<float> wkv_a_;      // [kv_lora + rope, d_model]
  std::vector<float> kv_a_norm_;  // [kv_lora]
  std::vector<float> wkv_b_;      // [H * (nope + v), kv_lora]
  std::vector<float> wo_;         // [d_model, H * v]
  // RoPE's inverse frequencies [qk_rope_head_dim / 2] (empty without RoPE), which variation_
  // points at: the softmax scale, the mask and RoPE (MLA has no other variations), built once.
  std::vector<double> rope_inv_freq_;
  AttentionVariation variation_;
};

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_CPU_MLA_LAYER_H_
