// MHA, MQA and GQA on the CPU: one implementation, the group size (num_heads / num_kv_heads)
// being the only difference. K/V are cached per KV head and never repeated per query head.
#ifndef ATTNSERVE_KERNELS_CPU_GQA_LAYER_H_
#define ATTNSERVE_KERNELS_CPU_GQA_LAYER_H_

#include <vector>

#include "kernels/cpu/cpu_layer.h"
#include "kernels/cpu/rope.h"

namespace attnserve {

class GqaLayer : public CpuLayer {
 public:
  // `weights` must have passed ValidateLayerWeights for `spec`.
  GqaLayer(const LayerSpec& spec, const LayerWeights& weights, const KvCacheConfig& kv_config,
           ThreadPool* pool);

  // Page layout [K|V][num_kv_heads][page_size][head_dim] for this spec.
  static KvPageLayout MakePageLayout(const LayerSpec& spec, const KvCacheConfig& kv_config);

 protected:
  void RunPrefill(const CpuBatch& batch) override;
  void RunDecode(const CpuBatch& batch) override;

 private:
  struct Projections {
    std::vector<float> q;  // [rows, num_heads * head_dim]
    std::vector<float> k;  // [rows, num_kv_heads * head_dim]
    std::vector<float> v;  // [rows, num_kv_heads * head_dim]
  };
  // Projects the batch, applies RoPE and writes K/V into the sequences' pages.
  Projections ProjectAndCache(const CpuBatch& batch);
  void OutputProjection(const CpuBatch& batch, const std::vector<float>& attention);

  int q_width_;                           // num_heads * head_dim
  int kv_width_;                          // num_kv_heads * head_dim
  std::vector<float> wq_, wk_, wv_, wo_;  // nn.Linear layout [out, in]
  std::vector<float> bq_, bk_, bv_, bo_;  // Empty when the spec has no bias.
  RotaryEmbedding rope_;
};

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_CPU_GQA_LAYER_H_
