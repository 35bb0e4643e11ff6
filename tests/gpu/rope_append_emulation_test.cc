// The RoPE + KV append kernel (kernels/cuda/attention/rope_append.cuh) executed on the CPU by the
// block emulator, against the float64 RoPE of tests/reference (an independent implementation).
//
// Each case draws a fresh ragged batch (seed printed): rows of several sequences, some continuing
// a cache (first_index > 0, so a row's slot is mid-page), explicit positions far from the index
// (RoPE positions are not cache slots), pages scattered over a NaN pool. Checks:
//   - q heads are rotated in place; the v columns are untouched;
//   - each row's k and v land in exactly its (page, slot), in every KV head's row, rounded to the
//     page dtype; every other pool element is still NaN afterwards.
// Layouts: half (Llama) and interleaved (GPT-J), partial rotary (rotary_dim < head_dim, as
// partial_rotary_factor), and none (rotary_dim = 0: a plain append); with q/k RMSNorm before RoPE
// (per-element scales, as Qwen3 / Gemma 3 after the host folds 1 + w) and YaRN's attention factor
// on cos and sin.
//
// Tolerances: the kernel rotates in fp32 with fp64 angles rounded to fp32 cos/sin, so q and
// f32-page k differ from float64 by a few fp32 ulps: |err| <= 1e-6 * (|x| + 1) with |x| ~ N(0, 1).
// 16-bit pages hold that fp32 value rounded to nearest: within one 16-bit ulp of the float64 value
// (2^-10 relative for f16, 2^-7 for bf16, i.e. 2u), plus the fp32 error.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda/attention/params.h"
#include "tests/gpu/emulation_support.h"
#include "tests/reference/attention_reference.h"

namespace attnserve::cuda {
namespace {

struct Case {
  std::string name;
  KvType kv;
  RopeLayout layout;
  int head_dim;
  int rotary_dim;  // 0 = no RoPE.
  int page_size;
  bool qk_norm = false;
  float attention_factor = 1.0f;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class RopeAppendEmulationTest : public ::testing::TestWithParam<Case> {};

TEST_P(RopeAppendEmulationTest, RotatesAndWritesExactlyTheRowsSlots) {
  const Case& c = GetParam();
  const uint64_t seed = emulation::DrawCaseSeed(c.name);
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);

  const int heads = 4, kv_heads = 2, d = c.head_dim;
  const int64_t stride = int64_t{heads + 2 * kv_heads} * d;
  const double theta = 10000.0;
  // A fresh prompt, a continuation landing mid-page, one row; pages scattered over a NaN pool
  // that only the kernel writes (no window: no page evicted).
  emulation::PagedBatch batch = emulation::LayOutPagedBatch(
      {{0, 11}, {c.page_size + 3, 7}, {2, 1}}, c.kv, kv_heads, d, c.page_size, MaskSpec{}, rng);
  const std::vector<SequenceDesc>& descs = batch.sequences;
  const int rows = batch.rows;
  std::vector<int> row_sequence;
  for (size_t b = 0; b < descs.size(); ++b) {
    row_sequence.insert(row_sequence.end(), descs[b].num_new, static_cast<int>(b));
  }
  const int64_t pool_elements = batch.pool_pages * batch.PageElements();
  const int bytes = emulation::ElementBytes(c.kv);
  std::vector<int64_t> positions(rows);
  std::uniform_int_distribution<int64_t> position(0, 200000);
  for (int64_t& pos : positions) pos = position(rng);
  std::vector<float> qkv(static_cast<size_t>(rows * stride));
  for (float& x : qkv) x = normal(rng);
  const std::vector<float> original = qkv;
  // q/k norm scales [q | k] of [d] each, around 1 so a misindexed scale shows.
  std::vector<float> norm_scale(2 * d);
  std::uniform_real_distribution<float> around_one(0.5f, 1.5f);
  for (float& w : norm_scale) w = around_one(rng);
  const double eps = 1e-6;
  std::vector<double> inv_freq(c.rotary_dim / 2);
  for (int i = 0; i < c.rotary_dim / 2; ++i) inv_freq[i] = std::pow(theta, -2.0 * i / c.rotary_dim);

  RopeAppendParams p;
  p.qkv = qkv.data();
  p.qkv_stride = stride;
  p.positions = positions.data();
  p.row_sequence = row_sequence.data();
  p.sequences = descs.data();
  p.rope = {inv_freq.data(), c.rotary_dim, c.layout == RopeLayout::kInterleaved,
            c.attention_factor};
  p.rows = rows;
  p.num_heads = heads;
  if (c.qk_norm) p.qk_norm = {norm_scale.data(), norm_scale.data() + d, eps};
  p.kv_type = c.kv;
  p.kv = batch.Kv();
  ASSERT_EQ(LaunchRopeAppend(p, nullptr), cudaSuccess);  // Every row's block, as launched.

  const double page_ulp = c.kv == KvType::kF32   ? 0.0
                          : c.kv == KvType::kF16 ? std::ldexp(1.0, -10)
                                                 : std::ldexp(1.0, -7);
  std::vector<bool> written(static_cast<size_t>(pool_elements), false);
  double worst_q = 0.0, worst_k = 0.0;
  for (int row = 0; row < rows; ++row) {
    const SequenceDesc& desc = descs[row_sequence[row]];
    const int index = desc.first_index + (row - desc.first_row);
    const int64_t page_base = batch.page_offsets[desc.first_page + index / c.page_size] / bytes;
    const int slot = index % c.page_size;
    for (int head = 0; head < heads + 2 * kv_heads; ++head) {
      std::vector<double> x(original.begin() + row * stride + head * d,
                            original.begin() + row * stride + (head + 1) * d);
      const bool is_v = head >= heads + kv_heads;
      if (!is_v && c.qk_norm) {  // x / rms(x) * scale, in float64.
        double sum_sq = 0.0;
        for (double v : x) sum_sq += v * v;
        const double inv_rms = 1.0 / std::sqrt(sum_sq / d + eps);
        const float* scale = norm_scale.data() + (head < heads ? 0 : d);
        for (int e = 0; e < d; ++e) x[e] *= inv_rms * scale[e];
      }
      if (!is_v && c.rotary_dim > 0) {
        reference::ApplyRopeReference(c.layout, theta, positions[row], x.data(), c.rotary_dim);
        // cos and sin times the factor: the rotated dims (the first rotary_dim in both layouts).
        for (int e = 0; e < c.rotary_dim; ++e) x[e] *= c.attention_factor;
      }
      for (int e = 0; e < d; ++e) {
        const float got = qkv[row * stride + head * d + e];
        const double err = std::abs(got - x[e]);
        if (head < heads) {  // q: rotated in place.
          worst_q = std::max(worst_q, err / (std::abs(x[e]) + 1.0));
          ASSERT_LE(err, 1e-6 * (std::abs(x[e]) + 1.0)) << "row " << row << " q head " << head;
          continue;
        }
        if (is_v) {
          ASSERT_EQ(got, original[row * stride + head * d + e]) << "v column changed";
        }
        const int h = head - heads - (is_v ? kv_heads : 0);
        const int64_t element = page_base + (int64_t{h} * c.page_size + slot) * d + e +
                                (is_v ? int64_t{kv_heads} * c.page_size * d : 0);
        written[element] = true;
        const double stored = batch.PoolElement(element);
        const double bound = page_ulp * std::abs(x[e]) + 1e-6 * (std::abs(x[e]) + 1.0);
        worst_k = std::max(worst_k, std::abs(stored - x[e]) / (std::abs(x[e]) + 1e-30));
        ASSERT_LE(std::abs(stored - x[e]), bound)
            << "row " << row << (is_v ? " v" : " k") << " head " << h << " element " << e;
      }
    }
  }
  int64_t stray = 0;
  for (int64_t element = 0; element < pool_elements; ++element) {
    if (!written[element] && !std::isnan(batch.PoolElement(element))) ++stray;
  }
  EXPECT_EQ(stray, 0) << "pool elements written outside the rows' slots";
  std::printf("[result] %s: %d rows, worst q error %.2e (relative to |x|+1), worst k/v %.2e\n",
              c.name.c_str(), rows, worst_q, worst_k);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, RopeAppendEmulationTest,
    ::testing::Values(
        Case{"f32_half_hd64_page16", KvType::kF32, RopeLayout::kHalf, 64, 64, 16},
        Case{"bf16_interleaved_hd128_page5", KvType::kBF16, RopeLayout::kInterleaved, 128, 128, 5},
        Case{"f16_half_partial32_hd128_page16", KvType::kF16, RopeLayout::kHalf, 128, 32, 16},
        Case{"bf16_none_hd64_page5", KvType::kBF16, RopeLayout::kNone, 64, 0, 5},
        Case{"f32_interleaved_qknorm_partial48_hd64_page5", KvType::kF32,
             RopeLayout::kInterleaved, 64, 48, 5, /*qk_norm=*/true},
        Case{"bf16_half_qknorm_yarn_factor_hd256_page16", KvType::kBF16, RopeLayout::kHalf, 256,
             256, 16, /*qk_norm=*/true, /*attention_factor=*/1.1386f}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace attnserve::cuda
