#include "client/common/demo_variants.h"

namespace attnserve {

std::vector<NamedSpec> DemoVariants(int d_model, int num_heads, int window) {
  LayerSpec base;
  base.d_model = d_model;
  base.num_heads = num_heads;
  base.head_dim = d_model / num_heads;
  base.rope = RopeLayout::kHalf;
  base.causal = true;
  base.sliding_window = window;

  LayerSpec mha = base;
  mha.variant = AttentionVariant::kMHA;
  mha.num_kv_heads = num_heads;
  LayerSpec gqa = base;
  gqa.variant = AttentionVariant::kGQA;
  gqa.num_kv_heads = num_heads >= 2 ? num_heads / 2 : 1;
  LayerSpec mqa = base;
  mqa.variant = AttentionVariant::kMQA;
  mqa.num_kv_heads = 1;
  LayerSpec mla = base;
  mla.variant = AttentionVariant::kMLA;
  mla.rope = RopeLayout::kInterleaved;
  mla.mla.q_lora_rank = 0;
  mla.mla.kv_lora_rank = d_model / 2;
  mla.mla.qk_nope_head_dim = d_model / num_heads;
  mla.mla.qk_rope_head_dim = d_model / num_heads / 2;
  mla.mla.v_head_dim = d_model / num_heads;
  return {{"MHA", mha},
          {"GQA-" + std::to_string(gqa.num_kv_heads), gqa},
          {"MQA", mqa},
          {"MLA-" + std::to_string(mla.mla.kv_lora_rank), mla}};
}

}  // namespace attnserve
