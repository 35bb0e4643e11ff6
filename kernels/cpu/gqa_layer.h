// MHA, MQA and GQA on the CPU: one implementation, the group size (num_heads / num_kv_heads)
// being the only difference. K/V are cached per KV head and never repeated per query head.
// The model-family variations are one AttentionVariation (kernels/spec/attention_variation.h)
// built from the spec at creation, whose hooks the kernels call and the layer's projection step
// calls for the q/k norm and RoPE (partial rotary dims, Phi-4-mini, included). The cache holds k
// after its norm and RoPE, so decode sees what prefill saw.
#ifndef ATTNSERVE_KERNELS_CPU_GQA_LAYER_H_
#define ATTNSERVE_KERNELS_CPU_GQA_LAYER_H_

#include <memory>
#include <vector>

#include "kernels/cpu/cpu_layer.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/rope_table.h"
#include "kernels/cpu/scratch_floats.h"
#include "kernels/spec/attention_variation.h"

namespace attnserve {

class GqaLayer : public CpuLayer {
 public:
  // `weights` must have passed ValidateLayerWeights for `spec`. `projection_weights` (kF32 or
  // kBF16) is how q/k/v/o_proj's weights are kept and read (CpuBackendOptions).
  GqaLayer(const LayerSpec& spec, const LayerWeights& weights, const KvCacheConfig& kv_config,
           DType projection_weights, ThreadPool* pool);

  // The projection weights in their kept dtype, everything else in f32.
  int64_t ParameterBytes() const override;

  // Page layout [K|V][num_kv_heads][page_size][head_dim] for this spec.
  static KvPageLayout MakePageLayout(const LayerSpec& spec, const KvCacheConfig& kv_config);

 protected:
  void RunPrefill(const CpuBatch& batch) override;
  void RunDecode(const CpuBatch& batch) override;

 private:
  // One call's intermediates. Decode reuses the layer's own (calls are serialised by CpuLayer's
  // mutex), so a step allocates nothing here; prefill, whose rows are many, uses its own.
  // k and v are read in place from qkv (RoPE and norms applied there); q too in prefill, while
  // decode copies it out because its kernel takes q as [batch, num_heads, head_dim].
  struct Buffers {
    ScratchFloats qkv;         // [rows, q_width + 2 * kv_width]: the fused projection.
    ScratchFloats q;           // [rows, num_heads * head_dim]; decode only.
    ScratchFloats attention;   // [rows, num_heads * head_dim]
  };
  // Projects the batch into b.qkv, applies the q/k norms and RoPE there and writes K/V into the
  // sequences' pages.
  void ProjectAndCache(const CpuBatch& batch, Buffers& b);
  void OutputProjection(const CpuBatch& batch, const float* attention);

  int q_width_;   // num_heads * head_dim
  int kv_width_;  // num_kv_heads * head_dim
  // q, k and v_proj stacked into one [q_width + 2 * kv_width, d_model] weight: one pass over the
  // input and one fan-out to the threads per step instead of three.
  ProjectionWeight wqkv_;
  ProjectionWeight wo_;      // [d_model, q_width]
  std::vector<float> bqkv_;  // [q_width + 2 * kv_width] (zeros for a projection without); or empty.
  std::vector<float> bo_;    // Empty when the spec has no bias.
  // The q/k norms' effective scales (w, or 1 + w for kRmsUnitOffset); empty without qk_norm.
  std::vector<float> q_norm_scale_, k_norm_scale_;
  std::vector<float> sinks_;           // [num_heads]; empty without attention_sinks.
  std::vector<double> rope_inv_freq_;  // [RotaryDim / 2] RopeInverseFrequencies; empty without.
  // The spec's variations with pointers into the vectors above, built once; every kernel call
  // takes it as it is.
  AttentionVariation variation_;
  // RoPE's cos/sin by position, shared with the model's other layers; null without RoPE.
  std::shared_ptr<RopeTable> rope_table_;
  Buffers decode_buffers_;  // Guarded by CpuLayer's mutex (Run holds it).
};

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_CPU_GQA_LAYER_H_
