// MHA -> GQA/MQA conversion by mean-pooling K/V heads (kernels/model/kv_head_pooling.h): identity
// at the same head count, the pooled values against a float64 computation written out here, the
// grouping against the engine's head-to-group mapping, refusals, and the converted layer's output
// error against the MHA layer on fresh random inputs (recorded as test properties).
#include "kernels/model/kv_head_pooling.h"

#include <cmath>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/reference/attention_reference.h"
#include "tests/reference/test_cases.h"

namespace attnserve::reference {
namespace {

using ::testing::HasSubstr;

LayerSpec MhaSpec(int d_model, int heads, int head_dim, bool biases) {
  LayerSpec spec = StandardSpec(heads, heads, head_dim, RopeLayout::kHalf);
  spec.d_model = d_model;
  spec.qkv_bias = biases;
  spec.o_bias = biases;
  return spec;
}

KvCacheConfig SmallPool() {
  KvCacheConfig config;
  config.max_pages = 64;
  return config;
}

bool SameBits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.data(), b.data(), a.num_bytes()) == 0;
}

TEST(KvHeadPoolingTest, PoolingToTheSameHeadCountIsTheIdentity) {
  const LayerSpec mha = MhaSpec(64, 8, 16, /*biases=*/true);
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(std::string(DTypeName(dtype)));
    LayerWeights weights = TestWeights(mha, 7);
    for (auto& [name, tensor] : weights) tensor = tensor.CastTo(dtype);
    absl::StatusOr<LayerWeights> pooled = PoolKvHeads(mha, weights, 8);
    ASSERT_TRUE(pooled.ok()) << pooled.status();
    ASSERT_EQ(pooled->size(), weights.size());
    for (const auto& [name, tensor] : weights) {
      EXPECT_TRUE(SameBits(pooled->at(name), tensor)) << name;
    }
  }
  absl::StatusOr<LayerSpec> spec = PooledKvSpec(mha, 8);
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->variant, AttentionVariant::kMHA);
}

TEST(KvHeadPoolingTest, PooledValuesEqualAFloat64MeanOverEachGroupOfConsecutiveHeads) {
  const int heads = 4, head_dim = 4, d_model = 5;
  const LayerSpec mha = MhaSpec(d_model, heads, head_dim, /*biases=*/true);
  const LayerWeights weights = TestWeights(mha, 11);
  ASSERT_FALSE(weights.empty());
  for (int kv_heads : {2, 1}) {
    SCOPED_TRACE(absl::StrCat(kv_heads, " KV heads"));
    absl::StatusOr<LayerWeights> pooled = PoolKvHeads(mha, weights, kv_heads);
    ASSERT_TRUE(pooled.ok()) << pooled.status();
    const int group = heads / kv_heads;
    for (const std::string name : {"k_proj", "v_proj"}) {
      const std::vector<float> w = weights.at(name + ".weight").ToFloats();
      const std::vector<float> b = weights.at(name + ".bias").ToFloats();
      const std::vector<float> pw = pooled->at(name + ".weight").ToFloats();
      const std::vector<float> pb = pooled->at(name + ".bias").ToFloats();
      ASSERT_EQ(pw.size(), size_t{1} * kv_heads * head_dim * d_model);
      ASSERT_EQ(pb.size(), size_t{1} * kv_heads * head_dim);
      for (int t = 0; t < kv_heads; ++t) {
        for (int r = 0; r < head_dim; ++r) {
          double bias_sum = 0;
          for (int s = t * group; s < (t + 1) * group; ++s) bias_sum += b[s * head_dim + r];
          EXPECT_EQ(pb[t * head_dim + r], static_cast<float>(bias_sum / group)) << name;
          for (int c = 0; c < d_model; ++c) {
            double sum = 0;
            for (int s = t * group; s < (t + 1) * group; ++s) {
              sum += w[(s * head_dim + r) * d_model + c];
            }
            EXPECT_EQ(pw[(t * head_dim + r) * d_model + c], static_cast<float>(sum / group))
                << name << " head " << t << " row " << r << " column " << c;
          }
        }
      }
    }
    for (const std::string name :
         {"q_proj.weight", "q_proj.bias", "o_proj.weight", "o_proj.bias"}) {
      EXPECT_TRUE(SameBits(pooled->at(name), weights.at(name))) << name;
    }
  }
}

// The grouping must be the one the engine uses (query head h reads KV head h / group): a GQA layer
// with the pooled weights computes what the MHA layer computes after each of its K/V heads is
// replaced by its group's mean. Pairing heads any other way (h % kv_heads) fails this.
TEST(KvHeadPoolingTest, GroupsAreTheQueryHeadsThatShareAKvHeadInTheEngine) {
  const int heads = 8, head_dim = 8, kv_heads = 2;
  const LayerSpec mha = MhaSpec(32, heads, head_dim, /*biases=*/true);
  const LayerWeights weights = TestWeights(mha, 3);
  absl::StatusOr<LayerWeights> pooled = PoolKvHeads(mha, weights, kv_heads);
  ASSERT_TRUE(pooled.ok()) << pooled.status();
  absl::StatusOr<LayerSpec> gqa = PooledKvSpec(mha, kv_heads);
  ASSERT_TRUE(gqa.ok());
  EXPECT_EQ(gqa->variant, AttentionVariant::kGQA);

  // The MHA layer with every K/V head replaced by the mean of the K/V heads of the query heads
  // that share its KV head in the engine (h / group), computed here from the MHA weights.
  const int group = heads / kv_heads;
  LayerWeights repeated = weights;
  for (const std::string name : {"k_proj.weight", "v_proj.weight", "k_proj.bias", "v_proj.bias"}) {
    const std::vector<float> w = weights.at(name).ToFloats();
    const int64_t width = head_dim * (name.ends_with("bias") ? 1 : mha.d_model);
    std::vector<float> averaged(w.size());
    for (int h = 0; h < heads; ++h) {
      const int first = h / group * group;
      for (int64_t i = 0; i < width; ++i) {
        double sum = 0;
        for (int s = first; s < first + group; ++s) sum += w[s * width + i];
        averaged[h * width + i] = static_cast<float>(sum / group);
      }
    }
    repeated[name] = Tensor::FromFloats(weights.at(name).shape(), averaged);
  }
  std::mt19937_64 rng(5);
  const int64_t length = 13;
  const std::vector<double> hidden = RandomHidden(length, mha.d_model, rng);
  const std::vector<int64_t> positions = IotaPositions(length);
  const std::vector<double> want = ReferenceAttention(mha, repeated, hidden, positions);
  absl::StatusOr<TestEngine> engine = MakeEngine(*gqa, *pooled, SmallPool());
  ASSERT_TRUE(engine.ok()) << engine.status();
  const PrefillChunk chunk{.sequence = engine->layer->CreateSequence(), .num_tokens = length};
  absl::StatusOr<Tensor> out =
      engine->layer->Prefill({&chunk, 1}, ToTensor(hidden, {length, mha.d_model}, DType::kF32), {});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_LE(RelativeError(ToDoubles(*out), want), 1e-5);
}

TEST(KvHeadPoolingTest, RefusesMlaAndCountsThatDoNotDivideByName) {
  const LayerSpec mha = MhaSpec(64, 8, 8, /*biases=*/false);
  const LayerWeights weights = TestWeights(mha, 1);
  for (int bad : {3, 0, 16, -2}) {
    absl::StatusOr<LayerWeights> pooled = PoolKvHeads(mha, weights, bad);
    ASSERT_EQ(pooled.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(pooled.status().message(), HasSubstr(absl::StrCat("num_kv_heads = ", bad)));
    EXPECT_THAT(pooled.status().message(), HasSubstr("8 KV heads"));
  }
  const LayerSpec mla = MlaSpec(0, 32, 16, 8, 16, RopeLayout::kInterleaved);
  absl::StatusOr<LayerWeights> from_mla = PoolKvHeads(mla, TestWeights(mla, 1), 1);
  ASSERT_EQ(from_mla.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(from_mla.status().message(), HasSubstr("is mla"));
  ASSERT_EQ(MhaSourceSpec(mla).status().code(), absl::StatusCode::kInvalidArgument);
  // Weights that do not fit the source spec are refused as ValidateLayerWeights refuses them.
  LayerWeights missing = weights;
  missing.erase("v_proj.weight");
  absl::StatusOr<LayerWeights> incomplete = PoolKvHeads(mha, missing, 2);
  ASSERT_EQ(incomplete.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(incomplete.status().message(), HasSubstr("v_proj.weight"));
}

// A k norm with a scale per KV head (per-head LayerNorm) or across them (OLMo 2) has no scale for
// a pooled head: refused by name, where a shared per-head scale (Qwen3) pools as before.
TEST(KvHeadPoolingTest, RefusesKNormsWhoseScaleSpansTheKvHeads) {
  for (const QkNorm norm : {QkNorm::kLayerNorm, QkNorm::kRmsAcrossHeads}) {
    LayerSpec source = StandardSpec(8, 8, 16, RopeLayout::kHalf);
    source.qk_norm = norm;
    absl::StatusOr<LayerSpec> pooled = PooledKvSpec(source, 2);
    EXPECT_EQ(pooled.status().code(), absl::StatusCode::kInvalidArgument) << QkNormName(norm);
    EXPECT_THAT(pooled.status().message(),
                HasSubstr(absl::StrCat("qk_norm = ", QkNormName(norm),
                                       ": the k norm's scale spans the 8 KV heads")));
    EXPECT_TRUE(PooledKvSpec(source, 8).ok()) << QkNormName(norm);  // Nothing pooled.
  }
  LayerSpec qwen3 = StandardSpec(8, 8, 16, RopeLayout::kHalf);
  qwen3.qk_norm = QkNorm::kRms;
  EXPECT_TRUE(PooledKvSpec(qwen3, 2).ok());
}

TEST(KvHeadPoolingTest, MhaSourceSpecIsTheTargetWithEveryHeadItsOwnKvHead) {
  LayerSpec gqa = StandardSpec(8, 2, 16, RopeLayout::kHalf);
  gqa.sliding_window = 32;
  absl::StatusOr<LayerSpec> mha = MhaSourceSpec(gqa);
  ASSERT_TRUE(mha.ok());
  EXPECT_EQ(mha->variant, AttentionVariant::kMHA);
  EXPECT_EQ(mha->num_kv_heads, 8);
  EXPECT_EQ(mha->sliding_window, 32);
  EXPECT_EQ(mha->head_dim, 16);
}

// The comparison's setting (docs/comparison.md: d_model 512, 8 heads of 64): the converted
// layers' outputs against the MHA layer's on random inputs the weights never saw. Pooling loses
// information, so the error is positive and grows as heads are merged; it must be finite. The
// numbers are recorded.
TEST(KvHeadPoolingTest, ConvertedLayerOutputErrorAgainstMhaIsFiniteAndReported) {
  const LayerSpec mha = MhaSpec(512, 8, 64, /*biases=*/false);
  const LayerWeights weights = TestWeights(mha, 2024);
  std::random_device entropy;  // Fresh inputs each run; the seed is printed for a rerun.
  const uint64_t input_seed = (uint64_t{entropy()} << 32) | entropy();
  SCOPED_TRACE(absl::StrCat("input seed ", input_seed));
  std::mt19937_64 rng(input_seed);
  const int64_t length = 64;
  const std::vector<double> hidden = RandomHidden(length, mha.d_model, rng, 1.0);
  const Tensor input = ToTensor(hidden, {length, mha.d_model}, DType::kF32);
  auto run = [&](const LayerSpec& spec, const LayerWeights& layer_weights) -> std::vector<double> {
    absl::StatusOr<TestEngine> engine = MakeEngine(spec, layer_weights, SmallPool());
    EXPECT_TRUE(engine.ok()) << engine.status();
    if (!engine.ok()) return {};
    const PrefillChunk chunk{.sequence = engine->layer->CreateSequence(), .num_tokens = length};
    absl::StatusOr<Tensor> out = engine->layer->Prefill({&chunk, 1}, input, {});
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? ToDoubles(*out) : std::vector<double>{};
  };
  const std::vector<double> reference = run(mha, weights);
  ASSERT_FALSE(reference.empty());
  for (int kv_heads : {8, 4, 2, 1}) {
    absl::StatusOr<LayerSpec> spec = PooledKvSpec(mha, kv_heads);
    absl::StatusOr<LayerWeights> pooled = PoolKvHeads(mha, weights, kv_heads);
    ASSERT_TRUE(spec.ok() && pooled.ok()) << pooled.status();
    const std::vector<double> out = run(*spec, *pooled);
    ASSERT_EQ(out.size(), reference.size());
    double dot = 0, norm_out = 0, norm_ref = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      dot += out[i] * reference[i];
      norm_out += out[i] * out[i];
      norm_ref += reference[i] * reference[i];
    }
    const double relative_l2 = RelativeError(out, reference);
    const double cosine = dot / std::sqrt(norm_out * norm_ref);
    std::cout << "kv_heads " << kv_heads << ": relative L2 " << relative_l2 << ", cosine " << cosine
              << "\n";
    ::testing::Test::RecordProperty(absl::StrCat("relative_l2_kv", kv_heads),
                                    absl::StrCat(relative_l2));
    ::testing::Test::RecordProperty(absl::StrCat("cosine_kv", kv_heads), absl::StrCat(cosine));
    ASSERT_TRUE(std::isfinite(relative_l2) && std::isfinite(cosine));
    if (kv_heads == 8) {
      EXPECT_EQ(relative_l2, 0.0);  // The same weights: the same engine output, bit for bit.
    } else {
      EXPECT_GT(relative_l2, 1e-3);  // Distinct heads were merged: the output must move.
      EXPECT_LT(cosine, 1.0);
    }
  }
}

}  // namespace
}  // namespace attnserve::reference
