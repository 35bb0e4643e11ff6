// kernels/model/hf_config.h: config.json -> LayerSpec on the configs of released checkpoints (as
// published on the Hugging Face Hub, trimmed of nothing), per-layer differences, and refusals.
// tests/engine/hf_config_peer_test.cc checks the same mapping against every peer case's
// config.json.
#include "kernels/model/hf_config.h"

#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/spec/layer_spec.h"

namespace attnserve {
namespace {

using ::testing::HasSubstr;

LayerSpec SpecOrDie(const std::string& json, int layer) {
  absl::StatusOr<LayerSpec> spec = LayerSpecFromHfConfig(json, layer);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : LayerSpec();
}

void ExpectRefused(const std::string& json, int layer, const std::string& key) {
  absl::StatusOr<LayerSpec> spec = LayerSpecFromHfConfig(json, layer);
  ASSERT_FALSE(spec.ok()) << "accepted: " << LayerSpecSummary(*spec);
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr(key));
}

// meta-llama/Llama-3.1-8B config.json.
constexpr char kLlama31[] = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
  "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072,
  "mlp_bias": false, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 128256})";

TEST(HfConfigTest, Llama31) {
  const LayerSpec spec = SpecOrDie(kLlama31, 31);
  EXPECT_EQ(spec.variant, AttentionVariant::kGQA);
  EXPECT_EQ(spec.d_model, 4096);
  EXPECT_EQ(spec.num_heads, 32);
  EXPECT_EQ(spec.num_kv_heads, 8);
  EXPECT_EQ(spec.head_dim, 128);
  EXPECT_FALSE(spec.qkv_bias);
  EXPECT_EQ(spec.rope, RopeLayout::kHalf);
  EXPECT_EQ(spec.rope_theta, 500000.0);
  EXPECT_EQ(spec.rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_EQ(spec.rope_scaling.factor, 8.0);
  EXPECT_EQ(spec.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(spec.sliding_window, 0);
  EXPECT_EQ(spec.softmax_scale, 0.0f);
  EXPECT_TRUE(spec.causal);
}

// mistralai/Mistral-7B-v0.1: one window for every layer.
constexpr char kMistral[] = R"({
  "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.34.0.dev0",
  "use_cache": true, "vocab_size": 32000})";

TEST(HfConfigTest, MistralSlidesEveryLayer) {
  EXPECT_EQ(SpecOrDie(kMistral, 0).sliding_window, 4096);
  EXPECT_EQ(SpecOrDie(kMistral, 31).sliding_window, 4096);
}

// Qwen/Qwen2.5-7B-Instruct: q/k/v biases, no o bias; sliding_window present but unused.
constexpr char kQwen25[] = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
  "intermediate_size": 18944, "max_position_embeddings": 32768, "max_window_layers": 28,
  "model_type": "qwen2", "num_attention_heads": 28, "num_hidden_layers": 28,
  "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 131072, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.1", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 152064})";

TEST(HfConfigTest, Qwen25) {
  const LayerSpec spec = SpecOrDie(kQwen25, 27);
  EXPECT_TRUE(spec.qkv_bias);
  EXPECT_FALSE(spec.o_bias);
  EXPECT_EQ(spec.head_dim, 128);
  EXPECT_EQ(spec.num_kv_heads, 4);
  EXPECT_EQ(spec.sliding_window, 0);
  EXPECT_EQ(spec.qk_norm, QkNorm::kNone);
}

TEST(HfConfigTest, Qwen2SlidesFromMaxWindowLayers) {
  std::string config = kQwen25;
  config.replace(config.find("\"use_sliding_window\": false"), 27, "\"use_sliding_window\": true");
  config.replace(config.find("\"sliding_window\": 131072"), 24, "\"sliding_window\": 4096");
  config.replace(config.find("\"max_window_layers\": 28"), 23, "\"max_window_layers\": 20");
  EXPECT_EQ(SpecOrDie(config, 19).sliding_window, 0);  // The first 20 layers: full attention.
  EXPECT_EQ(SpecOrDie(config, 20).sliding_window, 4096);
}

// Qwen/Qwen3-8B: per-head RMSNorm of q and k.
constexpr char kQwen3[] = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 12288,
  "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
  "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";

TEST(HfConfigTest, Qwen3) {
  const LayerSpec spec = SpecOrDie(kQwen3, 0);
  EXPECT_EQ(spec.qk_norm, QkNorm::kRms);
  EXPECT_FLOAT_EQ(spec.qk_norm_eps, 1e-6f);
  EXPECT_EQ(spec.rope_theta, 1e6);
  EXPECT_EQ(spec.rope_scaling.type, RopeScalingType::kNone);
  EXPECT_EQ(spec.sliding_window, 0);
}

// google/gemma-2-9b: soft-capping, query_pre_attn_scalar, even layers slide.
constexpr char kGemma2[] = R"({
  "architectures": ["Gemma2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid",
  "eos_token_id": 1, "final_logit_softcapping": 30.0, "head_dim": 256,
  "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
  "hidden_size": 3584, "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 8192, "model_type": "gemma2", "num_attention_heads": 16,
  "num_hidden_layers": 42, "num_key_value_heads": 8, "pad_token_id": 0,
  "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
  "sliding_window": 4096, "sliding_window_size": 4096, "torch_dtype": "float32",
  "transformers_version": "4.42.0.dev0", "use_cache": true, "vocab_size": 256000})";

TEST(HfConfigTest, Gemma2) {
  const LayerSpec even = SpecOrDie(kGemma2, 0);
  const LayerSpec odd = SpecOrDie(kGemma2, 1);
  EXPECT_EQ(even.sliding_window, 4096);
  EXPECT_EQ(odd.sliding_window, 0);
  EXPECT_EQ(even.attn_logit_softcapping, 50.0f);
  EXPECT_EQ(even.head_dim, 256);
  EXPECT_EQ(even.softmax_scale, 0.0f);  // query_pre_attn_scalar == head_dim: the default.

  std::string scaled = kGemma2;  // gemma-2-27b: 4608 / 32 heads = 144, scalar 144.
  scaled.replace(scaled.find("\"query_pre_attn_scalar\": 256"), 28,
                 "\"query_pre_attn_scalar\": 144");
  EXPECT_FLOAT_EQ(SpecOrDie(scaled, 0).softmax_scale, 1.0f / 12.0f);

  std::string disagreeing = kGemma2;
  disagreeing.replace(disagreeing.find("\"sliding_window_size\": 4096"), 27,
                      "\"sliding_window_size\": 2048");
  ExpectRefused(disagreeing, 0, "sliding_window_size");
}

// google/gemma-3-1b-it: 5 local : 1 global, local RoPE base on sliding layers, qk-norm (1 + w).
constexpr char kGemma3[] = R"({
  "architectures": ["Gemma3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "attn_logit_softcapping": null, "bos_token_id": 2, "cache_implementation": "hybrid",
  "eos_token_id": [1, 106], "final_logit_softcapping": null, "head_dim": 256,
  "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "initializer_range": 0.02,
  "intermediate_size": 6912, "max_position_embeddings": 32768, "model_type": "gemma3_text",
  "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
  "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
  "rope_local_base_freq": 10000, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
  "rope_theta": 1000000, "sliding_window": 512, "sliding_window_pattern": 6,
  "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0", "use_cache": true,
  "vocab_size": 262144})";

TEST(HfConfigTest, Gemma3LocalAndGlobalLayers) {
  const LayerSpec local = SpecOrDie(kGemma3, 4);
  const LayerSpec global = SpecOrDie(kGemma3, 5);
  EXPECT_EQ(local.variant, AttentionVariant::kMQA);
  EXPECT_EQ(local.sliding_window, 512);
  EXPECT_EQ(local.rope_theta, 10000.0);
  EXPECT_EQ(local.rope_scaling.type, RopeScalingType::kNone);
  EXPECT_EQ(global.sliding_window, 0);
  EXPECT_EQ(global.rope_theta, 1e6);
  EXPECT_EQ(global.rope_scaling.type, RopeScalingType::kLinear);
  EXPECT_EQ(global.rope_scaling.factor, 8.0);
  EXPECT_EQ(global.qk_norm, QkNorm::kRmsUnitOffset);
  EXPECT_EQ(global.attn_logit_softcapping, 0.0f);
  EXPECT_EQ(SpecOrDie(kGemma3, 11).sliding_window, 0);
  EXPECT_EQ(SpecOrDie(kGemma3, 12).sliding_window, 512);
}

TEST(HfConfigTest, ExplicitLayerTypesWin) {
  std::string config = kGemma3;
  std::string types = "\"layer_types\": [";
  for (int i = 0; i < 26; ++i) types += i == 0 ? "\"full_attention\"" : ", \"sliding_attention\"";
  types += "], ";
  config.insert(config.find("\"max_position_embeddings\""), types);
  EXPECT_EQ(SpecOrDie(config, 0).sliding_window, 0);
  EXPECT_EQ(SpecOrDie(config, 5).sliding_window, 512);

  std::string chunked = config;
  chunked.replace(chunked.find("\"full_attention\""), 16, "\"chunked_attention\"");
  ExpectRefused(chunked, 0, "layer_types[0]");
  std::string short_list = kGemma3;
  short_list.insert(short_list.find("\"max_position_embeddings\""),
                    "\"layer_types\": [\"full_attention\"], ");
  ExpectRefused(short_list, 0, "layer_types");
}

// microsoft/Phi-3-mini-4k-instruct (auto_map trimmed to one entry).
constexpr char kPhi3[] = R"({
  "_name_or_path": "Phi-3-mini-4k-instruct", "architectures": ["Phi3ForCausalLM"],
  "attention_bias": false, "attention_dropout": 0.0,
  "auto_map": {"AutoConfig": "configuration_phi3.Phi3Config"}, "bos_token_id": 1,
  "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu", "hidden_size": 3072,
  "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 4096,
  "model_type": "phi3", "num_attention_heads": 32, "num_hidden_layers": 32,
  "num_key_value_heads": 32, "original_max_position_embeddings": 4096, "pad_token_id": 32000,
  "resid_pdrop": 0.0, "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 10000.0,
  "sliding_window": 2047, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.40.2", "use_cache": true, "vocab_size": 32064})";

TEST(HfConfigTest, Phi3) {
  const LayerSpec spec = SpecOrDie(kPhi3, 3);
  EXPECT_EQ(spec.variant, AttentionVariant::kMHA);
  EXPECT_EQ(spec.head_dim, 96);
  EXPECT_EQ(spec.sliding_window, 2047);
  EXPECT_EQ(spec.rotary_dim, 0);

  std::string partial = kPhi3;  // Phi-4-mini style.
  partial.insert(partial.find("\"pad_token_id\""), "\"partial_rotary_factor\": 0.75, ");
  EXPECT_EQ(SpecOrDie(partial, 0).rotary_dim, 72);

  std::string longrope = kPhi3;  // Phi-3-mini-128k.
  longrope.replace(longrope.find("\"rope_scaling\": null"), 20,
                   R"("rope_scaling": {"type": "longrope", "long_factor": [1.0],)"
                   R"( "short_factor": [1.0]})");
  ExpectRefused(longrope, 0, "longrope");
}

// A DeepSeek-V3-shaped config in bf16 (the released one is fp8, refused below).
constexpr char kDeepseekV3[] = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3,
  "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02,
  "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 163840,
  "model_type": "deepseek_v3", "moe_intermediate_size": 2048, "moe_layer_freq": 1,
  "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": true,
  "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
  "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536,
  "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                   "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                   "type": "yarn"},
  "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
  "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc",
  "torch_dtype": "bfloat16", "transformers_version": "4.33.1", "use_cache": true,
  "v_head_dim": 128, "vocab_size": 129280})";

// bigscience/bloom-560m config.json (Megatron-DeepSpeed's switches included).
constexpr char kBloom560m[] = R"({
  "apply_residual_connection_post_layernorm": false, "architectures": ["BloomForCausalLM"],
  "attention_dropout": 0.0, "attention_softmax_in_fp32": true, "bias_dropout_fusion": true,
  "bos_token_id": 1, "eos_token_id": 2, "hidden_dropout": 0.0, "hidden_size": 1024,
  "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "masked_softmax_fusion": true,
  "model_type": "bloom", "n_head": 16, "n_inner": null, "n_layer": 24, "offset_alibi": 100,
  "pad_token_id": 3, "pretraining_tp": 1, "skip_bias_add": true, "skip_bias_add_qkv": false,
  "slow_but_exact": false, "transformers_version": "4.21.0.dev0", "unk_token_id": 0,
  "use_cache": true, "vocab_size": 250880})";

// After mosaicml/mpt-7b's config.json (MosaicML's own MPTConfig keys).
constexpr char kMpt7b[] = R"({
  "architectures": ["MPTForCausalLM"],
  "attn_config": {"alibi": true, "alibi_bias_max": 8, "attn_impl": "torch", "attn_pdrop": 0,
                  "attn_type": "multihead_attention", "attn_uses_sequence_id": false,
                  "clip_qkv": null, "prefix_lm": false, "qk_ln": false, "softmax_scale": null},
  "auto_map": {"AutoConfig": "configuration_mpt.MPTConfig"},
  "d_model": 4096, "emb_pdrop": 0, "embedding_fraction": 1.0, "expansion_ratio": 4,
  "init_config": {"fan_mode": "fan_in", "init_nonlinearity": "relu", "name": "kaiming_normal_"},
  "init_device": "cpu", "learned_pos_emb": true, "logit_scale": null, "max_seq_len": 2048,
  "model_type": "mpt", "n_heads": 32, "n_layers": 32, "no_bias": true,
  "norm_type": "low_precision_layernorm", "resid_pdrop": 0,
  "tokenizer_name": "EleutherAI/gpt-neox-20b", "torch_dtype": "bfloat16",
  "transformers_version": "4.28.1", "use_cache": false, "verbose": 0, "vocab_size": 50432})";

TEST(HfConfigTest, BloomAndMptAreAlibiMha) {
  const LayerSpec bloom = SpecOrDie(kBloom560m, 23);
  EXPECT_EQ(bloom.variant, AttentionVariant::kMHA);
  EXPECT_EQ(bloom.num_heads, 16);
  EXPECT_EQ(bloom.head_dim, 64);
  EXPECT_TRUE(bloom.qkv_bias && bloom.o_bias);
  EXPECT_EQ(bloom.rope, RopeLayout::kNone);
  EXPECT_EQ(bloom.alibi, Alibi::kBloom);
  EXPECT_EQ(bloom.softmax_scale, 0.0f);
  ExpectRefused(kBloom560m, 24, "num_hidden_layers");

  const LayerSpec mpt = SpecOrDie(kMpt7b, 0);
  EXPECT_EQ(mpt.variant, AttentionVariant::kMHA);
  EXPECT_EQ(mpt.num_heads, 32);
  EXPECT_EQ(mpt.head_dim, 128);
  EXPECT_FALSE(mpt.qkv_bias || mpt.o_bias);
  EXPECT_EQ(mpt.alibi, Alibi::kMpt);
  EXPECT_EQ(mpt.alibi_bias_max, 8.0f);
  EXPECT_EQ(NumHiddenLayersFromHfConfig(kMpt7b).value_or(0), 32);

  // Switches transformers ignores but MosaicML's model honours, and a clamp it does not compute.
  for (const auto& [from, to, key] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"\"alibi_bias_max\": 8", "\"alibi_bias_max\": 16", "alibi_bias_max"},
           {"\"qk_ln\": false", "\"qk_ln\": true", "qk_ln"},
           {"\"alibi\": true", "\"alibi\": false", "attn_config.alibi"},
           {"\"clip_qkv\": null", "\"clip_qkv\": 6", "clip_qkv"},
           {"\"no_bias\": true", "\"no_bias\": false", "no_bias"},
           {"multihead_attention", "multiquery_attention", "attn_type"},
           {"\"prefix_lm\": false", "\"prefix_lm\": false, \"rope\": true", "rope"}}) {
    std::string changed = kMpt7b;
    changed.replace(changed.find(from), from.size(), to);
    ExpectRefused(changed, 0, key);
  }
  std::string scaled = kMpt7b;
  scaled.replace(scaled.find("\"softmax_scale\": null"), 21, "\"softmax_scale\": 0.25");
  EXPECT_EQ(SpecOrDie(scaled, 0).softmax_scale, 0.25f);
}

TEST(HfConfigTest, DeepseekV3) {
  const LayerSpec spec = SpecOrDie(kDeepseekV3, 60);
  EXPECT_EQ(spec.variant, AttentionVariant::kMLA);
  EXPECT_EQ(spec.num_heads, 128);
  EXPECT_EQ(spec.mla.q_lora_rank, 1536);
  EXPECT_EQ(spec.mla.kv_lora_rank, 512);
  EXPECT_EQ(spec.mla.qk_rope_head_dim, 64);
  EXPECT_EQ(spec.rope, RopeLayout::kInterleaved);
  EXPECT_EQ(spec.rope_scaling.type, RopeScalingType::kYarn);
  EXPECT_EQ(spec.rope_scaling.factor, 40.0);
  EXPECT_EQ(spec.rope_scaling.mscale_all_dim, 1.0);
  EXPECT_EQ(spec.softmax_scale, 0.0f);  // The MLA default, mscale^2 included.
  EXPECT_EQ(KvScalarsPerToken(spec), 576);

  std::string fp8 = kDeepseekV3;
  fp8.insert(fp8.find("\"rope_scaling\""),
             R"("quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",)"
             R"( "quant_method": "fp8", "weight_block_size": [128, 128]}, )");
  ExpectRefused(fp8, 0, "quantization_config");
}

TEST(HfConfigTest, Refusals) {
  ExpectRefused(kLlama31, 32, "num_hidden_layers = 32");
  ExpectRefused(kLlama31, -1, "layer index");
  std::string unknown = kLlama31;
  unknown.insert(unknown.find("\"vocab_size\""), "\"use_qk_norm\": true, ");
  ExpectRefused(unknown, 0, "use_qk_norm");
  std::string dynamic = kLlama31;
  dynamic.replace(dynamic.find("\"rope_type\": \"llama3\""), 21, "\"rope_type\": \"dynamic\"");
  ExpectRefused(dynamic, 0, "dynamic");
  std::string extra_rope_key = kLlama31;
  extra_rope_key.replace(extra_rope_key.find("\"rope_type\": \"llama3\""), 21,
                         "\"rope_type\": \"llama3\", \"beta_fast\": 4");
  ExpectRefused(extra_rope_key, 0, "beta_fast");
  std::string other = kLlama31;
  other.replace(other.find("\"model_type\": \"llama\""), 21, "\"model_type\": \"falcon\"");
  ExpectRefused(other, 0, "falcon");
  std::string bidirectional = kGemma3;
  bidirectional.insert(bidirectional.find("\"vocab_size\""),
                       "\"use_bidirectional_attention\": true, ");
  ExpectRefused(bidirectional, 0, "use_bidirectional_attention");
  std::string wrong_type = kLlama31;
  wrong_type.replace(wrong_type.find("\"num_key_value_heads\": 8"), 24,
                     "\"num_key_value_heads\": \"8\"");
  ExpectRefused(wrong_type, 0, "num_key_value_heads");
  ExpectRefused("{not json", 0, "not valid JSON");
  ExpectRefused("[]", 0, "expected an object");
}

// openai/gpt-oss-20b: sinks, biases everywhere, alternating windows of 128, untruncated YaRN; the
// experts are mxfp4 but attention is left unquantized (modules_to_not_convert).
std::string GptOss20b() {
  std::string types;
  for (int i = 0; i < 24; ++i) {
    types += absl::StrCat(i == 0 ? "" : ", ", i % 2 == 0 ? "\"sliding_attention\"" : "\"full_attention\"");
  }
  return absl::StrCat(R"({
  "architectures": ["GptOssForCausalLM"], "attention_bias": true, "attention_dropout": 0.0,
  "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02,
  "intermediate_size": 2880, "layer_types": [)", types, R"(],
  "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64,
  "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8,
  "num_local_experts": 32, "output_router_logits": false, "pad_token_id": 199999,
  "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn",
      "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
  "rms_norm_eps": 1e-05,
  "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                   "original_max_position_embeddings": 4096, "rope_type": "yarn",
                   "truncate": false},
  "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128,
  "swiglu_limit": 7.0, "tie_word_embeddings": false, "transformers_version": "4.55.0.dev0",
  "use_cache": true, "vocab_size": 201088})");
}

TEST(HfConfigTest, GptOss) {
  const LayerSpec sliding = SpecOrDie(GptOss20b(), 0);
  const LayerSpec full = SpecOrDie(GptOss20b(), 23);
  EXPECT_EQ(sliding.sliding_window, 128);
  EXPECT_EQ(full.sliding_window, 0);
  EXPECT_TRUE(full.attention_sinks);
  EXPECT_TRUE(full.qkv_bias);
  EXPECT_TRUE(full.o_bias);
  EXPECT_EQ(full.num_heads, 64);
  EXPECT_EQ(full.num_kv_heads, 8);
  EXPECT_EQ(full.head_dim, 64);
  EXPECT_EQ(full.rope_scaling.type, RopeScalingType::kYarn);
  EXPECT_FALSE(full.rope_scaling.truncate);
  EXPECT_EQ(full.rope_scaling.factor, 32.0);

  std::string quantized_attention = GptOss20b();
  quantized_attention.replace(quantized_attention.find("\"model.layers.*.self_attn\","), 27, "");
  ExpectRefused(quantized_attention, 0, "quantization_config");
}

// An OLMo 2 7B config.json (allenai/OLMo-2-1124-7B's keys and sizes; written here from the
// release's published sizes, not copied from the Hub file: this machine has no network).
constexpr char kOlmo2[] = R"({
  "architectures": ["Olmo2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "eos_token_id": 100257, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 11008, "max_position_embeddings": 4096, "model_type": "olmo2",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
  "pad_token_id": 100277, "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 500000,
  "tie_word_embeddings": false, "torch_dtype": "float32", "transformers_version": "4.47.0.dev0",
  "use_cache": true, "vocab_size": 100352})";

TEST(HfConfigTest, Olmo2NormsQAndKAcrossHeads) {
  const LayerSpec spec = SpecOrDie(kOlmo2, 31);
  EXPECT_EQ(spec.variant, AttentionVariant::kMHA);
  EXPECT_EQ(spec.num_heads, 32);
  EXPECT_EQ(spec.num_kv_heads, 32);
  EXPECT_EQ(spec.head_dim, 128);
  EXPECT_EQ(spec.qk_norm, QkNorm::kRmsAcrossHeads);
  EXPECT_EQ(spec.qk_norm_eps, 1e-6f);  // rms_norm_eps: Olmo2Attention's q_norm and k_norm.
  EXPECT_EQ(spec.rope_theta, 500000.0);
  EXPECT_EQ(spec.rope_scaling.type, RopeScalingType::kNone);
  EXPECT_EQ(spec.sliding_window, 0);
  EXPECT_FALSE(spec.qkv_bias || spec.o_bias);

  // Absent rms_norm_eps: Olmo2Config's 1e-5; null: Olmo2RMSNorm cannot use None.
  std::string absent_eps = kOlmo2;
  absent_eps.replace(absent_eps.find("\"rms_norm_eps\": 1e-06, "), 23, "");
  EXPECT_EQ(SpecOrDie(absent_eps, 0).qk_norm_eps, 1e-5f);
  std::string null_eps = kOlmo2;
  null_eps.replace(null_eps.find("1e-06"), 5, "null");
  ExpectRefused(null_eps, 0, "rms_norm_eps");
  // Olmo2Config takes {"type", "factor"} with linear (or dynamic, refused for every family).
  std::string linear = kOlmo2;
  linear.replace(linear.find("\"rope_scaling\": null"), 20,
                 R"("rope_scaling": {"type": "linear", "factor": 2.0})");
  EXPECT_EQ(SpecOrDie(linear, 0).rope_scaling.type, RopeScalingType::kLinear);
  std::string yarn = kOlmo2;
  yarn.replace(yarn.find("\"rope_scaling\": null"), 20,
               R"("rope_scaling": {"rope_type": "yarn", "factor": 4.0})");
  ExpectRefused(yarn, 0, "Olmo2Config accepts only linear or dynamic");
  // Keys OLMo 2's attention does not have are refused by name.
  std::string window = kOlmo2;
  window.insert(window.find("\"tie_word_embeddings\""), "\"sliding_window\": 4096, ");
  ExpectRefused(window, 0, "sliding_window");
  std::string head_dim = kOlmo2;
  head_dim.insert(head_dim.find("\"tie_word_embeddings\""), "\"head_dim\": null, ");
  ExpectRefused(head_dim, 0, "head_dim");
}

// A Command R+ config.json (CohereForAI/c4ai-command-r-plus's keys and sizes, written here from the
// release's published sizes, not copied from the Hub file: this machine has no network).
constexpr char kCommandRPlus[] = R"({
  "architectures": ["CohereForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 5, "eos_token_id": 255001, "hidden_act": "silu", "hidden_size": 12288,
  "initializer_range": 0.02, "intermediate_size": 33792, "layer_norm_eps": 1e-05,
  "logit_scale": 0.8333333333333334, "max_position_embeddings": 8192, "model_type": "cohere",
  "num_attention_heads": 96, "num_hidden_layers": 64, "num_key_value_heads": 8,
  "pad_token_id": 0, "rope_theta": 75000000.0, "torch_dtype": "float16",
  "transformers_version": "4.40.0.dev0", "use_cache": true, "use_qk_norm": true,
  "vocab_size": 256000})";

TEST(HfConfigTest, CohereNormsQAndKPerHeadWithLayerNorm) {
  const LayerSpec spec = SpecOrDie(kCommandRPlus, 63);
  EXPECT_EQ(spec.variant, AttentionVariant::kGQA);
  EXPECT_EQ(spec.num_heads, 96);
  EXPECT_EQ(spec.num_kv_heads, 8);
  EXPECT_EQ(spec.head_dim, 128);  // hidden_size / num_attention_heads.
  EXPECT_EQ(spec.qk_norm, QkNorm::kLayerNorm);
  EXPECT_EQ(spec.qk_norm_eps, 1e-5f);  // layer_norm_eps: CohereAttention's q_norm and k_norm.
  EXPECT_EQ(spec.rope, RopeLayout::kInterleaved);  // Cohere's rotate_half pairs (2i, 2i + 1).
  EXPECT_EQ(spec.rope_theta, 75000000.0);
  EXPECT_EQ(spec.rope_scaling.type, RopeScalingType::kNone);
  EXPECT_EQ(spec.sliding_window, 0);
  EXPECT_EQ(spec.softmax_scale, 0.0f);
  EXPECT_FALSE(spec.qkv_bias || spec.o_bias);

  // Command R (use_qk_norm false, or absent: CohereConfig's default): no q/k norm, and
  // layer_norm_eps is only the block's.
  std::string plain = kCommandRPlus;
  plain.replace(plain.find("\"use_qk_norm\": true"), 19, "\"use_qk_norm\": false");
  EXPECT_EQ(SpecOrDie(plain, 0).qk_norm, QkNorm::kNone);
  std::string absent = kCommandRPlus;
  absent.replace(absent.find(", \"use_qk_norm\": true"), 21, "");
  EXPECT_EQ(SpecOrDie(absent, 0).qk_norm, QkNorm::kNone);
  std::string null_eps_plain = plain;
  null_eps_plain.replace(null_eps_plain.find("1e-05"), 5, "null");
  EXPECT_EQ(SpecOrDie(null_eps_plain, 0).qk_norm, QkNorm::kNone);
  // Absent layer_norm_eps: CohereConfig's 1e-5; null: CohereLayerNorm cannot use None.
  std::string absent_eps = kCommandRPlus;
  const std::string eps_key = "\"layer_norm_eps\": 1e-05,";
  absent_eps.replace(absent_eps.find(eps_key), eps_key.size(), "");
  EXPECT_EQ(SpecOrDie(absent_eps, 0).qk_norm_eps, 1e-5f);
  std::string null_eps = kCommandRPlus;
  null_eps.replace(null_eps.find("1e-05"), 5, "null");
  ExpectRefused(null_eps, 0, "layer_norm_eps");
  // attention_bias: every projection, o_proj included.
  std::string bias = kCommandRPlus;
  bias.replace(bias.find("\"attention_bias\": false"), 23, "\"attention_bias\": true");
  EXPECT_TRUE(SpecOrDie(bias, 0).qkv_bias && SpecOrDie(bias, 0).o_bias);
  // num_key_value_heads null: CohereConfig makes it num_attention_heads.
  std::string mha = kCommandRPlus;
  mha.replace(mha.find("\"num_key_value_heads\": 8"), 24, "\"num_key_value_heads\": null");
  EXPECT_EQ(SpecOrDie(mha, 0).variant, AttentionVariant::kMHA);
  // RoPE scaling goes through the shared rules; keys Cohere's attention does not read are refused
  // by name (its RoPE rotates whole heads and it has no window).
  std::string linear = kCommandRPlus;
  linear.insert(linear.find("\"rope_theta\""),
                R"("rope_scaling": {"rope_type": "linear", "factor": 2.0}, )");
  EXPECT_EQ(SpecOrDie(linear, 0).rope_scaling.type, RopeScalingType::kLinear);
  for (const std::string key : {"partial_rotary_factor", "sliding_window", "qk_layernorm"}) {
    std::string extra = kCommandRPlus;
    extra.insert(extra.find("\"torch_dtype\""), "\"" + key + "\": 1, ");
    ExpectRefused(extra, 0, key);
  }
}

// A StableLM 2 12B config.json (stabilityai/stablelm-2-12b's keys and sizes, written here from the
// release's published sizes, not copied from the Hub file: this machine has no network).
constexpr char kStableLm2[] = R"({
  "architectures": ["StableLmForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 100257,
  "eos_token_id": 100257, "hidden_act": "silu", "hidden_dropout": 0.0, "hidden_size": 5120,
  "initializer_range": 0.01, "intermediate_size": 13824, "layer_norm_eps": 1e-05,
  "max_position_embeddings": 4096, "model_type": "stablelm", "num_attention_heads": 32,
  "num_hidden_layers": 40, "num_key_value_heads": 8, "partial_rotary_factor": 0.25,
  "qk_layernorm": true, "rope_scaling": null, "rope_theta": 10000, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.40.0.dev0", "use_cache": true,
  "use_parallel_residual": true, "use_qkv_bias": false, "vocab_size": 100352})";

TEST(HfConfigTest, StableLm2NormsQAndKPerHeadWithLayerNorm) {
  const LayerSpec spec = SpecOrDie(kStableLm2, 39);
  EXPECT_EQ(spec.variant, AttentionVariant::kGQA);
  EXPECT_EQ(spec.num_heads, 32);
  EXPECT_EQ(spec.num_kv_heads, 8);
  EXPECT_EQ(spec.head_dim, 160);   // hidden_size / num_attention_heads.
  EXPECT_EQ(spec.rotary_dim, 40);  // partial_rotary_factor 0.25.
  EXPECT_EQ(spec.qk_norm, QkNorm::kLayerNorm);
  EXPECT_EQ(spec.qk_norm_eps, 1e-5f);  // layer_norm_eps: StableLmLayerNormPerHead's.
  EXPECT_EQ(spec.rope, RopeLayout::kHalf);
  EXPECT_EQ(spec.rope_theta, 10000.0);
  EXPECT_EQ(spec.softmax_scale, 0.0f);
  EXPECT_FALSE(spec.qkv_bias || spec.o_bias);

  // stablelm-2-1_6b's attention: no q/k norm, q/k/v biases (never on o_proj).
  std::string small = kStableLm2;
  small.replace(small.find("\"qk_layernorm\": true"), 20, "\"qk_layernorm\": false");
  small.replace(small.find("\"use_qkv_bias\": false"), 21, "\"use_qkv_bias\": true");
  const LayerSpec plain = SpecOrDie(small, 0);
  EXPECT_EQ(plain.qk_norm, QkNorm::kNone);
  EXPECT_TRUE(plain.qkv_bias);
  EXPECT_FALSE(plain.o_bias);
  // Absent partial_rotary_factor: StableLmConfig's 0.25.
  std::string absent_partial = kStableLm2;
  const std::string partial_key = "\"partial_rotary_factor\": 0.25,";
  absent_partial.replace(absent_partial.find(partial_key), partial_key.size(), "");
  EXPECT_EQ(SpecOrDie(absent_partial, 0).rotary_dim, 40);
  // num_key_value_heads null: StableLmConfig keeps None, which StableLmAttention cannot use.
  std::string null_kv = kStableLm2;
  null_kv.replace(null_kv.find("\"num_key_value_heads\": 8"), 24, "\"num_key_value_heads\": null");
  ExpectRefused(null_kv, 0, "num_key_value_heads");
  // head_dim: StableLmAttention uses hidden_size / num_attention_heads whatever it says.
  std::string head_dim = kStableLm2;
  head_dim.insert(head_dim.find("\"torch_dtype\""), "\"head_dim\": 128, ");
  ExpectRefused(head_dim, 0, "head_dim");
  std::string window = kStableLm2;
  window.insert(window.find("\"torch_dtype\""), "\"sliding_window\": 4096, ");
  ExpectRefused(window, 0, "sliding_window");
}

// HuggingFaceTB/SmolLM2-135M-Instruct: a nanotron export with keys transformers' LlamaConfig does
// not declare (is_llama_config, rope_interleaved, transformers.js_config) next to its own.
constexpr char kSmolLm2[] = R"({
  "_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct", "architectures": ["LlamaForCausalLM"],
  "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 576, "initializer_range": 0.041666666666666664,
  "intermediate_size": 1536, "is_llama_config": true, "max_position_embeddings": 8192,
  "mlp_bias": false, "model_type": "llama", "num_attention_heads": 9, "num_hidden_layers": 30,
  "num_key_value_heads": 3, "pad_token_id": 2, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_interleaved": false, "rope_scaling": null, "rope_theta": 100000,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers.js_config": {"kv_cache_dtype": {"q4f16": "float16", "fp16": "float16"}},
  "transformers_version": "4.42.3", "unk_token_id": 0, "use_cache": true, "vocab_size": 49152})";

TEST(HfConfigTest, SmolLm2Loads) {
  const LayerSpec spec = SpecOrDie(kSmolLm2, 29);
  EXPECT_EQ(spec.variant, AttentionVariant::kGQA);
  EXPECT_EQ(spec.d_model, 576);
  EXPECT_EQ(spec.num_heads, 9);
  EXPECT_EQ(spec.num_kv_heads, 3);
  EXPECT_EQ(spec.head_dim, 64);
  EXPECT_EQ(spec.rope, RopeLayout::kHalf);
  EXPECT_EQ(spec.rope_theta, 100000.0);
  EXPECT_EQ(spec.rope_scaling.type, RopeScalingType::kNone);
  EXPECT_EQ(spec.sliding_window, 0);
  EXPECT_FALSE(spec.qkv_bias);

  std::string interleaved = kSmolLm2;  // Pairs (2i, 2i + 1): not what transformers' Llama does.
  interleaved.replace(interleaved.find("\"rope_interleaved\": false"), 25,
                      "\"rope_interleaved\": true");
  ExpectRefused(interleaved, 0, "rope_interleaved");
  std::string tp = kSmolLm2;  // Llama-2's slicing: transformers 4.57 no longer reads it.
  tp.replace(tp.find("\"pretraining_tp\": 1"), 19, "\"pretraining_tp\": 2");
  EXPECT_EQ(LayerSpecDifference(SpecOrDie(tp, 0), SpecOrDie(kSmolLm2, 0)), "");
}

std::string WithKey(const std::string& config, const std::string& key_and_value) {
  std::string out = config;
  out.insert(out.find("\"vocab_size\""), key_and_value + ", ");
  return out;
}

TEST(HfConfigTest, HarmlessKeysAcceptedAttentionKeysRefusedByName) {
  const LayerSpec plain = SpecOrDie(kLlama31, 0);
  for (const char* harmless :
       {R"("_foo": {"anything": 1})", R"("_commit_hash": "abc")", R"("unk_token_id": 0)",
        R"("sep_token_id": 3)", R"("attention_dropout": 0.1)", R"("mlp_bias": true)",
        R"("initializer_range": 0.5)", R"("cache_implementation": "static")",
        R"("final_logit_softcapping": 30.0)"}) {
    SCOPED_TRACE(harmless);
    const std::string config = WithKey(std::string(kLlama31), harmless);
    EXPECT_EQ(LayerSpecDifference(SpecOrDie(config, 0), plain), "");
  }
  // Keys Llama does not read but that would change attention somewhere: refused by name.
  ExpectRefused(WithKey(kLlama31, R"("attn_logit_softcapping": 50.0)"), 0,
                "attn_logit_softcapping");
  ExpectRefused(WithKey(kLlama31, R"("attention_multiplier": 0.015625)"), 0,
                "attention_multiplier");
  ExpectRefused(WithKey(kLlama31, R"("query_pre_attn_scalar": 144)"), 0, "query_pre_attn_scalar");
  ExpectRefused(WithKey(kLlama31, R"("sliding_window": 4096)"), 0, "sliding_window");
  // Inside rope_scaling every key must be read: the accepted list is for the top level only.
  std::string nested = kLlama31;
  nested.replace(nested.find("\"rope_type\": \"llama3\""), 21,
                 "\"rope_type\": \"llama3\", \"bos_token_id\": 1");
  ExpectRefused(nested, 0, "bos_token_id");
}

// Absent keys are the config class's defaults (tests/engine/hf_config_defaults_test.cc checks
// every key of every family against transformers; these are the ones that were wrong before).
TEST(HfConfigTest, AbsentKeysTakeTheConfigClassDefaults) {
  auto without = [](std::string config, const std::string& key_and_value) {
    const size_t at = config.find(key_and_value);
    EXPECT_NE(at, std::string::npos) << key_and_value;
    config.erase(at, key_and_value.size());
    return config;
  };
  // Gemma2Config: attn_logit_softcapping 50; null is none.
  std::string gemma2 = kGemma2;
  gemma2.replace(gemma2.find("\"attn_logit_softcapping\": 50.0"), 30,
                 "\"attn_logit_softcapping\": 20.0");
  EXPECT_EQ(SpecOrDie(gemma2, 0).attn_logit_softcapping, 20.0f);
  EXPECT_EQ(SpecOrDie(without(gemma2, "\"attn_logit_softcapping\": 20.0,"), 0)
                .attn_logit_softcapping, 50.0f);
  gemma2.replace(gemma2.find("\"attn_logit_softcapping\": 20.0"), 30,
                 "\"attn_logit_softcapping\": null");
  EXPECT_EQ(SpecOrDie(gemma2, 0).attn_logit_softcapping, 0.0f);
  // query_pre_attn_scalar 256 and rope_theta 10000 (Gemma 2).
  const LayerSpec no_scalar =
      SpecOrDie(without(kGemma2, "\"query_pre_attn_scalar\": 256,"), 0);
  EXPECT_EQ(no_scalar.softmax_scale, 0.0f);
  EXPECT_EQ(SpecOrDie(without(kGemma2, "\"rope_theta\": 10000.0,"), 0).rope_theta, 10000.0);
  // Llama: rope_theta 10000.
  EXPECT_EQ(SpecOrDie(without(kLlama31, "\"rope_theta\": 500000.0,"), 0).rope_theta, 10000.0);
  // GptOssConfig: YaRN factor 32 over 4096 positions, untruncated; null is plain RoPE.
  std::string gpt_oss = GptOss20b();
  const size_t from = gpt_oss.find("\"rope_scaling\"");
  const size_t to = gpt_oss.find("\"rope_theta\"");
  gpt_oss.erase(from, to - from);
  const LayerSpec defaulted = SpecOrDie(gpt_oss, 1);
  EXPECT_EQ(defaulted.rope_scaling.type, RopeScalingType::kYarn);
  EXPECT_EQ(defaulted.rope_scaling.factor, 32.0);
  EXPECT_EQ(defaulted.rope_scaling.original_max_position_embeddings, 4096);
  EXPECT_FALSE(defaulted.rope_scaling.truncate);
  EXPECT_EQ(LayerSpecDifference(defaulted, SpecOrDie(GptOss20b(), 1)), "");
  gpt_oss.insert(gpt_oss.find("\"rope_theta\""), "\"rope_scaling\": null, ");
  EXPECT_EQ(SpecOrDie(gpt_oss, 1).rope_scaling.type, RopeScalingType::kNone);
  // Qwen3Config: head_dim 128, whatever hidden_size / num_attention_heads is.
  std::string qwen3 = kQwen3;
  qwen3.replace(qwen3.find("\"hidden_size\": 4096"), 19, "\"hidden_size\": 2048");
  EXPECT_EQ(SpecOrDie(without(qwen3, "\"head_dim\": 128,"), 0).head_dim, 128);
  // DeepSeek: q_lora_rank 1536 when absent, none when null.
  EXPECT_EQ(SpecOrDie(without(kDeepseekV3, "\"q_lora_rank\": 1536,"), 0).mla.q_lora_rank, 1536);
  std::string no_q_lora = kDeepseekV3;
  no_q_lora.replace(no_q_lora.find("\"q_lora_rank\": 1536"), 19, "\"q_lora_rank\": null");
  EXPECT_EQ(SpecOrDie(no_q_lora, 0).mla.q_lora_rank, 0);
  // null where transformers cannot use None: refused, naming the key.
  std::string null_theta = kLlama31;
  null_theta.replace(null_theta.find("\"rope_theta\": 500000.0"), 22, "\"rope_theta\": null");
  ExpectRefused(null_theta, 0, "rope_theta: null");
}

TEST(HfConfigTest, DifferenceNamesTheField) {
  const LayerSpec a = SpecOrDie(kGemma3, 4);
  EXPECT_EQ(LayerSpecDifference(a, a), "");
  const LayerSpec b = SpecOrDie(kGemma3, 5);
  EXPECT_THAT(LayerSpecDifference(a, b), HasSubstr("rope_theta"));
  LayerSpec c = a;
  c.rope_scaling.type = RopeScalingType::kLinear;
  c.rope_scaling.factor = 2;
  EXPECT_THAT(LayerSpecDifference(a, c), HasSubstr("rope_scaling"));
}

}  // namespace
}  // namespace attnserve
