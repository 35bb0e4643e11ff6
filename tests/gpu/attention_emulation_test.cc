// The attention kernels executed on the CPU by the block emulator (simt_emulator.h: one fiber per
// CUDA thread; __syncthreads, warp shuffles and mma.sync emulated, mma from the PTX fragment
// tables), launched through the dispatch exactly as the CUDA layer launches them:
//   prefill, f32 pages:       the CUDA-core kernel (paged_attention.cuh, 16-row items);
//   prefill, f16/bf16 pages:  the tensor-core kernel (prefill_mma.cuh, 64-row items, 4 warps);
//   decode, every page type:  split-KV blocks, then the combine (combine.cuh).
// This runs in CI, which has no GPU: it checks paged gathers, tiling, fragment indexing, masks,
// online softmax, row blocks of large groups, split partial states and their combine, with work
// planned by the layer's planner (batch_plan.h); the GPU run (tests/gpu/cuda_backend_test) checks
// the same source compiled by nvcc.
//
// Every case is drawn fresh (the seed is printed). The KV pool is NaN except for the slots the
// sequences wrote, pages are scattered in the pool, pages behind a sliding window are evicted
// (-1), the q buffer's K/V columns are NaN, and the output and the decode's partial buffers start
// NaN: a read of anything the kernel must not read, or a value it fails to write, turns into NaN
// and fails. Decode rows are in reverse sequence order (first_row != sequence index).
//
// Shapes: head dims 64 and 128; groups 1 to 32 (32 > kAttentionRowsPerBlock: the decode's row
// blocks, grid.z); causal, non-causal and a 40-token window; pages of 16 and 5 tokens; ragged
// batches with continuations (first_index > 0). Lengths cross the key tiles (16/32 keys on CUDA
// cores, 64 on tensor cores), the pages, the 16- and 64-row items and 16-row warps, and the
// window. Decode splits are planned with a small minimum (16 keys, at most 4 splits), so a
// 150-key sequence gets 4 splits (edges mid-page, so tiles straddle pages), and a 40-key window 2.
//
// Tolerances (relative 2-norm over the call against float64 from the same page values, which are
// already rounded to the page type, and the same fp32 q):
//   CUDA-core kernels, every page type: 2e-6. They load each stored element exactly into fp32 and
//     do every product, exp and sum in fp32 (u = 2^-24); seen over 16 seeds per case 9e-8 to
//     2.6e-7, so ~8x margin.
//   Tensor-core prefill: Q and P are rounded to the page type for the mma. f16: 1e-3 ~ 2u
//     (u = 2^-11), seen ~2e-4; bf16: 8e-3 ~ 2u (u = 2^-8), seen ~2e-3.
// A kernel bug (a mask, split, row block, fragment index or softmax rescale off) gives 1e-2 or
// more.
#include <cmath>
#include <cstdio>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/core/tensor.h"
#include "kernels/cuda/attention/batch_plan.h"
#include "kernels/cuda/attention/dispatch.h"
#include "kernels/cuda/attention/params.h"
#include "tests/gpu/emulation_support.h"

namespace attnserve::cuda {
namespace {

constexpr int kMinKeysPerSplit = 16;
constexpr int kMaxSplits = 4;

// The tolerance of the kernel a case runs (see the header).
double Bound(bool decode, KvType type) {
  if (decode || type == KvType::kF32) return 2e-6;
  return type == KvType::kF16 ? 1e-3 : 8e-3;
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

class AttentionEmulationTest : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionEmulationTest, MatchesFloat64Reference) {
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
  const DType dtype = emulation::ToDType(c.type);
  std::vector<WorkItem> items;
  std::vector<int> item_begin;
  for (int b = 0; b < batch_size; ++b) {
    item_begin.push_back(static_cast<int>(items.size()));
    if (c.decode) {
      PlanDecodeSplits(descs[b], b, c.mask, kMaxSplits, kMinKeysPerSplit, items);
    } else {
      PlanPrefillItems(descs[b], b, c.group, c.mask, PrefillRowsPerBlock(dtype, c.head_dim), items);
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
    ASSERT_TRUE(RunDecodeAttention(dtype, d, p, row_blocks, nullptr).ok());
  } else {
    // The dispatch picks the CUDA-core (f32) or tensor-core (f16/bf16) kernel.
    ASSERT_TRUE(RunPrefillAttention(dtype, d, p, nullptr).ok());
  }

  // ---- float64 reference from the stored K/V and the fp32 q.
  const emulation::OutputError error = emulation::CompareWithReference(
      out, emulation::ReferenceAttention(batch, qkv.data(), q_stride, heads, c.group, p.scale));
  EXPECT_EQ(error.nan_count, 0) << "outputs left unwritten or computed from poisoned memory";
  std::printf(
      "[result] %s: %s %d rows x %d heads, %d items x %d row blocks, relative error "
      "%.3e (bound %.1e)\n",
      c.name.c_str(), std::string(DTypeName(dtype)).c_str(), rows, heads, num_items,
      c.decode ? row_blocks : 1, error.relative, Bound(c.decode, c.type));
  EXPECT_LE(error.relative, Bound(c.decode, c.type));
}

const MaskSpec kCausal{1, 0};
const MaskSpec kWindow40{1, 40};
const MaskSpec kNonCausal{0, 0};

// Prefill, ragged: a fresh 70-token prompt (crosses tiles, pages, 16- and 64-row items), a
// continuation of 33 tokens after 37 cached, and a 1-token prompt.
const std::vector<SequenceShape> kRagged = {{0, 70}, {37, 33}, {0, 1}};

// Decode: one new token per sequence of 150 keys (4 splits), 41 and 3 keys.
const std::vector<SequenceShape> kDecode = {{149, 1}, {40, 1}, {2, 1}};

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionEmulationTest,
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
        // f16/bf16-page prefill (MmaPrefillBlock, tensor cores).
        Case{"prefill_f16_hd64_mha_causal_page16", false, KvType::kF16, 64, 1, kCausal, 16,
             kRagged},
        Case{"prefill_bf16_hd128_gqa3_causal_page16", false, KvType::kBF16, 128, 3, kCausal, 16,
             kRagged},
        Case{"prefill_f16_hd128_gqa4_window40_page16",
             false,
             KvType::kF16,
             128,
             4,
             kWindow40,
             16,
             {{0, 90}, {60, 20}}},
        Case{"prefill_bf16_hd64_mqa8_window40_page5",
             false,
             KvType::kBF16,
             64,
             8,
             kWindow40,
             5,
             {{50, 30}, {0, 9}}},
        Case{"prefill_bf16_hd64_noncausal_page16", false, KvType::kBF16, 64, 2, kNonCausal, 16,
             kRagged},
        Case{"prefill_f16_hd64_gqa5_causal_page5",
             false,
             KvType::kF16,
             64,
             5,
             kCausal,
             5,
             {{3, 27}, {0, 13}}},
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
