// RotaryPositions (kernels/spec/attention_variation.h), the RoPE hooks both backends call: the
// CPU layers' per-row table path (RotateRows) against the per-pair path the CUDA kernels take
// (PairCosSin, RotatePair into another buffer), and both against the float64 RoPE of
// tests/reference at positions up to 2^20, where float32 angles would be off by ~0.06 rad.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/spec/attention_variation.h"
#include "kernels/spec/layer_spec.h"
#include "kernels/spec/rope_frequencies.h"
#include "tests/reference/attention_reference.h"

namespace attnserve {
namespace {

constexpr int kHeads = 3;
const std::vector<int64_t> kPositions = {0, 1, 7, 4095, 4096, 65537, 1 << 20};

LayerSpec Spec(RopeLayout layout, int head_dim, int rotary_dim) {
  LayerSpec spec;
  spec.variant = AttentionVariant::kGQA;
  spec.d_model = 64;
  spec.num_heads = kHeads;
  spec.num_kv_heads = kHeads;
  spec.head_dim = head_dim;
  spec.rope = layout;
  spec.rope_theta = 10000.0;
  spec.rotary_dim = rotary_dim;  // 0: all of head_dim.
  return spec;
}

// [positions, kHeads, head_dim] values in [-2, 2).
std::vector<float> Rows(int head_dim, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> value(-2.0f, 2.0f);
  std::vector<float> x(kPositions.size() * kHeads * head_dim);
  for (float& v : x) v = value(rng);
  return x;
}

struct Case {
  RopeLayout layout;
  int head_dim;
  int rotary_dim;
};

class RotaryPositionsTest : public testing::TestWithParam<Case> {};

// The CPU's table path and the CUDA kernels' pair path compute the same floats.
TEST_P(RotaryPositionsTest, TableAndPairPathsAgreeBitForBit) {
  const Case c = GetParam();
  const LayerSpec spec = Spec(c.layout, c.head_dim, c.rotary_dim);
  ASSERT_TRUE(ValidateLayerSpec(spec).ok()) << ValidateLayerSpec(spec);
  const std::vector<double> inv_freq = RopeInverseFrequencies(spec);
  const RotaryPositions rope =
      AttentionVariation::FromSpec(spec, {.rope_inv_freq = inv_freq.data()}).rope;
  ASSERT_TRUE(rope.active());
  const std::vector<float> in = Rows(c.head_dim, 1);
  const int64_t row_width = int64_t{kHeads} * c.head_dim;

  std::vector<float> table_path = in;
  std::vector<float> table(rope.rotary_dim);
  rope.RotateRows(table_path.data(), static_cast<int64_t>(kPositions.size()), row_width, kHeads,
                  c.head_dim, kPositions.data(), table.data());

  std::vector<float> pair_path = in;  // Rotated pairs written here from `in`; the rest copied.
  for (size_t r = 0; r < kPositions.size(); ++r) {
    for (int h = 0; h < kHeads; ++h) {
      const int64_t offset = static_cast<int64_t>(r) * row_width + int64_t{h} * c.head_dim;
      for (int i = 0; i < rope.pairs(); ++i) {
        float cos_i, sin_i;
        rope.PairCosSin(kPositions[r], i, &cos_i, &sin_i);
        rope.RotatePair(in.data() + offset, pair_path.data() + offset, i, cos_i, sin_i);
      }
    }
  }
  EXPECT_EQ(std::memcmp(table_path.data(), pair_path.data(), in.size() * sizeof(float)), 0);
}

// Against float64 RoPE: each output is a ∓ b products of float-rounded cos and sin, so it is off
// by at most ~3 float32 roundings of |a| + |b| <= 4 (2^-24 each, ~7e-7); 2e-6 leaves room, and a
// float32 angle at position 2^20 would be off by ~0.06 rad. Dims past rotary_dim are unchanged.
TEST_P(RotaryPositionsTest, MatchesFloat64Reference) {
  const Case c = GetParam();
  const LayerSpec spec = Spec(c.layout, c.head_dim, c.rotary_dim);
  const std::vector<double> inv_freq = RopeInverseFrequencies(spec);
  const RotaryPositions rope =
      AttentionVariation::FromSpec(spec, {.rope_inv_freq = inv_freq.data()}).rope;
  const std::vector<float> in = Rows(c.head_dim, 2);
  std::vector<float> out = in;
  std::vector<float> table(rope.rotary_dim);
  const int64_t row_width = int64_t{kHeads} * c.head_dim;
  rope.RotateRows(out.data(), static_cast<int64_t>(kPositions.size()), row_width, kHeads,
                  c.head_dim, kPositions.data(), table.data());
  for (size_t r = 0; r < kPositions.size(); ++r) {
    for (int h = 0; h < kHeads; ++h) {
      const int64_t offset = static_cast<int64_t>(r) * row_width + int64_t{h} * c.head_dim;
      std::vector<double> ref(in.begin() + offset, in.begin() + offset + c.head_dim);
      reference::ApplyRopeReference(c.layout, spec.rope_theta, kPositions[r], ref.data(),
                                    rope.rotary_dim);
      for (int d = 0; d < c.head_dim; ++d) {
        SCOPED_TRACE(absl::StrCat("position ", kPositions[r], " head ", h, " dim ", d));
        if (d < rope.rotary_dim) {
          EXPECT_NEAR(out[offset + d], ref[d], 2e-6);
        } else {
          EXPECT_EQ(out[offset + d], in[offset + d]);
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, RotaryPositionsTest,
                         testing::Values(Case{RopeLayout::kHalf, 64, 0},
                                         Case{RopeLayout::kInterleaved, 64, 0},
                                         Case{RopeLayout::kHalf, 64, 24},  // Partial rotary.
                                         Case{RopeLayout::kInterleaved, 32, 16}),
                         [](const testing::TestParamInfo<Case>& info) {
                           return absl::StrCat(
                               info.param.layout == RopeLayout::kHalf ? "half" : "interleaved",
                               "_hd", info.param.head_dim, "_rotary", info.param.rotary_dim);
                         });

// Without RoPE the variation's policy is inactive (the layers skip it).
TEST(RotaryPositionsNoneTest, InactiveWithoutRope) {
  const LayerSpec spec = Spec(RopeLayout::kNone, 64, 0);
  EXPECT_FALSE(AttentionVariation::FromSpec(spec).rope.active());
}

}  // namespace
}  // namespace attnserve
