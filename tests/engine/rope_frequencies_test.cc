// RoPE frequencies with rope scaling, against numbers printed by transformers 4.57.1's
// modeling_rope_utils.py (ROPE_INIT_FUNCTIONS[...](config, "cpu"), float32) for the real configs of
// Llama 3.1, DeepSeek-V3 and a Qwen2.5 YaRN setup, and DeepseekV3Attention.scaling.
#include "kernels/spec/rope_frequencies.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/spec/layer_spec.h"

namespace attnserve {
namespace {

// float32 reference values: agreement to a few float32 ulps.
constexpr double kTolerance = 1e-6;

void ExpectFrequencies(const LayerSpec& spec, const std::vector<std::pair<int, double>>& expected) {
  ASSERT_TRUE(ValidateLayerSpec(spec).ok()) << ValidateLayerSpec(spec);
  const std::vector<double> inv_freq = RopeInverseFrequencies(spec);
  ASSERT_EQ(static_cast<int>(inv_freq.size()), RotaryDim(spec) / 2);
  for (const auto& [index, value] : expected) {
    EXPECT_NEAR(inv_freq[index] / value, 1.0, kTolerance) << "pair " << index;
  }
}

// meta-llama/Llama-3.1-8B: head_dim 128, rope_theta 500000, rope_scaling llama3 factor 8.
LayerSpec Llama31() {
  LayerSpec spec;
  spec.variant = AttentionVariant::kGQA;
  spec.d_model = 4096;
  spec.num_heads = 32;
  spec.num_kv_heads = 8;
  spec.head_dim = 128;
  spec.rope = RopeLayout::kHalf;
  spec.rope_theta = 500000.0;
  spec.rope_scaling = {.type = RopeScalingType::kLlama3,
                       .factor = 8.0,
                       .original_max_position_embeddings = 8192,
                       .low_freq_factor = 1.0,
                       .high_freq_factor = 4.0};
  return spec;
}

// deepseek-ai/DeepSeek-V3: qk_rope_head_dim 64, yarn factor 40, mscale = mscale_all_dim = 1.
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
              .v_head_dim = 128};
  spec.rope_scaling = {.type = RopeScalingType::kYarn,
                       .factor = 40.0,
                       .original_max_position_embeddings = 4096,
                       .beta_fast = 32.0,
                       .beta_slow = 1.0,
                       .mscale = 1.0,
                       .mscale_all_dim = 1.0};
  return spec;
}

TEST(RopeFrequenciesTest, Llama3MatchesTransformers) {
  // Pairs 0 and 20 are high frequency (kept), 40 and 45 in the smoothed band, 50 and 63 low
  // frequency (divided by 8).
  ExpectFrequencies(Llama31(), {{0, 1.0},
                                {20, 0.016560440883040428},
                                {40, 3.428102354519069e-05},
                                {45, 1.2297638932068367e-05},
                                {50, 4.411534519022098e-06},
                                {63, 3.068925877869333e-07}});
  EXPECT_EQ(RopeAttentionFactor(Llama31()), 1.0);
}

TEST(RopeFrequenciesTest, YarnDeepSeekV3MatchesTransformers) {
  ExpectFrequencies(DeepSeekV3(), {{0, 1.0},
                                   {5, 0.23713736236095428},
                                   {10, 0.05623412877321243},
                                   {15, 0.0083345090970397},
                                   {20, 0.0007905694073997438},
                                   {31, 3.3338035336782923e-06}});
  // mscale == mscale_all_dim: cos and sin are not scaled ...
  EXPECT_EQ(RopeAttentionFactor(DeepSeekV3()), 1.0);
  // ... but the softmax scale is: DeepseekV3Attention.scaling for this config.
  EXPECT_NEAR(EffectiveSoftmaxScale(DeepSeekV3()) / 0.1352337788608801, 1.0, 1e-7);
  // An explicit scale wins.
  LayerSpec explicit_scale = DeepSeekV3();
  explicit_scale.softmax_scale = 0.5f;
  EXPECT_EQ(EffectiveSoftmaxScale(explicit_scale), 0.5f);
}

TEST(RopeFrequenciesTest, YarnWithoutMscaleScalesCosAndSin) {
  // Qwen2.5 with {"type": "yarn", "factor": 4, "original_max_position_embeddings": 32768}.
  LayerSpec spec;
  spec.variant = AttentionVariant::kGQA;
  spec.d_model = 1024;
  spec.num_heads = 8;
  spec.num_kv_heads = 8;
  spec.head_dim = 128;
  spec.rope = RopeLayout::kHalf;
  spec.rope_theta = 1000000.0;
  spec.rope_scaling = {
      .type = RopeScalingType::kYarn, .factor = 4.0, .original_max_position_embeddings = 32768};
  ExpectFrequencies(spec, {{0, 1.0},
                           {10, 0.11547820270061493},
                           {20, 0.01333521492779255},
                           {30, 0.0010643609566614032},
                           {40, 4.4456985051510856e-05},
                           {63, 3.102344408034696e-07}});
  EXPECT_NEAR(RopeAttentionFactor(spec), 1.138629436111989, 1e-12);
  // Not MLA: the softmax scale stays 1/sqrt(head_dim) (Qwen2Attention).
  EXPECT_EQ(EffectiveSoftmaxScale(spec), static_cast<float>(1.0 / std::sqrt(128.0)));
}

TEST(RopeFrequenciesTest, LinearDividesEveryFrequency) {
  LayerSpec plain = Llama31();
  plain.rope_scaling = {};
  LayerSpec linear = Llama31();
  linear.rope_scaling = {.type = RopeScalingType::kLinear, .factor = 4.0};
  const std::vector<double> a = RopeInverseFrequencies(plain);
  const std::vector<double> b = RopeInverseFrequencies(linear);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_DOUBLE_EQ(b[i], a[i] / 4.0);
  EXPECT_DOUBLE_EQ(a[1], std::pow(500000.0, -2.0 / 128));
}

}  // namespace
}  // namespace attnserve
