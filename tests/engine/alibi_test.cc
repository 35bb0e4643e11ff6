// ALiBi (LayerSpec::alibi, BLOOM's and MPT's slopes) on the CPU engine against the float64
// reference (tests/reference/attention_reference.h), whose slopes and biases are written the way
// transformers computes them and share no code with the engine's AlibiBias hook.
//
// The cases cross every boundary a bias could be misplaced at: prefill in one call and in uneven
// chunks, decode steps after them, sliding windows whose edge moves across 16-token pages, GQA
// groups (the bias is per query head, not per KV head), head counts that are not powers of two
// (the slopes' second series), and a decode over more than 512 keys, which the decode kernel
// splits (each split's logits must carry the biases of its own keys).
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/capabilities.h"
#include "kernels/cpu/cpu_capabilities.h"
#include "kernels/cuda/cuda_capabilities.h"
#include "kernels/spec/attention_variation.h"
#include "kernels/spec/layer_spec.h"
#include "tests/reference/attention_reference.h"
#include "tests/reference/test_cases.h"

namespace attnserve::reference {
namespace {

constexpr double kF32Bound = 1e-4;

LayerSpec AlibiSpec(Alibi alibi, int heads, int kv_heads, int head_dim, int window) {
  LayerSpec spec = StandardSpec(heads, kv_heads, head_dim, RopeLayout::kNone);
  spec.d_model = 96;
  spec.qkv_bias = spec.o_bias = true;  // BLOOM's projections are biased.
  spec.alibi = alibi;
  spec.sliding_window = window;
  return spec;
}

// transformers' slopes, written out for two head counts (torch: build_alibi_tensor(n, ...) and
// build_mpt_alibi_tensor(n, ...)[:, 0, -1] / -1 at alibi_bias_max 8), and the hook against the
// reference for every head count up to 40.
TEST(AlibiSlopesTest, MatchTransformers) {
  LayerSpec spec = AlibiSpec(Alibi::kBloom, 6, 6, 16, 0);
  EXPECT_EQ(AlibiSlopesReference(spec),
            (std::vector<double>{0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125}));
  spec.alibi = Alibi::kMpt;
  spec.alibi_bias_max = 16.0f;  // n = 8: 2^-(2 (i + 1)), odd i first.
  EXPECT_EQ(AlibiSlopesReference(spec),
            (std::vector<double>{0x1p-4, 0x1p-8, 0x1p-12, 0x1p-16, 0x1p-2, 0x1p-6}));
  for (Alibi alibi : {Alibi::kBloom, Alibi::kMpt}) {
    for (float bias_max : {8.0f, 12.5f}) {
      for (int heads = 1; heads <= 40; ++heads) {
        spec = AlibiSpec(alibi, heads, heads, 16, 0);
        spec.alibi_bias_max = bias_max;
        SCOPED_TRACE(absl::StrCat(AlibiName(alibi), " heads ", heads, " bias_max ", bias_max));
        const std::vector<double> expected = AlibiSlopesReference(spec);
        ASSERT_EQ(expected.size(), static_cast<size_t>(heads));
        const AttentionVariation variation = AttentionVariation::FromSpec(spec);
        for (int h = 0; h < heads; ++h) {
          EXPECT_NEAR(variation.alibi.Slope(h), expected[h], 1e-7 * expected[h]) << "head " << h;
        }
      }
    }
  }
}

// Prefill in `chunks` (token counts), then one decode step per remaining token of `hidden`; the
// outputs of every row, in order.
std::vector<double> RunSequence(AttentionLayer& layer, const LayerSpec& spec,
                                const std::vector<double>& hidden, int64_t len,
                                const std::vector<int64_t>& chunks) {
  const int d = spec.d_model;
  const SequenceId id = layer.CreateSequence();
  std::vector<double> out;
  int64_t begin = 0;
  for (int64_t count : chunks) {
    const std::vector<double> part(hidden.begin() + begin * d,
                                   hidden.begin() + (begin + count) * d);
    const PrefillChunk chunk{.sequence = id, .num_tokens = count};
    absl::StatusOr<Tensor> y =
        layer.Prefill({&chunk, 1}, ToTensor(part, {count, d}, DType::kF32), {});
    EXPECT_TRUE(y.ok()) << y.status();
    if (!y.ok()) return {};
    const std::vector<double> rows = ToDoubles(*y);
    out.insert(out.end(), rows.begin(), rows.end());
    begin += count;
  }
  for (; begin < len; ++begin) {
    const std::vector<double> row(hidden.begin() + begin * d, hidden.begin() + (begin + 1) * d);
    absl::StatusOr<Tensor> y = layer.Decode({&id, 1}, ToTensor(row, {1, d}, DType::kF32), {});
    EXPECT_TRUE(y.ok()) << y.status();
    if (!y.ok()) return {};
    const std::vector<double> rows = ToDoubles(*y);
    out.insert(out.end(), rows.begin(), rows.end());
  }
  EXPECT_TRUE(layer.ReleaseSequence(id).ok());
  return out;
}

struct AlibiCase {
  std::string name;
  LayerSpec spec;
  int64_t len;
  std::vector<std::vector<int64_t>> chunkings;  // Prefill chunks; the rest decoded.
};

std::vector<AlibiCase> Cases() {
  LayerSpec mpt_gqa = AlibiSpec(Alibi::kMpt, 12, 4, 16, 0);
  mpt_gqa.alibi_bias_max = 16.0f;  // Steeper than MPT's 8, so the far keys weigh nothing.
  LayerSpec mpt_rope = AlibiSpec(Alibi::kMpt, 8, 2, 16, 0);
  mpt_rope.rope = RopeLayout::kHalf;  // The bias composes with RoPE (positions = indices here).
  LayerSpec bloom_mqa_hd48 = AlibiSpec(Alibi::kBloom, 6, 1, 48, 0);
  bloom_mqa_hd48.d_model = 288;
  return {
      {"bloom_mha12", AlibiSpec(Alibi::kBloom, 12, 12, 8, 0), 61, {{61}, {13, 24}, {1}, {16, 17}}},
      {"bloom_mha12_window20",
       AlibiSpec(Alibi::kBloom, 12, 12, 8, 20),
       77,
       {{77}, {30, 15}, {17}, {40}}},
      {"mpt_gqa12_4", mpt_gqa, 53, {{53}, {16, 16}, {5, 11, 20}}},
      {"mpt_gqa8_2_rope_window7",
       [&] {
         LayerSpec s = mpt_rope;
         s.sliding_window = 7;
         return s;
       }(),
       45,
       {{45}, {9, 8}}},
      {"bloom_mqa6_hd48", bloom_mqa_hd48, 39, {{39}, {20}}},
      // Past 512 keys: decode splits each step's keys; windows of 300 cross the splits' pages.
      {"bloom_mha5_long", AlibiSpec(Alibi::kBloom, 5, 5, 16, 0), 620, {{600}, {290, 300}}},
      {"mpt_gqa6_3_long_window300",
       [] {
         LayerSpec s = AlibiSpec(Alibi::kMpt, 6, 3, 16, 300);
         s.alibi_bias_max = 4.0f;  // Shallow slopes: far keys keep weight.
         return s;
       }(),
       620,
       {{600}, {150, 455}}},
  };
}

TEST(AlibiEngineTest, PrefillChunksAndDecodeMatchReference) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(SeedNote(seed));
  std::mt19937_64 rng(seed);
  for (const AlibiCase& c : Cases()) {
    SCOPED_TRACE(c.name);
    ASSERT_TRUE(ValidateLayerSpec(c.spec).ok()) << ValidateLayerSpec(c.spec);
    const LayerWeights weights = TestWeights(c.spec, seed);
    for (int page_size : {16, 5}) {
      SCOPED_TRACE(absl::StrCat("page_size ", page_size));
      absl::StatusOr<TestEngine> engine =
          MakeEngine(c.spec, weights, {.page_size = page_size, .max_pages = 4096});
      ASSERT_TRUE(engine.ok()) << engine.status();
      const std::vector<double> hidden = RandomHidden(c.len, c.spec.d_model, rng);
      const std::vector<double> exact =
          ReferenceAttention(c.spec, weights, hidden, IotaPositions(c.len));
      // Without the bias the answer must differ, or the case would not test it.
      LayerSpec plain = c.spec;
      plain.alibi = Alibi::kNone;
      ASSERT_GT(
          RelativeError(ReferenceAttention(plain, weights, hidden, IotaPositions(c.len)), exact),
          1e-2);
      for (const std::vector<int64_t>& chunks : c.chunkings) {
        SCOPED_TRACE(absl::StrCat("chunks ", absl::StrJoin(chunks, "+")));
        const std::vector<double> actual =
            RunSequence(*engine->layer, c.spec, hidden, c.len, chunks);
        EXPECT_LE(RelativeError(actual, exact), kF32Bound);
        // The decoded rows alone too: they are few of the long cases' rows.
        int64_t prefilled = 0;
        for (int64_t n : chunks) prefilled += n;
        if (prefilled < c.len) {
          const int d = c.spec.d_model;
          EXPECT_LE(RelativeError(SliceRows(actual, d, prefilled, c.len),
                                  SliceRows(exact, d, prefilled, c.len)),
                    kF32Bound)
              << "decoded rows";
        }
      }
    }
  }
}

// Both tables serve ALiBi (the CUDA kernels through variant_hooks.cuh's TransformLogit; their
// numerics: tests/gpu/cuda_backend_test.cc's ALiBi cases), BLOOM's and MPT's alike.
TEST(AlibiCapabilitiesTest, CudaAndCpuServe) {
  const KvCacheConfig kv_config{.page_size = 16};
  for (Alibi alibi : {Alibi::kBloom, Alibi::kMpt}) {
    const LayerSpec spec = AlibiSpec(alibi, 12, 4, 64, 40);
    SCOPED_TRACE(AlibiName(alibi));
    EXPECT_TRUE(CheckCapabilities(CudaCapabilities(), spec, kv_config).ok());
    EXPECT_TRUE(CheckCapabilities(CpuCapabilities(), spec, kv_config).ok());
  }
}

TEST(AlibiSpecTest, MlaAndBadBiasMaxAreRefused) {
  LayerSpec spec = AlibiSpec(Alibi::kMpt, 8, 8, 16, 0);
  spec.alibi_bias_max = 0.0f;
  EXPECT_EQ(ValidateLayerSpec(spec).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(ValidateLayerSpec(spec).message().find("alibi_bias_max"), absl::string_view::npos);
  LayerSpec mla = FindSpec("mla_q0_interleaved").spec;
  mla.alibi = Alibi::kBloom;
  EXPECT_NE(ValidateLayerSpec(mla).message().find("alibi = bloom"), absl::string_view::npos);
}

}  // namespace
}  // namespace attnserve::reference
