// Tests of the float64 reference itself, on cases whose answer is known without it.
#include "tests/reference/attention_reference.h"

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/spec/layer_spec.h"
#include "kernels/model/layer_weights.h"
#include "kernels/core/tensor.h"
#include "tests/reference/test_cases.h"

namespace attnserve::reference {
namespace {

constexpr double kExact = 1e-12;  // Same math in double, different order: rounding only.

// The catalog's MHA/MQA/GQA shape, narrowed to d_model 24 (hand-checkable sizes) with biases.
LayerSpec Gqa(int heads, int kv_heads, int head_dim, RopeLayout rope = RopeLayout::kHalf) {
  LayerSpec spec = StandardSpec(heads, kv_heads, head_dim, rope);
  spec.d_model = 24;
  spec.qkv_bias = true;
  spec.o_bias = true;
  return spec;
}

LayerSpec Mla(int q_lora_rank, RopeLayout rope = RopeLayout::kInterleaved) {
  LayerSpec spec;
  spec.variant = AttentionVariant::kMLA;
  spec.d_model = 32;
  spec.num_heads = 3;
  spec.rope = rope;
  spec.mla = {.q_lora_rank = q_lora_rank,
              .kv_lora_rank = 16,
              .qk_nope_head_dim = 8,
              .qk_rope_head_dim = 4,
              .v_head_dim = 6};
  return spec;
}

LayerWeights Weights(const LayerSpec& spec, uint64_t seed) {
  EXPECT_TRUE(ValidateLayerSpec(spec).ok()) << ValidateLayerSpec(spec);
  LayerWeights weights = RandomLayerWeights(spec, seed).value();
  std::mt19937_64 rng(seed + 1);
  PerturbNormScales(weights, rng);
  return weights;
}

// What a token attending only to itself outputs: o_proj(value of x), computed here without
// RoPE or softmax (a single allowed key has probability 1, and RoPE does not touch values).
std::vector<double> SelfOnlyOutput(const LayerSpec& spec, const LayerWeights& weights,
                                   const std::vector<double>& x) {
  const auto w = [&](const std::string& name) {
    return weights.count(name) ? ToDoubles(weights.at(name)) : std::vector<double>();
  };
  const auto linear = [](const std::vector<double>& in, const std::vector<double>& mat,
                         const std::vector<double>& bias, int out_dim) {
    const int in_dim = static_cast<int>(in.size());
    std::vector<double> out(out_dim);
    for (int o = 0; o < out_dim; ++o) {
      out[o] = bias.empty() ? 0.0 : bias[o];
      for (int i = 0; i < in_dim; ++i) out[o] += mat[o * in_dim + i] * in[i];
    }
    return out;
  };
  std::vector<double> concat;
  if (spec.variant == AttentionVariant::kMLA) {
    const MlaDims& m = spec.mla;
    std::vector<double> kv_a =
        linear(x, w("kv_a_proj_with_mqa.weight"), {}, m.kv_lora_rank + m.qk_rope_head_dim);
    std::vector<double> c(kv_a.begin(), kv_a.begin() + m.kv_lora_rank);
    double ms = 0.0;
    for (double value : c) ms += value * value / m.kv_lora_rank;
    const std::vector<double> scale = w("kv_a_layernorm.weight");
    for (int i = 0; i < m.kv_lora_rank; ++i) c[i] *= scale[i] / std::sqrt(ms + m.rms_norm_eps);
    const std::vector<double> kv =
        linear(c, w("kv_b_proj.weight"), {}, spec.num_heads * (m.qk_nope_head_dim + m.v_head_dim));
    for (int h = 0; h < spec.num_heads; ++h) {
      const int base = h * (m.qk_nope_head_dim + m.v_head_dim) + m.qk_nope_head_dim;
      concat.insert(concat.end(), kv.begin() + base, kv.begin() + base + m.v_head_dim);
    }
  } else {
    const std::vector<double> v =
        linear(x, w("v_proj.weight"), w("v_proj.bias"), spec.num_kv_heads * spec.head_dim);
    const int group = spec.num_heads / spec.num_kv_heads;
    for (int h = 0; h < spec.num_heads; ++h) {
      const int base = (h / group) * spec.head_dim;
      concat.insert(concat.end(), v.begin() + base, v.begin() + base + spec.head_dim);
    }
  }
  return linear(concat, w("o_proj.weight"), w("o_proj.bias"), spec.d_model);
}

std::vector<LayerSpec> AllVariants() {
  return {Gqa(4, 4, 8),
          Gqa(4, 1, 6),
          Gqa(6, 2, 10, RopeLayout::kInterleaved),
          Gqa(4, 2, 8, RopeLayout::kNone),
          Mla(0),
          Mla(12, RopeLayout::kHalf),
          Mla(0, RopeLayout::kNone)};
}

TEST(RopeReferenceTest, RotatesTheDocumentedPairs) {
  // rotary_dim 4, position 1: inv_freq = {1, theta^-1/2}; pair 0 turns by 1 radian.
  double half[4] = {1.0, 0.0, 0.0, 0.0};
  ApplyRopeReference(RopeLayout::kHalf, 10000.0, 1, half, 4);
  EXPECT_NEAR(half[0], std::cos(1.0), kExact);
  EXPECT_NEAR(half[1], 0.0, kExact);
  EXPECT_NEAR(half[2], std::sin(1.0), kExact);
  EXPECT_NEAR(half[3], 0.0, kExact);

  double interleaved[4] = {0.0, 0.0, 1.0, 0.0};  // Pair 1 turns by 1 * 10000^-0.5 = 0.01.
  ApplyRopeReference(RopeLayout::kInterleaved, 10000.0, 1, interleaved, 4);
  EXPECT_NEAR(interleaved[2], std::cos(0.01), kExact);
  EXPECT_NEAR(interleaved[3], std::sin(0.01), kExact);
  EXPECT_NEAR(interleaved[0], 0.0, kExact);

  double none[2] = {3.0, 4.0};
  ApplyRopeReference(RopeLayout::kNone, 10000.0, 7, none, 2);
  EXPECT_EQ(none[0], 3.0);
  EXPECT_EQ(none[1], 4.0);
}

// Two tokens, identity projections, one head: the softmax can be written down.
TEST(AttentionReferenceTest, HandComputedTwoTokens) {
  LayerSpec spec;
  spec.variant = AttentionVariant::kMHA;
  spec.d_model = 2;
  spec.num_heads = 1;
  spec.num_kv_heads = 1;
  spec.head_dim = 2;
  LayerWeights weights;
  const std::vector<float> identity = {1, 0, 0, 1};
  for (const char* name : {"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"}) {
    weights[name] = Tensor::FromFloats({2, 2}, identity);
  }
  ASSERT_TRUE(ValidateLayerWeights(spec, weights).ok());
  const std::vector<double> x = {1.0, 0.0, 0.0, 1.0};
  const std::vector<double> out = ReferenceAttention(spec, weights, x, {0, 1});
  // Row 0 sees only itself. Row 1: scores {0, 1/sqrt(2)} over values {(1,0), (0,1)}. The scale
  // is the float EffectiveSoftmaxScale returns, as transformers' module attribute is.
  const double e = std::exp(static_cast<double>(static_cast<float>(1.0 / std::sqrt(2.0))));
  const std::vector<double> expected = {1.0, 0.0, 1.0 / (1.0 + e), e / (1.0 + e)};
  EXPECT_LT(MaxRelativeError(out, expected), kExact);

  spec.causal = false;  // Row 0 now sees both keys with scores {1/sqrt(2), 0}.
  const std::vector<double> bidir = ReferenceAttention(spec, weights, x, {0, 1});
  const std::vector<double> expected_bidir = {e / (1.0 + e), 1.0 / (1.0 + e), 1.0 / (1.0 + e),
                                              e / (1.0 + e)};
  EXPECT_LT(MaxRelativeError(bidir, expected_bidir), kExact);

  spec.causal = true;
  spec.softmax_scale = 2.0f;  // An explicit scale replaces 1/sqrt(head_dim).
  const std::vector<double> scaled = ReferenceAttention(spec, weights, x, {0, 1});
  const double e2 = std::exp(2.0);
  EXPECT_NEAR(scaled[2], 1.0 / (1.0 + e2), kExact);
  EXPECT_NEAR(scaled[3], e2 / (1.0 + e2), kExact);
}

TEST(AttentionReferenceTest, OneTokenIsOProjOfItsValue) {
  std::mt19937_64 rng(7);
  for (const LayerSpec& spec : AllVariants()) {
    SCOPED_TRACE(LayerSpecSummary(spec));
    const LayerWeights weights = Weights(spec, 11);
    const std::vector<double> x = RandomHidden(1, spec.d_model, rng);
    EXPECT_LT(RelativeError(ReferenceAttention(spec, weights, x, {123}),
                            SelfOnlyOutput(spec, weights, x)),
              kExact);
  }
}

TEST(AttentionReferenceTest, WindowOfOneIsSelfOnly) {
  std::mt19937_64 rng(8);
  for (LayerSpec spec : AllVariants()) {
    SCOPED_TRACE(LayerSpecSummary(spec));
    spec.sliding_window = 1;
    const LayerWeights weights = Weights(spec, 12);
    const int64_t len = 9;
    const std::vector<double> x = RandomHidden(len, spec.d_model, rng);
    const std::vector<double> out = ReferenceAttention(spec, weights, x, IotaPositions(len));
    for (int64_t t = 0; t < len; ++t) {
      EXPECT_LT(RelativeError(SliceRows(out, spec.d_model, t, t + 1),
                              SelfOnlyOutput(spec, weights, SliceRows(x, spec.d_model, t, t + 1))),
                kExact)
          << "row " << t;
    }
  }
}

TEST(AttentionReferenceTest, CausalRowsIgnoreLaterTokensAndDifferFromNonCausal) {
  std::mt19937_64 rng(9);
  for (LayerSpec spec : AllVariants()) {
    SCOPED_TRACE(LayerSpecSummary(spec));
    const LayerWeights weights = Weights(spec, 13);
    const int64_t len = 10;
    const int d = spec.d_model;
    const std::vector<double> x = RandomHidden(len, d, rng);
    const std::vector<double> causal = ReferenceAttention(spec, weights, x, IotaPositions(len));
    const std::vector<double> prefix =
        ReferenceAttention(spec, weights, SliceRows(x, d, 0, 4), IotaPositions(4));
    EXPECT_LT(RelativeError(SliceRows(causal, d, 0, 4), prefix), kExact);

    spec.causal = false;
    const std::vector<double> bidir = ReferenceAttention(spec, weights, x, IotaPositions(len));
    // Every row but the last sees more keys; the last row sees the same ones.
    EXPECT_GT(RelativeError(SliceRows(bidir, d, 0, len - 1), SliceRows(causal, d, 0, len - 1)),
              1e-3);
    EXPECT_LT(RelativeError(SliceRows(bidir, d, len - 1, len), SliceRows(causal, d, len - 1, len)),
              kExact);
  }
}

TEST(AttentionReferenceTest, SlidingWindowMatchesTruncatedHistory) {
  // With window W, the last row equals the last row of the sequence cut to its last W tokens,
  // provided RoPE positions travel with the tokens (RoPE scores depend on position differences).
  std::mt19937_64 rng(10);
  for (LayerSpec spec : AllVariants()) {
    SCOPED_TRACE(LayerSpecSummary(spec));
    spec.sliding_window = 4;
    const LayerWeights weights = Weights(spec, 14);
    const int64_t len = 11;
    const int d = spec.d_model;
    const std::vector<double> x = RandomHidden(len, d, rng);
    const std::vector<double> full = ReferenceAttention(spec, weights, x, IotaPositions(len));
    spec.sliding_window = 0;
    const std::vector<double> tail =
        ReferenceAttention(spec, weights, SliceRows(x, d, len - 4, len), IotaPositions(4, len - 4));
    EXPECT_LT(RelativeError(SliceRows(full, d, len - 1, len), SliceRows(tail, d, 3, 4)), 1e-10);
  }
}

TEST(AttentionReferenceTest, RopeDependsOnlyOnRelativePositions) {
  std::mt19937_64 rng(11);
  for (const LayerSpec& spec : AllVariants()) {
    SCOPED_TRACE(LayerSpecSummary(spec));
    const LayerWeights weights = Weights(spec, 15);
    const int64_t len = 7;
    const std::vector<double> x = RandomHidden(len, spec.d_model, rng);
    const std::vector<double> a = ReferenceAttention(spec, weights, x, IotaPositions(len));
    const std::vector<double> b = ReferenceAttention(spec, weights, x, IotaPositions(len, 500));
    EXPECT_LT(RelativeError(a, b), 1e-10);
    if (spec.rope != RopeLayout::kNone) {
      // Non-uniform gaps change the result.
      const std::vector<double> c = ReferenceAttention(spec, weights, x, {0, 3, 4, 10, 11, 12, 40});
      EXPECT_GT(RelativeError(c, a), 1e-4);
    }
  }
}

// GQA equals MHA whose K/V projections repeat each kv head over its group of query heads.
TEST(AttentionReferenceTest, GqaEqualsMhaWithRepeatedKvHeads) {
  const LayerSpec gqa = Gqa(6, 2, 4);
  LayerSpec mha = Gqa(6, 6, 4);
  const LayerWeights gqa_weights = Weights(gqa, 16);
  LayerWeights mha_weights = gqa_weights;
  const int group = 3;
  const int d = gqa.d_model;
  const int dim = gqa.head_dim;
  for (const std::string proj : {"k_proj", "v_proj"}) {
    const std::vector<float> w = gqa_weights.at(proj + ".weight").ToFloats();
    const std::vector<float> b = gqa_weights.at(proj + ".bias").ToFloats();
    std::vector<float> w_rep;
    std::vector<float> b_rep;
    for (int h = 0; h < mha.num_heads; ++h) {
      const int src = h / group;
      w_rep.insert(w_rep.end(), w.begin() + src * dim * d, w.begin() + (src + 1) * dim * d);
      b_rep.insert(b_rep.end(), b.begin() + src * dim, b.begin() + (src + 1) * dim);
    }
    mha_weights[proj + ".weight"] = Tensor::FromFloats({mha.num_heads * dim, d}, w_rep);
    mha_weights[proj + ".bias"] = Tensor::FromFloats({mha.num_heads * dim}, b_rep);
  }
  ASSERT_TRUE(ValidateLayerWeights(mha, mha_weights).ok());
  std::mt19937_64 rng(17);
  const std::vector<double> x = RandomHidden(8, d, rng);
  EXPECT_LT(RelativeError(ReferenceAttention(gqa, gqa_weights, x, IotaPositions(8)),
                          ReferenceAttention(mha, mha_weights, x, IotaPositions(8))),
            kExact);
}

TEST(AttentionReferenceTest, KvRoundingPerturbsByAboutUnitRoundoff) {
  std::mt19937_64 rng(12);
  for (const LayerSpec& spec : AllVariants()) {
    SCOPED_TRACE(LayerSpecSummary(spec));
    const LayerWeights weights = Weights(spec, 18);
    const std::vector<double> x = RandomHidden(20, spec.d_model, rng);
    const std::vector<double> exact = ReferenceAttention(spec, weights, x, IotaPositions(20));
    const std::vector<double> rounded =
        ReferenceAttention(spec, weights, x, IotaPositions(20), {.kv_round = DType::kBF16});
    const double error = RelativeError(rounded, exact);
    EXPECT_GT(error, 1e-5);
    EXPECT_LT(error, 1e-2);
  }
}

TEST(ReferenceHelpersTest, TensorRoundTripAndErrors) {
  const std::vector<double> values = {1.0, -2.5, 1.0 + 1.0 / 1024};
  EXPECT_EQ(ToDoubles(ToTensor(values, {3}, DType::kF32)), values);
  const std::vector<double> bf16 = RoundTo(values, DType::kBF16);
  EXPECT_EQ(bf16[0], 1.0);
  EXPECT_EQ(bf16[1], -2.5);
  EXPECT_EQ(bf16[2], 1.0);  // 2^-10 is below bf16's half-ulp at 1 (2^-8).
  EXPECT_EQ(RoundTo(values, DType::kF16)[2], 1.0 + 1.0 / 1024);
  EXPECT_EQ(ToTensor(values, {1, 3}, DType::kF16).dtype(), DType::kF16);

  EXPECT_DOUBLE_EQ(RelativeError({3.0, 4.0}, {0.0, 5.0}), std::sqrt(9.0 + 1.0) / 5.0);
  EXPECT_TRUE(std::isinf(RelativeError({1.0}, {1.0, 2.0})));
  EXPECT_FALSE(RelativeError({std::nan("")}, {1.0}) < 1.0);
  EXPECT_FALSE(MaxRelativeError({std::nan("")}, {1.0}) < 1.0);
}

}  // namespace
}  // namespace attnserve::reference
