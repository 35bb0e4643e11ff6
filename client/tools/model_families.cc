#include "client/tools/model_families.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace attnserve {

namespace {

LayerSpec Layer(AttentionVariant variant, int d_model, int heads, int kv_heads, int head_dim,
                double rope_theta) {
  LayerSpec spec;
  spec.variant = variant;
  spec.d_model = d_model;
  spec.num_heads = heads;
  spec.num_kv_heads = kv_heads;
  spec.head_dim = head_dim;
  spec.rope = RopeLayout::kHalf;
  spec.rope_theta = rope_theta;
  return spec;
}

LayerSpec Gqa(int d_model, int heads, int kv_heads, int head_dim, double rope_theta) {
  const AttentionVariant variant = kv_heads == heads ? AttentionVariant::kMHA
                                   : kv_heads == 1   ? AttentionVariant::kMQA
                                                     : AttentionVariant::kGQA;
  return Layer(variant, d_model, heads, kv_heads, head_dim, rope_theta);
}

RopeScaling Yarn(double factor, int original, double mscale = 0.0, double mscale_all_dim = 0.0) {
  RopeScaling r;
  r.type = RopeScalingType::kYarn;
  r.factor = factor;
  r.original_max_position_embeddings = original;
  r.mscale = mscale;
  r.mscale_all_dim = mscale_all_dim;
  return r;
}

LayerSpec DeepSeekMla(int d_model, int heads, int q_lora_rank, RopeScaling yarn) {
  LayerSpec spec = Layer(AttentionVariant::kMLA, d_model, heads, 0, 0, 10000.0);
  spec.rope = RopeLayout::kInterleaved;
  spec.mla = {.q_lora_rank = q_lora_rank,
              .kv_lora_rank = 512,
              .qk_nope_head_dim = 128,
              .qk_rope_head_dim = 64,
              .v_head_dim = 128,
              .rms_norm_eps = 1e-6f};
  spec.rope_scaling = yarn;
  return spec;
}

std::vector<ModelFamily> Build() {
  std::vector<ModelFamily> families;

  LayerSpec llama31 = Gqa(4096, 32, 8, 128, 500000.0);
  llama31.rope_scaling = {
      .type = RopeScalingType::kLlama3, .factor = 8.0, .original_max_position_embeddings = 8192};
  LayerSpec llama32 = Gqa(2048, 32, 8, 64, 500000.0);
  llama32.rope_scaling = {
      .type = RopeScalingType::kLlama3, .factor = 32.0, .original_max_position_embeddings = 8192};
  families.push_back({"Llama 2 / 3 / 3.1+ (`llama`)",
                      "GQA, `llama3` RoPE scaling",
                      {{"Llama-2-7B", Gqa(4096, 32, 32, 128, 10000.0)},
                       {"Llama-3.1-8B", llama31},
                       {"Llama-3.2-1B", llama32}},
                      ""});

  LayerSpec mistral = Gqa(4096, 32, 8, 128, 10000.0);
  mistral.sliding_window = 4096;
  families.push_back({"Mistral, Mixtral (`mistral`, `mixtral`)",
                      "sliding window on every layer",
                      {{"Mistral-7B-v0.1", mistral}},
                      ""});

  LayerSpec qwen2 = Gqa(3584, 28, 4, 128, 1000000.0);
  qwen2.qkv_bias = true;
  LayerSpec qwen2_window = qwen2;
  qwen2_window.sliding_window = 131072;
  LayerSpec qwen2_yarn = qwen2;
  qwen2_yarn.rope_scaling = Yarn(4.0, 32768);
  families.push_back({"Qwen2 / 2.5 (`qwen2`)",
                      "q/k/v bias, `max_window_layers`, YaRN",
                      {{"Qwen2.5-7B", qwen2},
                       {"window", qwen2_window, /*optional=*/true},
                       {"YaRN", qwen2_yarn, /*optional=*/true}},
                      ""});

  LayerSpec qwen3 = Gqa(4096, 32, 8, 128, 1000000.0);
  qwen3.qk_norm = QkNorm::kRms;
  families.push_back({"Qwen3, Qwen3-MoE (`qwen3`, `qwen3_moe`)",
                      "per-head q/k RMSNorm",
                      {{"Qwen3-8B", qwen3}},
                      ""});

  LayerSpec phi3 = Gqa(3072, 32, 32, 96, 10000.0);
  phi3.sliding_window = 2047;
  LayerSpec phi4 = Gqa(3072, 24, 8, 128, 10000.0);
  phi4.rotary_dim = 96;  // partial_rotary_factor 0.75
  families.push_back({"Phi-3, Phi-4-mini (`phi3`)",
                      "fused `qkv_proj`, `partial_rotary_factor`, window",
                      {{"Phi-3-mini-4k", phi3}, {"Phi-4-mini", phi4}},
                      "LongRoPE refused"});

  LayerSpec gemma2 = Gqa(3584, 16, 8, 256, 10000.0);
  gemma2.attn_logit_softcapping = 50.0f;
  gemma2.softmax_scale = static_cast<float>(1.0 / std::sqrt(256.0));  // query_pre_attn_scalar
  gemma2.sliding_window = 4096;
  LayerSpec gemma2_global = gemma2;
  gemma2_global.sliding_window = 0;
  families.push_back({"Gemma 2 (`gemma2`)",
                      "soft-capping, `query_pre_attn_scalar`, alternating windows, hd 256",
                      {{"gemma-2-9b local", gemma2}, {"gemma-2-9b global", gemma2_global}},
                      ""});

  LayerSpec gemma3 = Gqa(1152, 4, 1, 256, 10000.0);
  gemma3.qk_norm = QkNorm::kRmsUnitOffset;
  gemma3.softmax_scale = static_cast<float>(1.0 / std::sqrt(256.0));
  gemma3.sliding_window = 512;
  LayerSpec gemma3_global = gemma3;
  gemma3_global.sliding_window = 0;
  gemma3_global.rope_theta = 1000000.0;
  families.push_back({"Gemma 3 (`gemma3_text`)",
                      "q/k norm (1 + w), 5 local : 1 global, local RoPE base",
                      {{"gemma-3-1b local", gemma3}, {"gemma-3-1b global", gemma3_global}},
                      ""});

  LayerSpec olmo2 = Gqa(4096, 32, 32, 128, 500000.0);
  olmo2.qk_norm = QkNorm::kRmsAcrossHeads;
  olmo2.qk_norm_eps = 1e-6f;
  families.push_back({"OLMo 2 (`olmo2`)", "q/k RMSNorm over all heads (before the split)",
                      {{"OLMo-2-1124-7B", olmo2}},
                      ""});

  LayerSpec command_r_plus = Gqa(12288, 96, 8, 128, 75000000.0);
  command_r_plus.rope = RopeLayout::kInterleaved;
  command_r_plus.qk_norm = QkNorm::kLayerNorm;
  command_r_plus.qk_norm_eps = 1e-5f;
  families.push_back({"Cohere Command R / R+ (`cohere`)",
                      "q/k LayerNorm per head (`use_qk_norm`), interleaved RoPE",
                      {{"c4ai-command-r-plus", command_r_plus}},
                      ""});

  LayerSpec stablelm2 = Gqa(5120, 32, 8, 160, 10000.0);
  stablelm2.rotary_dim = 40;
  stablelm2.qk_norm = QkNorm::kLayerNorm;
  stablelm2.qk_norm_eps = 1e-5f;
  families.push_back({"StableLM 2 (`stablelm`)",
                      "q/k LayerNorm per head (`qk_layernorm`), `partial_rotary_factor`",
                      {{"stablelm-2-12b", stablelm2}},
                      ""});

  LayerSpec gpt_oss = Gqa(2880, 64, 8, 64, 150000.0);
  gpt_oss.qkv_bias = gpt_oss.o_bias = true;
  gpt_oss.attention_sinks = true;
  gpt_oss.sliding_window = 128;
  gpt_oss.rope_scaling = Yarn(32.0, 4096);
  gpt_oss.rope_scaling.truncate = false;
  families.push_back({"gpt-oss (`gpt_oss`)",
                      "sinks, biases, alternating windows, YaRN `truncate: false`",
                      {{"gpt-oss-20b", gpt_oss}},
                      ""});

  // No RoPE: ALiBi's linear biases instead (LayerSpec::alibi).
  LayerSpec bloom = Gqa(1024, 16, 16, 64, 10000.0);
  bloom.rope = RopeLayout::kNone;
  bloom.qkv_bias = bloom.o_bias = true;
  bloom.alibi = Alibi::kBloom;
  families.push_back({"BLOOM (`bloom`)",
                      "ALiBi, per-head interleaved `query_key_value`, biases",
                      {{"bloom-560m", bloom}},
                      ""});

  LayerSpec mpt = Gqa(4096, 32, 32, 128, 10000.0);
  mpt.rope = RopeLayout::kNone;
  mpt.alibi = Alibi::kMpt;
  families.push_back({"MPT (`mpt`)",
                      "ALiBi (`alibi_bias_max` 8), fused `Wqkv`",
                      {{"mpt-7b", mpt}},
                      ""});

  const LayerSpec deepseek_v2 = DeepSeekMla(2048, 16, 0, Yarn(40.0, 4096, 0.707, 0.707));
  families.push_back({"DeepSeek-V2 (`deepseek_v2`)",
                      "MLA, interleaved RoPE, YaRN",
                      {{"DeepSeek-V2-Lite", deepseek_v2}},
                      ""});
  const LayerSpec deepseek_v3 = DeepSeekMla(7168, 128, 1536, Yarn(40.0, 4096, 1.0, 1.0));
  families.push_back({"DeepSeek-V3 (`deepseek_v3`)",
                      "MLA, YaRN with softmax mscale",
                      {{"DeepSeek-V3", deepseek_v3}},
                      "bf16 weights only (the fp8 release is refused)"});
  return families;
}

// Every gap's short name over `layers`, each once, in order of first appearance.
std::vector<std::string> GapNames(const BackendCapabilities& capabilities,
                                  const std::vector<const FamilyLayer*>& layers) {
  std::vector<std::string> names;
  for (const FamilyLayer* layer : layers) {
    for (const CapabilityGap& gap : FindCapabilityGaps(capabilities, layer->spec, DType::kF32)) {
      if (std::find(names.begin(), names.end(), gap.short_name) == names.end()) {
        names.push_back(gap.short_name);
      }
    }
  }
  return names;
}

}  // namespace

const std::vector<ModelFamily>& ModelFamilies() {
  static const std::vector<ModelFamily>* const families = new std::vector<ModelFamily>(Build());
  return *families;
}

std::string FamilyCell(const BackendCapabilities& capabilities, const ModelFamily& family) {
  std::vector<const FamilyLayer*> required;
  for (const FamilyLayer& layer : family.layers) {
    if (!layer.optional) required.push_back(&layer);
  }
  if (const std::vector<std::string> gaps = GapNames(capabilities, required); !gaps.empty()) {
    return absl::StrCat("refused (", absl::StrJoin(gaps, ", "), ")");
  }
  std::string cell = "yes";
  // The head-dim limit is MHA/MQA/GQA's; MLA's widths are its own (MlaDims).
  const bool all_mla = std::all_of(required.begin(), required.end(), [](const FamilyLayer* l) {
    return l->spec.variant == AttentionVariant::kMLA;
  });
  if (!capabilities.head_dims.empty() && !all_mla) {
    absl::StrAppend(&cell, " (hd ", absl::StrJoin(capabilities.head_dims, "/"), ")");
  }
  for (const FamilyLayer& layer : family.layers) {
    if (!layer.optional) continue;
    if (const std::vector<std::string> gaps = GapNames(capabilities, {&layer}); !gaps.empty()) {
      absl::StrAppend(&cell, "; ", layer.label, " refused (", absl::StrJoin(gaps, ", "), ")");
    }
  }
  if (!family.note.empty()) absl::StrAppend(&cell, "; ", family.note);
  return cell;
}

}  // namespace attnserve
