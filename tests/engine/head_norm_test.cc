// The pre-RoPE q/k norm hook (HeadRmsNorm, kernels/spec/attention_variation.h) as FromSpec builds
// it for each QkNorm kind, against float64 formulas written here: LayerNorm per head with each
// head's own scale (StableLM 2, Cohere), and the RMSNorm forms it extends, whose floats must stay
// what they were before LayerNorm joined the hook (written out as the hook computed them then).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/spec/attention_variation.h"
#include "kernels/spec/layer_spec.h"

namespace attnserve {
namespace {

constexpr int kHeads = 4;
constexpr int kDim = 16;

LayerSpec Spec(QkNorm norm) {
  LayerSpec spec;
  spec.variant = AttentionVariant::kGQA;
  spec.d_model = kHeads * kDim;
  spec.num_heads = kHeads;
  spec.num_kv_heads = 2;
  spec.head_dim = kDim;
  spec.qk_norm = norm;
  spec.qk_norm_eps = 1e-5f;
  return spec;
}

// One row's q heads, off-centre (a mean of about 3 per head) so that centring matters.
std::vector<float> Row(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<float> x(kHeads * kDim);
  for (int h = 0; h < kHeads; ++h) {
    for (int i = 0; i < kDim; ++i) x[h * kDim + i] = 3.0f + h + value(rng);
  }
  return x;
}

std::vector<float> Scales(int64_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> value(0.5f, 1.5f);
  std::vector<float> w(count);
  for (float& v : w) v = value(rng);
  return w;
}

TEST(HeadNormTest, LayerNormPerHeadWithEachHeadsScale) {
  const LayerSpec spec = Spec(QkNorm::kLayerNorm);
  const std::vector<float> scale = Scales(QkNormWidth(spec, kHeads), 7);
  ASSERT_EQ(scale.size(), static_cast<size_t>(kHeads * kDim));
  const AttentionVariation v =
      AttentionVariation::FromSpec(spec, {nullptr, scale.data(), scale.data(), nullptr});
  ASSERT_TRUE(v.qk_norm.active());
  const std::vector<float> x = Row(1);
  std::vector<float> y = x;
  v.qk_norm.Apply(y.data(), kHeads, v.qk_norm.q_scale);
  for (int h = 0; h < kHeads; ++h) {
    double mean = 0.0, var = 0.0;
    for (int i = 0; i < kDim; ++i) mean += x[h * kDim + i];
    mean /= kDim;
    for (int i = 0; i < kDim; ++i) var += (x[h * kDim + i] - mean) * (x[h * kDim + i] - mean);
    var /= kDim;
    for (int i = 0; i < kDim; ++i) {
      const int k = h * kDim + i;
      const double want = (x[k] - mean) / std::sqrt(var + 1e-5) * scale[k];
      EXPECT_NEAR(y[k], want, 1e-6 * (1.0 + std::abs(want))) << "head " << h << " dim " << i;
    }
  }
}

// The RMSNorm kinds: per head with one [head_dim] scale (Qwen3), and across heads with a scale of
// [heads * head_dim] (OLMo 2), bit for bit as the hook computed them before it took LayerNorm.
TEST(HeadNormTest, RmsNormFloatsUnchanged) {
  for (const QkNorm norm : {QkNorm::kRms, QkNorm::kRmsAcrossHeads}) {
    const LayerSpec spec = Spec(norm);
    const std::vector<float> scale = Scales(QkNormWidth(spec, kHeads), 11);
    const AttentionVariation v =
        AttentionVariation::FromSpec(spec, {nullptr, scale.data(), scale.data(), nullptr});
    const std::vector<float> x = Row(2);
    std::vector<float> y = x;
    v.qk_norm.Apply(y.data(), kHeads, scale.data());
    const int64_t width = norm == QkNorm::kRmsAcrossHeads ? kHeads * kDim : kDim;
    std::vector<float> want = x;
    for (int64_t part = 0; part < kHeads * kDim; part += width) {
      double sum_sq = 0.0;
      for (int64_t i = 0; i < width; ++i) sum_sq += double{want[part + i]} * want[part + i];
      const float inv_rms = static_cast<float>(1.0 / std::sqrt(sum_sq / width + spec.qk_norm_eps));
      for (int64_t i = 0; i < width; ++i) want[part + i] = want[part + i] * inv_rms * scale[i];
    }
    EXPECT_EQ(std::memcmp(y.data(), want.data(), y.size() * sizeof(float)), 0) << QkNormName(norm);
  }
}

}  // namespace
}  // namespace attnserve
