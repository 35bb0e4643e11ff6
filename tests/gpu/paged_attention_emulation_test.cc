// The CUDA-core attention kernels (kernels/cuda/attention/paged_attention.cuh: the f32-page
// prefill and the split-KV decode, and combine.cuh: the split combine) executed on the CPU by the
// block emulator (simt_emulator.h: one fiber per CUDA thread, __syncthreads and warp
// shuffles emulated), against a float64 reference. This runs in CI, which has no GPU: it checks
// the kernels' paged gather, tiling, masks, online softmax, row blocks of large groups, split
// partial states and their combine, with work planned by the CUDA layer's planner (work_plan.h);
// the GPU run (tests/gpu/cuda_backend_test) checks the same source compiled by nvcc.
//
// Every case is drawn fresh (the seed is printed). The KV pool is NaN except for the slots the
// sequences wrote, pages are scattered in the pool, pages behind a sliding window are evicted
// (-1), the q buffer's K/V columns are NaN, and the output and the decode's partial buffers start
// NaN: a read of anything the kernel must not read, or a value it fails to write, turns into NaN
// and fails. Decode rows are in reverse sequence order (first_row != sequence index).
//
// Shapes: f32-page prefill (the only prefill on CUDA cores) and decode for f32, f16 and bf16 pages;
// head dims 64 and 128 (32- and 16-key tiles); groups 1, 4 and 32 (32 > kAttentionRowsPerBlock:
// the decode's row blocks, grid.z); causal and a 40-token window; pages of 16 and 5 tokens.
// Decode splits are planned with a small minimum (kMinKeysPerSplit = 16, at most 4 splits), so a
// 150-key sequence gets 4 splits (edges mid-page, so tiles straddle pages), and a 40-key window 2.
//
// Tolerances (relative 2-norm over the call against float64 from the same page values, which
// are already rounded to the page type, and the same fp32 q): these kernels load each stored
// element exactly into fp32 and do every product, exp and sum in fp32, so all page types see only
// fp32 rounding (u = 2^-24 ~ 6e-8), with no 16-bit rounding of Q or P as on tensor cores. Seen
// over 16 seeds per case: 9e-8 to 2.6e-7 (prefill and decode alike, all page types); the bound,
// 2e-6, leaves ~8x. A kernel bug (a mask, split, row block or softmax rescale off) gives 1e-2 or
// more.
#include <cmath>
#include <cstdio>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda/attention/dispatch.h"
#include "kernels/cuda/attention/params.h"
#include "kernels/cuda/attention/work_plan.h"
#include "tests/gpu/emulation_support.h"

namespace attnserve::cuda {
namespace {

constexpr int kMinKeysPerSplit = 16;
constexpr int kMaxSplits = 4;
constexpr double kBound = 2e-6;

const char* TypeName(KvType type) {
  switch (type) {
    case KvType::kF32:
      return "f32";
    case KvType::kF16:
      return "f16";
    case KvType::kBF16:
      return "bf16";
  }
  return "?";
}

using emulation::SequenceShape;

struct Case {
  std::string name;
  bool decode;
  KvType type;
  int head_dim;
  int group;
  MaskSpec mask;
  int page_size;
  std::vector<SequenceShape> sequences;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class PagedAttentionEmulationTest : public ::testing::TestWithParam<Case> {};

TEST_P(PagedAttentionEmulationTest, MatchesFloat64Reference) {
  const Case& c = GetParam();
  const uint64_t seed = emulation::DrawCaseSeed(c.name);
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  std::mt19937_64 rng(seed);

  const int kv_heads = 2, heads = kv_heads * c.group, d = c.head_dim;
  const int64_t q_stride = int64_t{heads} * d + 2 * int64_t{kv_heads} * d;  // As the qkv buffer.

  // ---- Sequences, their pages scattered over a NaN pool, evicted pages behind the window; q
  // (its K/V columns NaN), output NaN.
  emulation::PagedBatch batch =
      emulation::MakePagedBatch(c.sequences, c.type, kv_heads, d, c.page_size, c.mask, rng);
  const int batch_size = static_cast<int>(batch.sequences.size()), rows = batch.rows;
  std::vector<SequenceDesc>& descs = batch.sequences;
  if (c.decode) {
    // Decode rows (one per sequence) in reverse order, so first_row != sequence index.
    for (int b = 0; b < batch_size; ++b) descs[b].first_row = batch_size - 1 - b;
  }
  const std::vector<float> qkv = emulation::RandomQueries(rows, q_stride, heads * d, rng);
  std::vector<float> out(static_cast<size_t>(rows) * heads * d, NAN);

  // ---- Plan as the CUDA layer does (cuda_layer.cc) and run every block on the emulator.
  std::vector<WorkItem> items;
  std::vector<int> item_begin;
  for (int b = 0; b < batch_size; ++b) {
    item_begin.push_back(static_cast<int>(items.size()));
    if (c.decode) {
      PlanDecodeSplits(descs[b], b, c.mask, kMaxSplits, kMinKeysPerSplit, items);
    } else {
      PlanPrefillItems(descs[b], b, c.group, c.mask, kAttentionRowsPerBlock, items);
    }
  }
  item_begin.push_back(static_cast<int>(items.size()));
  const int num_items = static_cast<int>(items.size());
  const int row_blocks = (c.group + kAttentionRowsPerBlock - 1) / kAttentionRowsPerBlock;
  const int64_t partial_rows = c.decode ? int64_t{num_items} * heads : 0;
  std::vector<float> partial_max(static_cast<size_t>(partial_rows), NAN);
  std::vector<float> partial_sum(static_cast<size_t>(partial_rows), NAN);
  std::vector<float> partial_acc(static_cast<size_t>(partial_rows * d), NAN);

  AttentionParams p = emulation::MakeAttentionParams(batch, qkv, q_stride, heads, c.group, out);
  p.items = items.data();
  p.num_items = num_items;
  if (c.decode) {
    p.partial_max = partial_max.data();
    p.partial_sum = partial_sum.data();
    p.partial_acc = partial_acc.data();
    p.item_begin = item_begin.data();
    // As the layer launches it: split-KV blocks, then the combine.
    ASSERT_TRUE(RunDecodeAttention(emulation::ToDType(c.type), d, p, row_blocks, nullptr).ok());
  } else {
    ASSERT_EQ(c.type, KvType::kF32) << "the CUDA-core prefill is built for f32 pages only";
    ASSERT_TRUE(RunPrefillAttention(DType::kF32, d, p, nullptr).ok());
  }

  // ---- float64 reference from the stored K/V and the fp32 q.
  const emulation::OutputError error = emulation::CompareWithReference(
      out, emulation::ReferenceAttention(batch, qkv.data(), q_stride, heads, c.group, p.scale));
  EXPECT_EQ(error.nan_count, 0) << "outputs left unwritten or computed from poisoned memory";
  std::printf(
      "[result] %s: %s %d rows x %d heads, %d items x %d row blocks, relative error "
      "%.3e (bound %.1e)\n",
      c.name.c_str(), TypeName(c.type), rows, heads, num_items, c.decode ? row_blocks : 1,
      error.relative, kBound);
  EXPECT_LE(error.relative, kBound);
}

const MaskSpec kCausal{1, 0};
const MaskSpec kWindow40{1, 40};

// Prefill, ragged: a fresh 70-token prompt (crosses tiles, pages and 16-row items), a
// continuation of 33 tokens after 37 cached, and a 1-token prompt.
const std::vector<SequenceShape> kRagged = {{0, 70}, {37, 33}, {0, 1}};

// Decode: one new token per sequence of 150 keys (4 splits), 41 and 3 keys.
const std::vector<SequenceShape> kDecode = {{149, 1}, {40, 1}, {2, 1}};

INSTANTIATE_TEST_SUITE_P(
    Shapes, PagedAttentionEmulationTest,
    ::testing::Values(
        // f32-page prefill (PrefillBlock).
        Case{"prefill_f32_hd64_mha_causal_page16", false, KvType::kF32, 64, 1, kCausal, 16,
             kRagged},
        Case{"prefill_f32_hd128_gqa4_window40_page5",
             false,
             KvType::kF32,
             128,
             4,
             kWindow40,
             5,
             {{0, 50}, {60, 20}}},
        Case{"prefill_f32_hd64_group32_window40_page16",
             false,
             KvType::kF32,
             64,
             32,
             kWindow40,
             16,
             {{45, 3}, {0, 2}}},
        // Split-KV decode + combine (PagedDecodeBlock, CombineSplitsBlock).
        Case{"decode_f32_hd128_gqa4_causal_page16", true, KvType::kF32, 128, 4, kCausal, 16,
             kDecode},
        Case{"decode_f32_hd64_group32_window40_page5", true, KvType::kF32, 64, 32, kWindow40, 5,
             kDecode},
        Case{"decode_f16_hd64_mha_causal_page5", true, KvType::kF16, 64, 1, kCausal, 5, kDecode},
        Case{"decode_f16_hd128_group32_window40_page16", true, KvType::kF16, 128, 32, kWindow40, 16,
             kDecode},
        Case{"decode_bf16_hd64_gqa4_window40_page16", true, KvType::kBF16, 64, 4, kWindow40, 16,
             kDecode},
        Case{"decode_bf16_hd128_group32_causal_page5", true, KvType::kBF16, 128, 32, kCausal, 5,
             kDecode}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace attnserve::cuda
