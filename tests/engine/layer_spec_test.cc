// LayerSpec validation, its size arithmetic, and its JSON form.
#include "kernels/spec/layer_spec.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/spec/layer_spec_json.h"

namespace attnserve {
namespace {

using ::testing::HasSubstr;

LayerSpec Gqa() {
  LayerSpec spec;
  spec.variant = AttentionVariant::kGQA;
  spec.d_model = 512;
  spec.num_heads = 8;
  spec.num_kv_heads = 2;
  spec.head_dim = 64;
  spec.rope = RopeLayout::kHalf;
  return spec;
}

LayerSpec Mha512() {
  LayerSpec spec;
  spec.variant = AttentionVariant::kMHA;
  spec.d_model = 512;
  spec.num_heads = 8;
  spec.num_kv_heads = 8;
  spec.head_dim = 64;
  return spec;
}

// DeepSeek-V3 (671B) attention: config.json of deepseek-ai/DeepSeek-V3.
LayerSpec DeepSeekV3() {
  LayerSpec spec;
  spec.variant = AttentionVariant::kMLA;
  spec.d_model = 7168;
  spec.num_heads = 128;
  spec.rope = RopeLayout::kInterleaved;
  spec.mla = {.q_lora_rank = 1536,
              .kv_lora_rank = 512,
              .qk_nope_head_dim = 128,
              .qk_rope_head_dim = 64,
              .v_head_dim = 128,
              .rms_norm_eps = 1e-6f};
  return spec;
}

// Qwen3-8B attention (config.json of Qwen/Qwen3-8B): per-head RMSNorm of q and k.
LayerSpec Qwen3() {
  LayerSpec spec = Gqa();
  spec.d_model = 4096;
  spec.num_heads = 32;
  spec.num_kv_heads = 8;
  spec.head_dim = 128;
  spec.rope_theta = 1000000.0;
  spec.qk_norm = QkNorm::kRms;
  return spec;
}

// Gemma-2-9B attention: head_dim 256, query_pre_attn_scalar 256, soft-capping 50, window 4096.
LayerSpec Gemma2() {
  LayerSpec spec = Gqa();
  spec.d_model = 3584;
  spec.num_heads = 16;
  spec.num_kv_heads = 8;
  spec.head_dim = 256;
  spec.softmax_scale = 0.0625f;
  spec.attn_logit_softcapping = 50.0f;
  spec.sliding_window = 4096;
  return spec;
}

// gpt-oss-20b attention: learned sinks, biases on q/k/v/o, head_dim 64.
LayerSpec GptOss() {
  LayerSpec spec = Gqa();
  spec.d_model = 2880;
  spec.num_heads = 64;
  spec.num_kv_heads = 8;
  spec.head_dim = 64;
  spec.qkv_bias = true;
  spec.o_bias = true;
  spec.attention_sinks = true;
  return spec;
}

void ExpectSameSpec(const LayerSpec& a, const LayerSpec& b) {
  EXPECT_EQ(a.variant, b.variant);
  EXPECT_EQ(a.d_model, b.d_model);
  EXPECT_EQ(a.num_heads, b.num_heads);
  EXPECT_EQ(a.num_kv_heads, b.num_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.qkv_bias, b.qkv_bias);
  EXPECT_EQ(a.o_bias, b.o_bias);
  EXPECT_EQ(a.rope, b.rope);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.causal, b.causal);
  EXPECT_EQ(a.sliding_window, b.sliding_window);
  EXPECT_EQ(a.softmax_scale, b.softmax_scale);
  EXPECT_EQ(a.rope_scaling.type, b.rope_scaling.type);
  EXPECT_EQ(a.rope_scaling.factor, b.rope_scaling.factor);
  EXPECT_EQ(a.rope_scaling.original_max_position_embeddings,
            b.rope_scaling.original_max_position_embeddings);
  EXPECT_EQ(a.rope_scaling.low_freq_factor, b.rope_scaling.low_freq_factor);
  EXPECT_EQ(a.rope_scaling.high_freq_factor, b.rope_scaling.high_freq_factor);
  EXPECT_EQ(a.rope_scaling.beta_fast, b.rope_scaling.beta_fast);
  EXPECT_EQ(a.rope_scaling.beta_slow, b.rope_scaling.beta_slow);
  EXPECT_EQ(a.rope_scaling.mscale, b.rope_scaling.mscale);
  EXPECT_EQ(a.rope_scaling.mscale_all_dim, b.rope_scaling.mscale_all_dim);
  EXPECT_EQ(a.rotary_dim, b.rotary_dim);
  EXPECT_EQ(a.qk_norm, b.qk_norm);
  EXPECT_EQ(a.qk_norm_eps, b.qk_norm_eps);
  EXPECT_EQ(a.attn_logit_softcapping, b.attn_logit_softcapping);
  EXPECT_EQ(a.attention_sinks, b.attention_sinks);
  if (a.variant == AttentionVariant::kMLA) {
    EXPECT_EQ(a.mla.q_lora_rank, b.mla.q_lora_rank);
    EXPECT_EQ(a.mla.kv_lora_rank, b.mla.kv_lora_rank);
    EXPECT_EQ(a.mla.qk_nope_head_dim, b.mla.qk_nope_head_dim);
    EXPECT_EQ(a.mla.qk_rope_head_dim, b.mla.qk_rope_head_dim);
    EXPECT_EQ(a.mla.v_head_dim, b.mla.v_head_dim);
    EXPECT_EQ(a.mla.rms_norm_eps, b.mla.rms_norm_eps);
  }
}

// Expects INVALID_ARGUMENT whose message contains `field`.
void ExpectInvalid(const absl::Status& status, const std::string& field) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr(field));
}

// ---- ValidateLayerSpec --------------------------------------------------------------------------

TEST(ValidateLayerSpecTest, AcceptsKnownGoodSpecs) {
  EXPECT_TRUE(ValidateLayerSpec(Gqa()).ok());
  EXPECT_TRUE(ValidateLayerSpec(Mha512()).ok());
  EXPECT_TRUE(ValidateLayerSpec(DeepSeekV3()).ok());
  LayerSpec mqa = Gqa();
  mqa.variant = AttentionVariant::kMQA;
  mqa.num_kv_heads = 1;
  EXPECT_TRUE(ValidateLayerSpec(mqa).ok());
  LayerSpec window = Gqa();
  window.sliding_window = 4096;
  EXPECT_TRUE(ValidateLayerSpec(window).ok());
  LayerSpec odd_no_rope = Gqa();
  odd_no_rope.rope = RopeLayout::kNone;
  odd_no_rope.head_dim = 65;
  EXPECT_TRUE(ValidateLayerSpec(odd_no_rope).ok());
}

TEST(ValidateLayerSpecTest, AcceptsTheModelFamilyVariations) {
  EXPECT_TRUE(ValidateLayerSpec(Qwen3()).ok());
  EXPECT_TRUE(ValidateLayerSpec(Gemma2()).ok());
  EXPECT_TRUE(ValidateLayerSpec(GptOss()).ok());
  LayerSpec gemma3 = Gemma2();
  gemma3.attn_logit_softcapping = 0.0f;
  gemma3.qk_norm = QkNorm::kRmsUnitOffset;
  EXPECT_TRUE(ValidateLayerSpec(gemma3).ok());
  // Phi-4-mini: head_dim 128, partial_rotary_factor 0.75.
  LayerSpec phi4_mini = Gqa();
  phi4_mini.head_dim = 128;
  phi4_mini.rotary_dim = 96;
  EXPECT_TRUE(ValidateLayerSpec(phi4_mini).ok());
  LayerSpec whole = Gqa();
  whole.rotary_dim = whole.head_dim;  // The same as 0.
  EXPECT_TRUE(ValidateLayerSpec(whole).ok());
  EXPECT_EQ(RotaryDim(phi4_mini), 96);
  EXPECT_EQ(RotaryDim(whole), 64);
  LayerSpec interleaved = phi4_mini;
  interleaved.rope = RopeLayout::kInterleaved;
  EXPECT_TRUE(ValidateLayerSpec(interleaved).ok());
}

struct BadSpec {
  std::string name;
  LayerSpec spec;
  std::string field;  // Must appear in the error message.
};

std::vector<BadSpec> BadSpecs() {
  std::vector<BadSpec> cases;
  auto add = [&](std::string name, LayerSpec base, auto mutate, std::string field) {
    mutate(base);
    cases.push_back({std::move(name), base, std::move(field)});
  };
  add(
      "ZeroDModel", Gqa(), [](LayerSpec& s) { s.d_model = 0; }, "d_model");
  add(
      "NegativeDModel", Gqa(), [](LayerSpec& s) { s.d_model = -512; }, "d_model");
  add(
      "ZeroHeads", Gqa(), [](LayerSpec& s) { s.num_heads = 0; }, "num_heads");
  add(
      "ZeroHeadDim", Gqa(), [](LayerSpec& s) { s.head_dim = 0; }, "head_dim");
  add(
      "ZeroKvHeads", Gqa(), [](LayerSpec& s) { s.num_kv_heads = 0; }, "num_kv_heads");
  add(
      "MoreKvHeadsThanHeads", Gqa(), [](LayerSpec& s) { s.num_kv_heads = 16; }, "num_kv_heads");
  add(
      "KvHeadsNotDividingHeads", Gqa(), [](LayerSpec& s) { s.num_kv_heads = 3; }, "num_kv_heads");
  add(
      "MhaWithFewerKvHeads", Mha512(), [](LayerSpec& s) { s.num_kv_heads = 4; }, "num_kv_heads");
  add(
      "MqaWithTwoKvHeads", Gqa(),
      [](LayerSpec& s) {
        s.variant = AttentionVariant::kMQA;
        s.num_kv_heads = 2;
      },
      "num_kv_heads");
  add(
      "OddHeadDimWithHalfRope", Gqa(), [](LayerSpec& s) { s.head_dim = 65; }, "head_dim");
  add(
      "OddHeadDimWithInterleavedRope", Gqa(),
      [](LayerSpec& s) {
        s.head_dim = 63;
        s.rope = RopeLayout::kInterleaved;
      },
      "head_dim");
  add(
      "RopeThetaOne", Gqa(), [](LayerSpec& s) { s.rope_theta = 1.0; }, "rope_theta");
  add(
      "RopeThetaInfinite", Gqa(),
      [](LayerSpec& s) { s.rope_theta = std::numeric_limits<double>::infinity(); }, "rope_theta");
  // Unused without RoPE, but still refused: LayerSpecToJson would write it as null, which
  // LayerSpecFromJson rejects (found by tests/fuzz/spec_codec_fuzzer).
  add(
      "RopeThetaInfiniteWithoutRope", Gqa(),
      [](LayerSpec& s) {
        s.rope = RopeLayout::kNone;
        s.rope_theta = std::numeric_limits<double>::infinity();
      },
      "rope_theta");
  add(
      // The wire reads 0 as the default 10000, so a spec of 0 could not cross it unchanged.
      "RopeThetaZeroWithoutRope", Gqa(),
      [](LayerSpec& s) {
        s.rope = RopeLayout::kNone;
        s.rope_theta = 0.0;
      },
      "rope_theta");
  add(
      "NegativeWindow", Gqa(), [](LayerSpec& s) { s.sliding_window = -1; }, "sliding_window");
  add(
      "WindowWithoutCausal", Gqa(),
      [](LayerSpec& s) {
        s.sliding_window = 8;
        s.causal = false;
      },
      "sliding_window");
  add(
      "NegativeScale", Gqa(), [](LayerSpec& s) { s.softmax_scale = -0.125f; }, "softmax_scale");
  add(
      "NanScale", Gqa(),
      [](LayerSpec& s) { s.softmax_scale = std::numeric_limits<float>::quiet_NaN(); },
      "softmax_scale");
  add(
      "MlaZeroKvLoraRank", DeepSeekV3(), [](LayerSpec& s) { s.mla.kv_lora_rank = 0; },
      "mla.kv_lora_rank");
  add(
      "MlaNegativeQLoraRank", DeepSeekV3(), [](LayerSpec& s) { s.mla.q_lora_rank = -1; },
      "mla.q_lora_rank");
  add(
      "MlaZeroNopeDim", DeepSeekV3(), [](LayerSpec& s) { s.mla.qk_nope_head_dim = 0; },
      "mla.qk_nope_head_dim");
  add(
      "MlaZeroVDim", DeepSeekV3(), [](LayerSpec& s) { s.mla.v_head_dim = 0; }, "mla.v_head_dim");
  add(
      "MlaOddRopeDim", DeepSeekV3(), [](LayerSpec& s) { s.mla.qk_rope_head_dim = 63; },
      "mla.qk_rope_head_dim");
  add(
      "MlaZeroRopeDimWithRope", DeepSeekV3(), [](LayerSpec& s) { s.mla.qk_rope_head_dim = 0; },
      "mla.qk_rope_head_dim");
  add(
      "MlaZeroEps", DeepSeekV3(), [](LayerSpec& s) { s.mla.rms_norm_eps = 0.0f; },
      "mla.rms_norm_eps");
  add(
      "MlaWithBias", DeepSeekV3(), [](LayerSpec& s) { s.qkv_bias = true; }, "qkv_bias");
  add(
      "MlaWithWindowWithoutCausal", DeepSeekV3(),
      [](LayerSpec& s) {
        s.sliding_window = 16;
        s.causal = false;
      },
      "sliding_window");
  const auto llama3 = [](LayerSpec& s) {
    s.rope_scaling = {.type = RopeScalingType::kLlama3,
                      .factor = 8.0,
                      .original_max_position_embeddings = 8192};
  };
  const auto yarn = [](LayerSpec& s) {
    s.rope_scaling = {.type = RopeScalingType::kYarn,
                      .factor = 40.0,
                      .original_max_position_embeddings = 4096,
                      .mscale = 1.0,
                      .mscale_all_dim = 1.0};
  };
  add(
      "RopeScalingDynamic", Gqa(),
      [](LayerSpec& s) { s.rope_scaling = {.type = RopeScalingType::kDynamic, .factor = 2.0}; },
      "rope_scaling.type = dynamic is not implemented");
  add(
      "RopeScalingWithoutRope", Gqa(),
      [&](LayerSpec& s) {
        llama3(s);
        s.rope = RopeLayout::kNone;
      },
      "rope_scaling.type = llama3");
  add(
      "RopeScalingFactorBelowOne", Gqa(),
      [](LayerSpec& s) { s.rope_scaling = {.type = RopeScalingType::kLinear, .factor = 0.5}; },
      "rope_scaling.factor");
  add(
      "Llama3WithoutOriginalContext", Gqa(),
      [&](LayerSpec& s) {
        llama3(s);
        s.rope_scaling.original_max_position_embeddings = 0;
      },
      "rope_scaling.original_max_position_embeddings");
  add(
      "Llama3ZeroLowFreqFactor", Gqa(),
      [&](LayerSpec& s) {
        llama3(s);
        s.rope_scaling.low_freq_factor = 0.0;
      },
      "rope_scaling.low_freq_factor");
  add(
      "Llama3HighNotAboveLow", Gqa(),
      [&](LayerSpec& s) {
        llama3(s);
        s.rope_scaling.high_freq_factor = 1.0;
      },
      "rope_scaling.high_freq_factor");
  add(
      "YarnWithoutOriginalContext", DeepSeekV3(),
      [&](LayerSpec& s) {
        yarn(s);
        s.rope_scaling.original_max_position_embeddings = -1;
      },
      "rope_scaling.original_max_position_embeddings");
  add(
      "YarnZeroBetaFast", DeepSeekV3(),
      [&](LayerSpec& s) {
        yarn(s);
        s.rope_scaling.beta_fast = 0.0;
      },
      "rope_scaling.beta_fast");
  add(
      "YarnNegativeBetaSlow", DeepSeekV3(),
      [&](LayerSpec& s) {
        yarn(s);
        s.rope_scaling.beta_slow = -1.0;
      },
      "rope_scaling.beta_slow");
  add(
      "YarnNegativeMscale", DeepSeekV3(),
      [&](LayerSpec& s) {
        yarn(s);
        s.rope_scaling.mscale = -0.5;
      },
      "rope_scaling.mscale");
  // The model-family variations (rotary_dim, qk_norm, soft-capping, sinks).
  add(
      "RotaryDimOdd", Gqa(), [](LayerSpec& s) { s.rotary_dim = 33; }, "rotary_dim");
  add(
      "RotaryDimNegative", Gqa(), [](LayerSpec& s) { s.rotary_dim = -2; }, "rotary_dim");
  add(
      "RotaryDimOverHeadDim", Gqa(), [](LayerSpec& s) { s.rotary_dim = 66; }, "rotary_dim");
  add(
      "RotaryDimWithoutRope", Gqa(),
      [](LayerSpec& s) {
        s.rope = RopeLayout::kNone;
        s.rotary_dim = 32;
      },
      "rotary_dim");
  add(
      "QkNormEpsZero", Qwen3(), [](LayerSpec& s) { s.qk_norm_eps = 0.0f; }, "qk_norm_eps");
  add(
      "QkNormEpsNegative", Qwen3(), [](LayerSpec& s) { s.qk_norm_eps = -1e-6f; }, "qk_norm_eps");
  add(
      "SoftcapNegative", Gemma2(), [](LayerSpec& s) { s.attn_logit_softcapping = -50.0f; },
      "attn_logit_softcapping");
  add(
      "SoftcapInfinite", Gemma2(),
      [](LayerSpec& s) { s.attn_logit_softcapping = std::numeric_limits<float>::infinity(); },
      "attn_logit_softcapping");
  add(
      "MlaRotaryDim", DeepSeekV3(), [](LayerSpec& s) { s.rotary_dim = 32; }, "rotary_dim");
  add(
      "MlaQkNorm", DeepSeekV3(), [](LayerSpec& s) { s.qk_norm = QkNorm::kRms; }, "qk_norm");
  add(
      "MlaSoftcap", DeepSeekV3(), [](LayerSpec& s) { s.attn_logit_softcapping = 30.0f; },
      "attn_logit_softcapping");
  add(
      "MlaSinks", DeepSeekV3(), [](LayerSpec& s) { s.attention_sinks = true; }, "attention_sinks");
  add(
      "YarnNegativeMscaleAllDim", DeepSeekV3(),
      [&](LayerSpec& s) {
        yarn(s);
        s.rope_scaling.mscale_all_dim = -0.5;
      },
      "rope_scaling.mscale_all_dim");
  // RoPE scaling parameters are bounded above too (1024): a YaRN factor of 1e300 was accepted.
  add(
      "YarnHugeFactor", DeepSeekV3(),
      [&](LayerSpec& s) {
        yarn(s);
        s.rope_scaling.factor = 1e300;
      },
      "rope_scaling.factor = 1e+300: must be finite and in [1, 1024]");
  add(
      "LinearFactorPastTheBound", Gqa(),
      [](LayerSpec& s) { s.rope_scaling = {.type = RopeScalingType::kLinear, .factor = 1025.0}; },
      "rope_scaling.factor = 1025");
  add(
      "Llama3HugeHighFreqFactor", Gqa(),
      [&](LayerSpec& s) {
        llama3(s);
        s.rope_scaling.high_freq_factor = 1e300;
      },
      "rope_scaling.high_freq_factor");
  add(
      "Llama3HugeLowFreqFactor", Gqa(),
      [&](LayerSpec& s) {
        llama3(s);
        s.rope_scaling.low_freq_factor = 1e300;
      },
      "rope_scaling.low_freq_factor");
  add(
      "YarnHugeBetaFast", DeepSeekV3(),
      [&](LayerSpec& s) {
        yarn(s);
        s.rope_scaling.beta_fast = 1e300;
      },
      "rope_scaling.beta_fast");
  add(
      "YarnHugeMscale", DeepSeekV3(),
      [&](LayerSpec& s) {
        yarn(s);
        s.rope_scaling.mscale = 1e300;
      },
      "rope_scaling.mscale");
  return cases;
}

class ValidateLayerSpecRejectTest : public ::testing::TestWithParam<BadSpec> {};

TEST_P(ValidateLayerSpecRejectTest, NamesTheField) {
  const BadSpec& bad = GetParam();
  ExpectInvalid(ValidateLayerSpec(bad.spec), bad.field);
  // The JSON path validates too, and reports the same field. (Specs the JSON form cannot express,
  // NaN, are skipped: JSON has no NaN.)
  if (std::isnan(bad.spec.softmax_scale) || std::isinf(bad.spec.rope_theta)) return;
  ExpectInvalid(LayerSpecFromJson(LayerSpecToJson(bad.spec)).status(), bad.field);
}

INSTANTIATE_TEST_SUITE_P(AllRules, ValidateLayerSpecRejectTest, ::testing::ValuesIn(BadSpecs()),
                         [](const auto& info) { return info.param.name; });

// ---- sizes --------------------------------------------------------------------------------------

TEST(LayerSpecSizesTest, MhaParameterCountAndKvBytes) {
  const LayerSpec spec = Mha512();
  EXPECT_EQ(ParameterCount(spec), 4 * 512 * 512);  // q, k, v, o: 1048576.
  EXPECT_EQ(ParameterCount(spec), 1048576);
  EXPECT_EQ(KvScalarsPerToken(spec), 2 * 8 * 64);
  EXPECT_EQ(KvBytesPerToken(spec, DType::kF32), 2 * 8 * 64 * 4);
  EXPECT_EQ(KvBytesPerToken(spec, DType::kBF16), 2 * 8 * 64 * 2);
  EXPECT_EQ(QkHeadDim(spec), 64);
  EXPECT_EQ(VHeadDim(spec), 64);
  EXPECT_EQ(RotaryDim(spec), 0);
  EXPECT_FLOAT_EQ(EffectiveSoftmaxScale(spec), 0.125f);
  EXPECT_EQ(DefaultPageSize(spec), 16);

  LayerSpec biased = spec;
  biased.qkv_bias = true;
  biased.o_bias = true;
  EXPECT_EQ(ParameterCount(biased), 1048576 + 3 * 512 + 512);
}

TEST(LayerSpecSizesTest, GqaParameterCountAndKvBytes) {
  // Llama-3-8B attention: d_model 4096, 32 heads, 8 KV heads, head_dim 128.
  LayerSpec spec = Gqa();
  spec.d_model = 4096;
  spec.num_heads = 32;
  spec.num_kv_heads = 8;
  spec.head_dim = 128;
  // q and o: 4096 x 4096 each; k and v: 4096 x 1024 each.
  EXPECT_EQ(ParameterCount(spec), 2 * 4096 * 4096 + 2 * 4096 * 1024);
  EXPECT_EQ(KvBytesPerToken(spec, DType::kBF16), 2 * 8 * 128 * 2);  // 4 KiB per token per layer.
  EXPECT_EQ(RotaryDim(spec), 128);
}

TEST(LayerSpecSizesTest, VariationsCountTheirWeights) {
  // Qwen3-8B: q 4096x4096, k/v 4096x1024, o 4096x4096, q_norm and k_norm [128].
  EXPECT_EQ(ParameterCount(Qwen3()), 2 * 4096 * 4096 + 2 * 4096 * 1024 + 2 * 128);
  // gpt-oss-20b: q 4096x2880 (+b), k/v 512x2880 (+b), o 2880x4096 (+b), sinks [64].
  const int64_t q = 64 * 64, kv = 8 * 64, d = 2880;
  EXPECT_EQ(ParameterCount(GptOss()), 2 * q * d + 2 * kv * d + q + 2 * kv + d + 64);
  // Soft-capping and partial rotary have no weights.
  LayerSpec gemma2 = Gemma2();
  const int64_t before = ParameterCount(gemma2);
  gemma2.attn_logit_softcapping = 0.0f;
  gemma2.rotary_dim = 128;
  EXPECT_EQ(ParameterCount(gemma2), before);
  EXPECT_EQ(KvScalarsPerToken(Qwen3()), 2 * 8 * 128);
}

TEST(LayerSpecSizesTest, DeepSeekV3FullSize) {
  const LayerSpec spec = DeepSeekV3();
  EXPECT_EQ(KvScalarsPerToken(spec), 512 + 64);  // The latent and the shared RoPE key.
  EXPECT_EQ(KvBytesPerToken(spec, DType::kBF16), 576 * 2);
  EXPECT_EQ(QkHeadDim(spec), 192);
  EXPECT_EQ(VHeadDim(spec), 128);
  EXPECT_EQ(RotaryDim(spec), 64);
  EXPECT_FLOAT_EQ(EffectiveSoftmaxScale(spec), 1.0f / std::sqrt(192.0f));
  EXPECT_EQ(DefaultPageSize(spec), 64);
  // q_a_proj 1536x7168 + q_a_layernorm 1536 + q_b_proj (128*192)x1536
  // + kv_a_proj_with_mqa (512+64)x7168 + kv_a_layernorm 512 + kv_b_proj (128*(128+128))x512
  // + o_proj 7168x(128*128).
  const int64_t expected = int64_t{1536} * 7168 + 1536 + int64_t{128 * 192} * 1536 +
                           int64_t{576} * 7168 + 512 + int64_t{128 * 256} * 512 +
                           int64_t{7168} * 128 * 128;
  EXPECT_EQ(ParameterCount(spec), expected);
  EXPECT_EQ(ParameterCount(spec), 187107328);  // ~187M per layer, as the published 671B implies.

  LayerSpec no_q_lora = spec;
  no_q_lora.mla.q_lora_rank = 0;  // DeepSeek-V2-Lite style: plain q_proj 7168 -> 128*192.
  EXPECT_EQ(ParameterCount(no_q_lora),
            expected - (int64_t{1536} * 7168 + 1536 + int64_t{128 * 192} * 1536) +
                int64_t{128 * 192} * 7168);
}

// ---- JSON ---------------------------------------------------------------------------------------

TEST(LayerSpecJsonTest, RoundTripsEveryField) {
  LayerSpec gqa = Gqa();
  gqa.qkv_bias = true;
  gqa.o_bias = false;
  gqa.rope_theta = 500000.0;
  gqa.sliding_window = 4096;
  gqa.softmax_scale = 0.0883883476f;

  LayerSpec mha = Mha512();
  mha.causal = false;
  mha.o_bias = true;

  LayerSpec mla = DeepSeekV3();
  mla.softmax_scale = 0.1352337f;  // A YaRN-adjusted scale.
  mla.mla.rms_norm_eps = 1e-5f;

  LayerSpec llama31 = Gqa();
  llama31.rope_scaling = {.type = RopeScalingType::kLlama3,
                          .factor = 8.0,
                          .original_max_position_embeddings = 8192,
                          .low_freq_factor = 1.0,
                          .high_freq_factor = 4.0};
  LayerSpec v3_yarn = DeepSeekV3();
  v3_yarn.rope_scaling = {.type = RopeScalingType::kYarn,
                          .factor = 40.0,
                          .original_max_position_embeddings = 4096,
                          .beta_fast = 32.0,
                          .beta_slow = 1.0,
                          .mscale = 1.0,
                          .mscale_all_dim = 0.707};
  LayerSpec linear = Gqa();
  linear.rope_scaling = {.type = RopeScalingType::kLinear, .factor = 2.5};
  LayerSpec gemma3 = Gemma2();
  gemma3.qk_norm = QkNorm::kRmsUnitOffset;
  gemma3.qk_norm_eps = 1e-5f;
  gemma3.rotary_dim = 192;
  LayerSpec gpt_oss = GptOss();

  for (const LayerSpec& spec : {gqa, mha, mla, llama31, v3_yarn, linear, gemma3, gpt_oss}) {
    const std::string json = LayerSpecToJson(spec);
    absl::StatusOr<LayerSpec> parsed = LayerSpecFromJson(json);
    ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << json;
    ExpectSameSpec(spec, *parsed);
    EXPECT_EQ(LayerSpecToJson(*parsed), json);
  }
}

TEST(LayerSpecJsonTest, WritesReadableDocument) {
  const std::string json = LayerSpecToJson(DeepSeekV3());
  EXPECT_THAT(json, HasSubstr("\"variant\": \"mla\""));
  EXPECT_THAT(json, HasSubstr("\"rope\": \"interleaved\""));
  EXPECT_THAT(json, HasSubstr("\"kv_lora_rank\": 512"));
  EXPECT_THAT(json, HasSubstr("\"rms_norm_eps\": 1e-06"));  // Not 9.99999997e-07.
  EXPECT_EQ(json.back(), '\n');
  // Keys in the documented order, variant first.
  EXPECT_EQ(json.find("\"variant\""), json.find('"'));
  EXPECT_LT(json.find("\"d_model\""), json.find("\"mla\": {"));
  // Non-MLA specs have no "mla" object.
  EXPECT_THAT(LayerSpecToJson(Gqa()), ::testing::Not(HasSubstr("mla")));
}

TEST(LayerSpecJsonTest, ParsesMinimalSpecsWithDefaults) {
  absl::StatusOr<LayerSpec> spec = LayerSpecFromJson(
      R"({"variant": "gqa", "d_model": 256, "num_heads": 8, "num_kv_heads": 2, "head_dim": 32})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->variant, AttentionVariant::kGQA);
  EXPECT_EQ(spec->num_kv_heads, 2);
  EXPECT_FALSE(spec->qkv_bias);
  EXPECT_FALSE(spec->o_bias);
  EXPECT_EQ(spec->rope, RopeLayout::kHalf);  // attnctl's and the Python client's default too.
  EXPECT_EQ(spec->rope_theta, 10000.0);
  EXPECT_TRUE(spec->causal);
  EXPECT_EQ(spec->sliding_window, 0);
  EXPECT_EQ(spec->softmax_scale, 0.0f);

  // num_kv_heads and head_dim as attnctl's flags default them: num_heads (mha) or 1 (mqa), and
  // d_model / num_heads.
  absl::StatusOr<LayerSpec> mha =
      LayerSpecFromJson(R"({"variant": "mha", "d_model": 256, "num_heads": 8})");
  ASSERT_TRUE(mha.ok()) << mha.status();
  EXPECT_EQ(mha->num_kv_heads, 8);
  EXPECT_EQ(mha->head_dim, 32);
  EXPECT_EQ(mha->rope, RopeLayout::kHalf);
  absl::StatusOr<LayerSpec> mqa = LayerSpecFromJson(
      R"({"variant": "mqa", "d_model": 256, "num_heads": 8, "head_dim": 64, "rope": "none"})");
  ASSERT_TRUE(mqa.ok()) << mqa.status();
  EXPECT_EQ(mqa->num_kv_heads, 1);
  EXPECT_EQ(mqa->head_dim, 64);
  EXPECT_EQ(mqa->rope, RopeLayout::kNone);

  absl::StatusOr<LayerSpec> mla = LayerSpecFromJson(R"({
      "variant": "mla", "d_model": 256, "num_heads": 4, "rope": "interleaved",
      "mla": {"kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
              "v_head_dim": 16}})");
  ASSERT_TRUE(mla.ok()) << mla.status();
  EXPECT_EQ(mla->mla.q_lora_rank, 0);
  EXPECT_EQ(mla->mla.rms_norm_eps, 1e-6f);
  EXPECT_EQ(KvScalarsPerToken(*mla), 40);
}

TEST(LayerSpecJsonTest, AcceptsWhatThePeerScriptWrites) {
  // tests/peer/make_peer_cases.py writes num_kv_heads/head_dim 0 for MLA and float-valued
  // integers nowhere; integers in floats (rope_theta 10000.0) are fine for number fields.
  absl::StatusOr<LayerSpec> spec = LayerSpecFromJson(R"({
      "variant": "mla", "d_model": 256, "num_heads": 4, "num_kv_heads": 0, "head_dim": 0,
      "qkv_bias": false, "o_bias": false, "rope": "interleaved", "rope_theta": 10000.0,
      "causal": true, "sliding_window": 0, "softmax_scale": 0.0,
      "mla": {"q_lora_rank": 64, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
              "qk_rope_head_dim": 8, "v_head_dim": 16, "rms_norm_eps": 1e-06}})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->mla.q_lora_rank, 64);
  EXPECT_EQ(spec->rope_theta, 10000.0);
  // An integer is a valid number.
  EXPECT_TRUE(LayerSpecFromJson(R"({"variant": "mha", "d_model": 64, "num_heads": 1,
      "num_kv_heads": 1, "head_dim": 64, "rope": "half", "rope_theta": 10000})")
                  .ok());
}

struct BadJson {
  std::string name;
  std::string json;
  std::string key;  // Must appear in the error message.
};

// A valid GQA spec with `extra` spliced in before the closing brace; a later duplicate key is not
// what these tests want, so callers only add keys absent from this base.
std::string GqaWith(const std::string& extra) {
  return R"({"variant": "gqa", "d_model": 256, "num_heads": 8, "num_kv_heads": 2)" +
         std::string(extra.empty() ? "" : ", ") + extra + "}";
}

std::string MlaWith(const std::string& mla_body) {
  return R"({"variant": "mla", "d_model": 256, "num_heads": 4, "mla": {)" + mla_body + "}}";
}

std::vector<BadJson> BadJsons() {
  const std::string mla_ok = R"("kv_lora_rank": 32, "qk_nope_head_dim": 16,
      "qk_rope_head_dim": 8, "v_head_dim": 16)";
  return {
      {"NotJson", R"({"variant": "gqa",)", "not valid JSON"},
      {"TrailingGarbage", GqaWith(R"("head_dim": 32)") + " x", "not valid JSON"},
      {"TopLevelArray", "[1, 2]", "JSON object"},
      {"UnknownKey", GqaWith(R"("head_dim": 32, "n_heads": 8)"), "n_heads"},
      {"UnknownMlaKey", MlaWith(mla_ok + R"(, "kv_rank": 3)"), "mla.kv_rank"},
      {"MissingVariant", R"({"d_model": 256, "num_heads": 8, "num_kv_heads": 2, "head_dim": 32})",
       "variant"},
      {"MissingNumKvHeadsForGqa", R"({"variant": "gqa", "d_model": 256, "num_heads": 8})",
       "num_kv_heads: missing required key"},
      {"MissingMlaObject", R"({"variant": "mla", "d_model": 256, "num_heads": 4})", "mla"},
      {"MissingMlaField", MlaWith(R"("kv_lora_rank": 32, "qk_nope_head_dim": 16,
           "qk_rope_head_dim": 8)"),
       "mla.v_head_dim"},
      {"MlaObjectOnGqa", GqaWith(R"("head_dim": 32, "mla": {})"), "mla"},
      {"UnknownVariant", R"({"variant": "moe", "d_model": 256, "num_heads": 8})", "variant"},
      {"UnknownRope", GqaWith(R"("head_dim": 32, "rope": "yarn")"), "rope"},
      {"StringForInt", GqaWith(R"("head_dim": "32")"), "head_dim"},
      {"FloatForInt", GqaWith(R"("head_dim": 32.5)"), "head_dim"},
      {"IntegralFloatForInt", GqaWith(R"("head_dim": 32.0)"), "head_dim"},
      {"HugeInt", GqaWith(R"("head_dim": 4294967328)"), "head_dim"},
      {"HugeUnsigned", GqaWith(R"("head_dim": 18446744073709551615)"), "head_dim"},
      {"BoolForInt", GqaWith(R"("head_dim": true)"), "head_dim"},
      {"IntForBool", GqaWith(R"("head_dim": 32, "causal": 1)"), "causal"},
      {"StringForBool", GqaWith(R"("head_dim": 32, "qkv_bias": "false")"), "qkv_bias"},
      {"NullForNumber", GqaWith(R"("head_dim": 32, "rope_theta": null)"), "rope_theta"},
      {"StringForNumber", GqaWith(R"("head_dim": 32, "softmax_scale": "0.1")"), "softmax_scale"},
      {"ScaleOutOfFloatRange", GqaWith(R"("head_dim": 32, "softmax_scale": 1e300)"),
       "softmax_scale"},
      {"NumberForString", GqaWith(R"("head_dim": 32, "rope": 1)"), "rope"},
      {"ArrayForMla", R"({"variant": "mla", "d_model": 256, "num_heads": 4, "mla": [32]})", "mla"},
      {"StringInMla", MlaWith(R"("kv_lora_rank": "32", "qk_nope_head_dim": 16,
           "qk_rope_head_dim": 8, "v_head_dim": 16)"),
       "mla.kv_lora_rank"},
      {"UnknownKeyNearMiss", GqaWith(R"("head_dim": 32, "num_kv_heads_": 0)"), "num_kv_heads_"},
      {"UnknownRopeScalingType",
       GqaWith(R"("head_dim": 32, "rope_scaling": {"type": "ntk", "factor": 2})"),
       "rope_scaling.type: unknown 'ntk'"},
      {"RopeScalingKeyOfAnotherType",
       GqaWith(R"("head_dim": 32, "rope_scaling": {"type": "linear", "factor": 2,
           "beta_fast": 32})"),
       "rope_scaling.beta_fast"},
      {"RopeScalingWithoutType", GqaWith(R"("head_dim": 32, "rope_scaling": {"factor": 2})"),
       "rope_scaling.type"},
      {"Llama3MissingOriginalContext",
       GqaWith(R"("head_dim": 32, "rope": "half", "rope_scaling": {"type": "llama3",
           "factor": 8})"),
       "rope_scaling.original_max_position_embeddings"},
      {"LongRopeRefused",
       GqaWith(R"("head_dim": 32, "rope": "half", "rope_scaling": {"type": "longrope",
           "factor": 2})"),
       "rope_scaling.type = longrope is not implemented (LongRoPE switches"},
      {"UnknownQkNorm", GqaWith(R"("head_dim": 32, "qk_norm": "layer")"), "qk_norm"},
      {"BoolForQkNorm", GqaWith(R"("head_dim": 32, "qk_norm": true)"), "qk_norm"},
      {"IntForSinks", GqaWith(R"("head_dim": 32, "attention_sinks": 1)"), "attention_sinks"},
      {"FloatRotaryDim", GqaWith(R"("head_dim": 32, "rope": "half", "rotary_dim": 24.5)"),
       "rotary_dim"},
      {"RotaryDimPastHead", GqaWith(R"("head_dim": 32, "rope": "half", "rotary_dim": 34)"),
       "rotary_dim"},
      {"SinksOnMla",
       R"({"variant": "mla", "d_model": 256, "num_heads": 4, "attention_sinks": true, "mla": {)" +
           mla_ok + "}}",
       "attention_sinks"},
      {"DynamicRefused",
       GqaWith(R"("head_dim": 32, "rope": "half", "rope_scaling": {"type": "dynamic",
           "factor": 2})"),
       "rope_scaling.type = dynamic is not implemented"},
      // Well-formed JSON, invalid spec: ValidateLayerSpec's message.
      {"InvalidSpec", R"({"variant": "gqa", "d_model": 256, "num_heads": 8, "num_kv_heads": 3,
           "head_dim": 32})",
       "num_kv_heads"},
      {"InvalidMla", MlaWith(R"("kv_lora_rank": 0, "qk_nope_head_dim": 16,
           "qk_rope_head_dim": 8, "v_head_dim": 16)"),
       "mla.kv_lora_rank"},
  };
}

class LayerSpecJsonRejectTest : public ::testing::TestWithParam<BadJson> {};

TEST_P(LayerSpecJsonRejectTest, NamesTheKey) {
  absl::StatusOr<LayerSpec> spec = LayerSpecFromJson(GetParam().json);
  ExpectInvalid(spec.status(), GetParam().key);
}

INSTANTIATE_TEST_SUITE_P(All, LayerSpecJsonRejectTest, ::testing::ValuesIn(BadJsons()),
                         [](const auto& info) { return info.param.name; });

TEST(LayerSpecJsonTest, EmptyAndWhitespaceInputsAreErrors) {
  ExpectInvalid(LayerSpecFromJson("").status(), "not valid JSON");
  ExpectInvalid(LayerSpecFromJson("  \n").status(), "not valid JSON");
  ExpectInvalid(LayerSpecFromJson("null").status(), "JSON object");
}

// gpt-oss's YaRN leaves the ramp bounds fractional (truncate=false); other scalings have no ramp.
TEST(LayerSpecTest, YarnTruncateRoundTripsAndIsYarnOnly) {
  LayerSpec spec = GptOss();
  spec.rope_scaling = {.type = RopeScalingType::kYarn,
                       .factor = 32.0,
                       .original_max_position_embeddings = 4096,
                       .truncate = false};
  EXPECT_TRUE(ValidateLayerSpec(spec).ok()) << ValidateLayerSpec(spec);
  absl::StatusOr<LayerSpec> back = LayerSpecFromJson(LayerSpecToJson(spec));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_FALSE(back->rope_scaling.truncate);
  spec.rope_scaling.truncate = true;
  back = LayerSpecFromJson(LayerSpecToJson(spec));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->rope_scaling.truncate);

  spec.rope_scaling = {.type = RopeScalingType::kLinear, .factor = 2.0, .truncate = false};
  ExpectInvalid(ValidateLayerSpec(spec), "truncate");
}

// The JSON of specs using every key, pinned as the hand-written writer wrote it before the keys
// came from LayerSpecFields(): spec files and the fingerprints of sessions configured from them
// depend on these bytes.
TEST(LayerSpecJsonTest, PinsTheDocumentOfEveryKey) {
  const struct {
    const char* name;
    const char* in;
    const char* out;
  } kCases[] = {
      {"every_field",
       R"({"variant": "gqa", "d_model": 128, "num_heads": 8, "num_kv_heads": 2, "head_dim": 16,
       "qkv_bias": true, "o_bias": true, "rope": "interleaved", "rope_theta": 500000,
       "rope_scaling": {"type": "yarn", "factor": 4, "original_max_position_embeddings": 4096,
       "beta_fast": 16, "beta_slow": 2, "mscale": 1, "mscale_all_dim": 0.5, "truncate": false},
       "causal": true, "sliding_window": 64, "softmax_scale": 0.1, "rotary_dim": 8,
       "qk_norm": "rms_unit_offset", "qk_norm_eps": 1e-5, "attn_logit_softcapping": 30,
       "attention_sinks": true, "alibi": "mpt", "alibi_bias_max": 6})",
       R"({
  "variant": "gqa",
  "d_model": 128,
  "num_heads": 8,
  "num_kv_heads": 2,
  "head_dim": 16,
  "qkv_bias": true,
  "o_bias": true,
  "rope": "interleaved",
  "rope_theta": 500000.0,
  "rope_scaling": {
    "type": "yarn",
    "factor": 4.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 16.0,
    "beta_slow": 2.0,
    "mscale": 1.0,
    "mscale_all_dim": 0.5,
    "truncate": false
  },
  "causal": true,
  "sliding_window": 64,
  "softmax_scale": 0.1,
  "rotary_dim": 8,
  "qk_norm": "rms_unit_offset",
  "qk_norm_eps": 1e-05,
  "attn_logit_softcapping": 30.0,
  "attention_sinks": true,
  "alibi": "mpt",
  "alibi_bias_max": 6.0
}
)"},
      {"mla",
       R"({"variant": "mla", "d_model": 64, "num_heads": 4, "rope": "interleaved",
       "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
       "mscale": 1, "mscale_all_dim": 0.707}, "mla": {"q_lora_rank": 24, "kv_lora_rank": 32,
       "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "rms_norm_eps": 1e-5}})",
       R"({
  "variant": "mla",
  "d_model": 64,
  "num_heads": 4,
  "num_kv_heads": 0,
  "head_dim": 0,
  "qkv_bias": false,
  "o_bias": false,
  "rope": "interleaved",
  "rope_theta": 10000.0,
  "rope_scaling": {
    "type": "yarn",
    "factor": 40.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 0.707,
    "truncate": true
  },
  "causal": true,
  "sliding_window": 0,
  "softmax_scale": 0.0,
  "rotary_dim": 0,
  "qk_norm": "none",
  "qk_norm_eps": 1e-06,
  "attn_logit_softcapping": 0.0,
  "attention_sinks": false,
  "alibi": "none",
  "alibi_bias_max": 8.0,
  "mla": {
    "q_lora_rank": 24,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "rms_norm_eps": 1e-05
  }
}
)"},
  };
  for (const auto& c : kCases) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<LayerSpec> spec = LayerSpecFromJson(c.in);
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(LayerSpecToJson(*spec), c.out);
  }
}

// Refusals keep their messages and their order (the first bad key in the keys' order), as the
// hand-written reader gave them.
TEST(LayerSpecJsonTest, RefusesWithTheSameMessages) {
  const struct {
    const char* doc;
    const char* message;
  } kCases[] = {
      {R"({"variant": "gqa", "d_model": 64, "num_heads": 4})",
       "num_kv_heads: missing required key"},
      {R"({"variant": "gqa", "d_model": 64, "num_heads": 4, "head_dim": "x"})",
       "num_kv_heads: missing required key"},
      {R"({"variant": "mha", "d_model": 64, "num_heads": 4, "bogus": 1})",
       "bogus: unknown key (known keys: variant, d_model, num_heads, num_kv_heads, head_dim, "
       "qkv_bias, o_bias, rope, rope_theta, causal, sliding_window, softmax_scale, mla, "
       "rope_scaling, rotary_dim, qk_norm, qk_norm_eps, attn_logit_softcapping, "
       "attention_sinks, alibi, alibi_bias_max)"},
      {R"({"d_model": 64, "num_heads": 4})",
       "variant: missing required key"},
      {R"({"variant": "mha", "num_heads": 4})",
       "d_model: missing required key"},
      {R"({"variant": "xqa", "d_model": 64, "num_heads": 4})",
       "variant: unknown 'xqa', expected mha, mqa, gqa or mla"},
      {R"({"variant": 1, "d_model": 64, "num_heads": 4})",
       "variant: expected a string, got integer 1"},
      {R"({"variant": "mha", "d_model": 64, "num_heads": 4, "rope": "spiral"})",
       "rope: unknown layout 'spiral', expected none, half or interleaved"},
      {R"({"variant": "mha", "d_model": 64, "num_heads": 4, "qk_norm": "layer"})",
       "qk_norm: unknown 'layer', expected none, rms, rms_unit_offset, rms_across_heads or "
       "layer_norm"},
      {R"({"variant": "mha", "d_model": 64, "num_heads": 4, "alibi": 3})",
       "alibi: expected a string, got integer 3"},
      {R"({"variant": "mha", "d_model": 64, "num_heads": 4, "alibi": "t5"})",
       "alibi: unknown 't5', expected none, bloom or mpt"},
      {R"({"variant": "mha", "d_model": 64, "num_heads": 4, "qk_norm_eps": "x"})",
       "qk_norm_eps: expected a number, got string \"x\""},
      {R"({"variant": "mha", "d_model": 64, "num_heads": 4, "rope_theta": true})",
       "rope_theta: expected a number, got boolean true"},
      {R"({"variant": "mha", "d_model": 64, "num_heads": 4, "head_dim": 2.5})",
       "head_dim: expected an integer, got number 2.5"},
      {R"({"variant": "mha", "d_model": 64, "num_heads": 4, "sliding_window": 10000000000})",
       "sliding_window: 10000000000 does not fit in a 32-bit int"},
      {R"({"variant": "mha", "d_model": 64, "num_heads": 4,
       "sliding_window": 18446744073709551615})",
       "sliding_window: 18446744073709551615 does not fit in a 32-bit int"},
      {R"({"variant": "mha", "d_model": 64, "num_heads": 4, "softmax_scale": 1e39})",
       "softmax_scale: 1e+39 is out of float range"},
      {R"({"variant": "mha", "d_model": 64, "num_heads": 4, "attention_sinks": 1})",
       "attention_sinks: expected true or false, got integer 1"},
      {R"({"variant": "mha", "d_model": 64, "num_heads": 4, "causal": "yes"})",
       "causal: expected true or false, got string \"yes\""},
      {R"({"variant": "mha", "d_model": 64, "num_heads": 4, "alibi_bias_max": -1})",
       "alibi_bias_max = -1: must be finite and > 0"},
      {R"({"variant": "mha", "d_model": 64, "num_heads": 4, "attn_logit_softcapping": -1})",
       "attn_logit_softcapping = -1: must be finite and >= 0 (0 = no soft-capping)"},
      {R"({"variant": "mha", "d_model": 64, "num_heads": 4, "rotary_dim": 3})",
       "rotary_dim = 3: must be 0 (the whole head) or even and in [2, head_dim = 16]"},
      {R"({"variant": "mha", "d_model": 64, "num_heads": 4, "mla": {}})",
       "mla: only allowed with variant mla, not mha"},
      {R"({"variant": "mla", "d_model": 64, "num_heads": 4})",
       "mla: missing required key for variant mla"},
      {R"({"variant": "mla", "d_model": 64, "num_heads": 4, "mla": {"kv_lora_rank": 1}})",
       "mla.qk_nope_head_dim: missing required key"},
      {R"({"variant": "mla", "d_model": 64, "num_heads": 4, "mla": 3})",
       "mla: expected an object, got integer 3"},
      {R"({"variant": "mla", "d_model": 64, "num_heads": 4, "qk_norm": "rms",
       "mla": {"kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
       "v_head_dim": 16}})",
       "qk_norm = rms: is not supported for MLA (DeepSeek-V2/V3 attention has no such feature)"},
      {R"({"variant": "mha", "d_model": 64, "num_heads": 4, "rope_scaling": {"type": "linear",
       "beta_fast": 1}})",
       "rope_scaling.beta_fast: unknown key (known keys: type, factor) for type linear"},
      {R"({"variant": "mha", "d_model": 64, "num_heads": 4, "rope_scaling": 2})",
       "rope_scaling: expected an object, got integer 2"},
      {R"({"variant": "mha", "d_model": 64, "num_heads": 4, "rope_scaling": {"type": "longrope"}})",
       "rope_scaling.type = longrope is not implemented (LongRoPE switches between long and "
       "short factors by sequence length, so cached keys would keep frequencies the next call "
       "no longer uses)"},
      {R"({"variant": "mha", "d_model": 64, "num_heads": 4, "qk_norm": "layer", "alibi": "t5"})",
       "qk_norm: unknown 'layer', expected none, rms, rms_unit_offset, rms_across_heads or "
       "layer_norm"},
      {R"({"variant": "mha", "d_model": 64, "num_heads": 4, "causal": false, "sliding_window": 4})",
       "sliding_window = 4: requires causal = true (Mistral semantics)"},
      {R"([1, 2])",
       "layer spec: expected a JSON object, got array [1,2]"},
      {R"({"variant": )",
       "layer spec: not valid JSON: [json.exception.parse_error.101] parse error at line 1, "
       "column 13: syntax error while parsing value - unexpected end of input; expected '[', "
       "'{', or a literal"},
  };
  for (const auto& c : kCases) {
    absl::StatusOr<LayerSpec> spec = LayerSpecFromJson(c.doc);
    ASSERT_FALSE(spec.ok()) << c.doc;
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << c.doc;
    EXPECT_EQ(spec.status().message(), c.message) << c.doc;
  }
}

}  // namespace
}  // namespace attnserve
