// PlanFlashInferPrefill (kernels/cuda/flashinfer/prefill_plan.h), the host schedule of FlashInfer's
// prefill over our pages, on the CPU: FlashInfer's CTA tile rule, every packed (token, group head)
// row of every sequence covered by exactly one block, the row offsets, the packing into one array,
// and the input it refuses.
#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/flashinfer/prefill_plan.h"

namespace attnserve::cuda {
namespace {

using Sequences = std::vector<FlashInferPrefillSequence>;

// Checks every invariant the kernel relies on, against the input alone.
void ExpectValidPlan(const FlashInferPrefillPlan& plan, const Sequences& sequences,
                     int group_size) {
  const int batch = static_cast<int>(sequences.size());
  ASSERT_EQ(plan.batch, batch);
  ASSERT_TRUE(plan.cta_tile_q == 64 || plan.cta_tile_q == 128);
  // Arrays inside `packed`, 16-byte aligned, not overlapping, in the documented order.
  for (int offset : {plan.request_indices_offset, plan.qo_tile_indices_offset,
                     plan.kv_tile_indices_offset, plan.o_indptr_offset}) {
    EXPECT_EQ(offset % 4, 0);
  }
  EXPECT_EQ(plan.request_indices_offset, 0);
  EXPECT_GE(plan.qo_tile_indices_offset, plan.request_indices_offset + plan.padded_batch_size);
  EXPECT_GE(plan.kv_tile_indices_offset, plan.qo_tile_indices_offset + plan.padded_batch_size);
  EXPECT_GE(plan.o_indptr_offset, plan.kv_tile_indices_offset + plan.padded_batch_size);
  EXPECT_GE(plan.kv_chunk_size_offset, plan.o_indptr_offset + batch + 1);
  ASSERT_EQ(plan.packed.size(), static_cast<size_t>(plan.kv_chunk_size_offset) + 1);

  const int32_t* request = plan.packed.data() + plan.request_indices_offset;
  const int32_t* qo_tile = plan.packed.data() + plan.qo_tile_indices_offset;
  const int32_t* kv_tile = plan.packed.data() + plan.kv_tile_indices_offset;
  const int32_t* o_indptr = plan.packed.data() + plan.o_indptr_offset;

  // o_indptr: each sequence's first row, rows in sequence order.
  int rows = 0, max_kv_len = 0;
  for (int b = 0; b < batch; ++b) {
    EXPECT_EQ(o_indptr[b], rows) << "sequence " << b;
    rows += sequences[b].qo_len;
    max_kv_len = std::max(max_kv_len, sequences[b].kv_len);
  }
  EXPECT_EQ(o_indptr[batch], rows);
  EXPECT_EQ(plan.total_rows, rows);
  // No split-KV: one chunk spans every sequence's keys.
  EXPECT_EQ(plan.kv_chunk_size, std::max(max_kv_len, 1));
  EXPECT_EQ(plan.packed[plan.kv_chunk_size_offset], plan.kv_chunk_size);

  // Each block's packed rows [tile * cta_tile_q, +cta_tile_q) clipped to its sequence: every
  // (sequence, packed row) covered exactly once, and no block without a row.
  std::map<std::pair<int, int64_t>, int> covered;
  for (int block = 0; block < plan.padded_batch_size; ++block) {
    const int b = request[block];
    ASSERT_GE(b, 0);
    ASSERT_LT(b, batch);
    EXPECT_EQ(kv_tile[block], 0) << "block " << block;
    const int64_t packed_rows = int64_t{sequences[b].qo_len} * group_size;
    const int64_t begin = int64_t{qo_tile[block]} * plan.cta_tile_q;
    EXPECT_GE(qo_tile[block], 0);
    EXPECT_LT(begin, packed_rows) << "block " << block << " has no rows";
    for (int64_t row = begin; row < std::min(begin + plan.cta_tile_q, packed_rows); ++row) {
      ++covered[{b, row}];
    }
  }
  for (int b = 0; b < batch; ++b) {
    for (int64_t row = 0; row < int64_t{sequences[b].qo_len} * group_size; ++row) {
      const auto it = covered.find({b, row});
      ASSERT_TRUE(it != covered.end()) << "sequence " << b << " packed row " << row;
      EXPECT_EQ(it->second, 1) << "sequence " << b << " packed row " << row;
    }
  }
  int64_t all_rows = 0;
  for (const FlashInferPrefillSequence& s : sequences) all_rows += int64_t{s.qo_len} * group_size;
  EXPECT_EQ(static_cast<int64_t>(covered.size()), all_rows);
}

TEST(FlashInferPrefillPlanTest, CtaTileFollowsFlashInfersRule) {
  // FA2DetermineCtaTileQ on sm80+: > 64 packed rows -> 128 (not for head dim 256), else 64 (its
  // 16-row tile for <= 16 rows is not built and folds into 64).
  EXPECT_EQ(FlashInferPrefillCtaTileQ(1, 128), 64);
  EXPECT_EQ(FlashInferPrefillCtaTileQ(16, 128), 64);
  EXPECT_EQ(FlashInferPrefillCtaTileQ(17, 128), 64);
  EXPECT_EQ(FlashInferPrefillCtaTileQ(64, 64), 64);
  EXPECT_EQ(FlashInferPrefillCtaTileQ(65, 64), 128);
  EXPECT_EQ(FlashInferPrefillCtaTileQ(65, 128), 128);
  EXPECT_EQ(FlashInferPrefillCtaTileQ(5000, 256), 64);
  EXPECT_EQ(FlashInferPrefillCtaTileQ(16, 256), 64);
}

TEST(FlashInferPrefillPlanTest, TileSizedByAveragePackedLength) {
  // Average packed rows, rounded down: 192 / 3 = 64 -> 64; 195 / 3 = 65 -> 128.
  std::optional<FlashInferPrefillPlan> plan =
      PlanFlashInferPrefill({{1, 10}, {1, 10}, {190, 190}}, 1, 128);
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(plan->cta_tile_q, 64);
  plan = PlanFlashInferPrefill({{1, 10}, {1, 10}, {193, 193}}, 1, 128);
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(plan->cta_tile_q, 128);
}

TEST(FlashInferPrefillPlanTest, RaggedBatchesCoverEveryRowOnce) {
  const std::vector<Sequences> batches = {
      {{1, 1}},
      {{15, 15}, {16, 16}, {17, 17}},
      {{200, 200}, {1, 1000}, {17, 33}, {1000, 1000}},
      {{3, 500}, {0, 40}, {64, 64}, {129, 200}},  // A sequence without new tokens has no block.
  };
  for (const Sequences& sequences : batches) {
    for (int group : {1, 4, 7, 32}) {
      for (int head_dim : {64, 128, 256}) {
        SCOPED_TRACE(testing::Message() << "group " << group << " head_dim " << head_dim
                                        << " first qo_len " << sequences[0].qo_len);
        const std::optional<FlashInferPrefillPlan> plan =
            PlanFlashInferPrefill(sequences, group, head_dim);
        ASSERT_TRUE(plan.has_value());
        ExpectValidPlan(*plan, sequences, group);
      }
    }
  }
}

TEST(FlashInferPrefillPlanTest, DecodeThroughPrefill) {
  // qo_len 1 everywhere: 1 to 64 packed rows per sequence (MQA with 32 heads packs 32), one
  // 64-row block per sequence; group 65 takes the 128-row tile.
  const Sequences decode = {{1, 1}, {1, 15}, {1, 16}, {1, 17}, {1, 200}, {1, 1000}};
  for (const auto& [group, tile] :
       std::vector<std::pair<int, int>>{{1, 64}, {4, 64}, {32, 64}, {64, 64}, {65, 128}}) {
    SCOPED_TRACE(group);
    const std::optional<FlashInferPrefillPlan> plan = PlanFlashInferPrefill(decode, group, 128);
    ASSERT_TRUE(plan.has_value());
    EXPECT_EQ(plan->cta_tile_q, tile);
    EXPECT_EQ(plan->padded_batch_size, 6);
    ExpectValidPlan(*plan, decode, group);
  }
}

TEST(FlashInferPrefillPlanTest, TilesPerSequence) {
  // 100 rows x group 7 = 700 packed rows in tiles of 128: 6 blocks, the last one partial.
  const std::optional<FlashInferPrefillPlan> plan = PlanFlashInferPrefill({{100, 300}}, 7, 64);
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(plan->cta_tile_q, 128);
  EXPECT_EQ(plan->padded_batch_size, 6);
  for (int block = 0; block < 6; ++block) {
    EXPECT_EQ(plan->packed[plan->qo_tile_indices_offset + block], block);
  }
}

TEST(FlashInferPrefillPlanTest, NoNewTokensMeansNoBlocks) {
  const std::optional<FlashInferPrefillPlan> plan = PlanFlashInferPrefill({{0, 5}, {0, 0}}, 4, 64);
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(plan->padded_batch_size, 0);
  EXPECT_EQ(plan->total_rows, 0);
  EXPECT_EQ(plan->kv_chunk_size, 5);
}

TEST(FlashInferPrefillPlanTest, RefusesWhatTheKernelCannotTake) {
  EXPECT_FALSE(PlanFlashInferPrefill({}, 1, 128).has_value());
  EXPECT_FALSE(PlanFlashInferPrefill({{1, 1}}, 0, 128).has_value());
  EXPECT_FALSE(PlanFlashInferPrefill({{1, 1}}, 1, 0).has_value());
  EXPECT_FALSE(PlanFlashInferPrefill({{-1, 1}}, 1, 128).has_value());
  // The new tokens are the last qo_len keys: fewer keys than new tokens is a caller's mistake.
  EXPECT_FALSE(PlanFlashInferPrefill({{8, 7}}, 1, 128).has_value());
  // Packed rows beyond int32.
  EXPECT_FALSE(PlanFlashInferPrefill({{1 << 26, 1 << 26}}, 64, 128).has_value());
}

}  // namespace
}  // namespace attnserve::cuda
