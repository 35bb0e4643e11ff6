// The split-KV schedule of FlashInfer's decode kernel (kernels/cuda/flashinfer/decode_plan.h) on
// the CPU: every (sequence, page) covered by exactly one work item, the chunk-size rule of
// FlashInfer's DecodePlan (no split once batch x kv_heads fills the budget, split at batch 1 with
// a long context, chunks of at least 128 tokens), the packed layout and the scratch sizes.
#include "kernels/cuda/flashinfer/decode_plan.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace attnserve::cuda {
namespace {

// H100: 132 SMs; 8 resident blocks per SM is what the 128-thread decode instances reach.
constexpr int kBudget = 132 * 8;

FlashInferDecodeShape Shape(int kv_heads, int budget = kBudget) {
  FlashInferDecodeShape shape;
  shape.page_size = 16;
  shape.num_heads = 4 * kv_heads;
  shape.num_kv_heads = kv_heads;
  shape.head_dim = 128;
  shape.grid_budget = budget;
  return shape;
}

FlashInferDecodePlan Plan(const std::vector<int32_t>& pages, const FlashInferDecodeShape& shape) {
  FlashInferDecodePlan plan;
  EXPECT_TRUE(PlanFlashInferDecode(pages, shape, &plan));
  return plan;
}

// Checks the packed arrays against `pages`: each work item i serves sequence
// request_indices[i], pages [tile * chunk, min((tile + 1) * chunk, pages)); together they cover
// every page of every sequence exactly once, in sequence order, and o_indptr bounds each
// sequence's items.
void ExpectExactCover(const std::vector<int32_t>& pages, const FlashInferDecodeShape& shape,
                      const FlashInferDecodePlan& plan) {
  const FlashInferDecodePlanInfo& info = plan.info;
  const int batch = static_cast<int>(pages.size());
  ASSERT_EQ(info.batch, batch);
  ASSERT_GT(info.kv_chunk_pages, 0);
  for (int offset : {info.request_indices_offset, info.kv_tile_indices_offset,
                     info.o_indptr_offset, info.kv_chunk_size_offset}) {
    EXPECT_EQ(offset % 4, 0) << "arrays start 16-byte aligned";
  }
  ASSERT_LE(info.kv_tile_indices_offset, info.o_indptr_offset);
  ASSERT_GE(info.kv_tile_indices_offset - info.request_indices_offset, info.padded_batch_size);
  ASSERT_GE(info.o_indptr_offset - info.kv_tile_indices_offset, info.padded_batch_size);
  ASSERT_GE(info.kv_chunk_size_offset - info.o_indptr_offset, batch + 1);
  ASSERT_EQ(plan.packed.size(), static_cast<size_t>(info.kv_chunk_size_offset + 1));
  const int32_t* request = plan.packed.data() + info.request_indices_offset;
  const int32_t* tile = plan.packed.data() + info.kv_tile_indices_offset;
  const int32_t* o_indptr = plan.packed.data() + info.o_indptr_offset;
  const int chunk = info.kv_chunk_pages;
  EXPECT_EQ(plan.packed[info.kv_chunk_size_offset], chunk * shape.page_size);

  std::map<std::pair<int, int>, int> covered;  // (sequence, page) -> items covering it.
  EXPECT_EQ(o_indptr[0], 0);
  for (int b = 0; b < batch; ++b) {
    ASSERT_LE(o_indptr[b], o_indptr[b + 1]);
    for (int i = o_indptr[b]; i < o_indptr[b + 1]; ++i) {
      ASSERT_EQ(request[i], b) << "item " << i;
      ASSERT_EQ(tile[i], i - o_indptr[b]) << "item " << i;
      const int begin = tile[i] * chunk;
      const int end = std::min(begin + chunk, pages[b]);
      ASSERT_LT(begin, end) << "item " << i << " covers no page";
      for (int p = begin; p < end; ++p) ++covered[{b, p}];
    }
  }
  ASSERT_EQ(o_indptr[batch], info.padded_batch_size);
  int64_t total_pages = 0;
  for (int b = 0; b < batch; ++b) {
    total_pages += pages[b];
    for (int p = 0; p < pages[b]; ++p) {
      EXPECT_EQ((covered[{b, p}]), 1) << "sequence " << b << " page " << p;
    }
  }
  EXPECT_EQ(static_cast<int64_t>(covered.size()), total_pages);

  // A split grid never exceeds the budget; without split there is one item per sequence.
  if (info.split_kv) {
    EXPECT_GT(info.padded_batch_size, batch);
    EXPECT_LE(int64_t{info.padded_batch_size} * shape.num_kv_heads, shape.grid_budget);
    EXPECT_GE(chunk * shape.page_size, 128) << "chunks under 128 tokens";
    const int64_t rows = int64_t{info.padded_batch_size} * shape.num_heads;
    EXPECT_EQ(info.tmp_v_elements, rows * shape.head_dim);
    EXPECT_EQ(info.tmp_s_elements, rows);
  } else {
    EXPECT_EQ(info.padded_batch_size, batch);
    EXPECT_EQ(info.tmp_v_elements, 0);
    EXPECT_EQ(info.tmp_s_elements, 0);
  }
}

TEST(FlashInferDecodePlan, BatchOneLongContextSplits) {
  const FlashInferDecodeShape shape = Shape(/*kv_heads=*/8);
  const std::vector<int32_t> pages = {512};  // 8192 tokens.
  const FlashInferDecodePlan plan = Plan(pages, shape);
  ExpectExactCover(pages, shape, plan);
  EXPECT_TRUE(plan.info.split_kv);
  // 1056 blocks / 8 heads = 132 items at most: chunks of ceil(512 / 132) = 4 pages would make 128
  // items, but chunks are at least 128 / 16 = 8 pages: 64 items.
  EXPECT_EQ(plan.info.kv_chunk_pages, 8);
  EXPECT_EQ(plan.info.padded_batch_size, 64);
}

TEST(FlashInferDecodePlan, ChunkShrinksOnlyAsFarAsTheBudget) {
  // 2 kv heads, budget 64 blocks: at most 32 items for one 1000-page sequence, so chunks of
  // ceil(1000 / 32) = 32 pages (and not 31, which makes 33 items).
  const FlashInferDecodeShape shape = Shape(/*kv_heads=*/2, /*budget=*/64);
  const std::vector<int32_t> pages = {1000};
  const FlashInferDecodePlan plan = Plan(pages, shape);
  ExpectExactCover(pages, shape, plan);
  EXPECT_TRUE(plan.info.split_kv);
  EXPECT_EQ(plan.info.kv_chunk_pages, 32);
  EXPECT_EQ(plan.info.padded_batch_size, 32);
}

TEST(FlashInferDecodePlan, NoSplitOnceTheBatchFillsTheBudget) {
  const FlashInferDecodeShape shape = Shape(/*kv_heads=*/8);
  const int full_batch = kBudget / 8;  // 132 sequences x 8 heads = the budget.
  for (int batch : {full_batch, full_batch + 1, 4 * full_batch}) {
    SCOPED_TRACE(batch);
    std::vector<int32_t> pages(batch, 512);
    pages[batch / 2] = 3;
    const FlashInferDecodePlan plan = Plan(pages, shape);
    ExpectExactCover(pages, shape, plan);
    EXPECT_FALSE(plan.info.split_kv);
    EXPECT_EQ(plan.info.kv_chunk_pages, 512) << "FlashInfer's chunk: the longest sequence";
  }
  // One below: no chunk both cuts a sequence and keeps 131 sequences within 132 items, so the
  // search ends at whole sequences and nothing is split.
  std::vector<int32_t> pages(full_batch - 1, 512);
  FlashInferDecodePlan plan = Plan(pages, shape);
  ExpectExactCover(pages, shape, plan);
  EXPECT_FALSE(plan.info.split_kv);
  // Under half the budget: each sequence in two chunks of 256 pages.
  pages.assign(60, 512);
  plan = Plan(pages, shape);
  ExpectExactCover(pages, shape, plan);
  EXPECT_TRUE(plan.info.split_kv);
  EXPECT_EQ(plan.info.kv_chunk_pages, 256);
  EXPECT_EQ(plan.info.padded_batch_size, 120);
}

TEST(FlashInferDecodePlan, ShortContextsAreNotSplit) {
  // Every sequence under one minimum chunk (8 pages): cutting changes nothing, so no split.
  const FlashInferDecodeShape shape = Shape(/*kv_heads=*/2);
  const std::vector<int32_t> pages = {1, 1, 7, 8};
  const FlashInferDecodePlan plan = Plan(pages, shape);
  ExpectExactCover(pages, shape, plan);
  EXPECT_FALSE(plan.info.split_kv);
}

TEST(FlashInferDecodePlan, KvLengthOne) {
  // A first decode step: one key, one page.
  const FlashInferDecodeShape shape = Shape(/*kv_heads=*/1);
  const std::vector<int32_t> pages = {1};
  const FlashInferDecodePlan plan = Plan(pages, shape);
  ExpectExactCover(pages, shape, plan);
  EXPECT_FALSE(plan.info.split_kv);
  EXPECT_EQ(plan.info.padded_batch_size, 1);
}

TEST(FlashInferDecodePlan, MixedLengthsSplitOnlyTheLongOnes) {
  const FlashInferDecodeShape shape = Shape(/*kv_heads=*/2, /*budget=*/132 * 4);
  const std::vector<int32_t> pages = {63, 1, 700, 17, 8, 9, 250};
  const FlashInferDecodePlan plan = Plan(pages, shape);
  ExpectExactCover(pages, shape, plan);
  EXPECT_TRUE(plan.info.split_kv);
  const int32_t* o_indptr = plan.packed.data() + plan.info.o_indptr_offset;
  EXPECT_EQ(o_indptr[2] - o_indptr[1], 1) << "a 1-page sequence is one item";
  EXPECT_GT(o_indptr[3] - o_indptr[2], o_indptr[7] - o_indptr[6]) << "700 pages vs 250";
}

TEST(FlashInferDecodePlan, PageSizeAboveTheMinimumChunk) {
  // 256-token pages: the minimum chunk is one page.
  FlashInferDecodeShape shape = Shape(/*kv_heads=*/4, /*budget=*/64);
  shape.page_size = 256;
  const std::vector<int32_t> pages = {5, 3};
  const FlashInferDecodePlan plan = Plan(pages, shape);
  ExpectExactCover(pages, shape, plan);
  EXPECT_TRUE(plan.info.split_kv);
  EXPECT_EQ(plan.info.kv_chunk_pages, 1);
  EXPECT_EQ(plan.info.padded_batch_size, 8);
}

TEST(FlashInferDecodePlan, RefusesBadInput) {
  FlashInferDecodePlan plan;
  plan.info.batch = -7;
  EXPECT_FALSE(PlanFlashInferDecode({}, Shape(2), &plan));
  EXPECT_FALSE(PlanFlashInferDecode({4, 0, 3}, Shape(2), &plan));
  EXPECT_FALSE(PlanFlashInferDecode({4}, Shape(2, /*budget=*/0), &plan));
  FlashInferDecodeShape no_heads = Shape(2);
  no_heads.num_kv_heads = 0;
  EXPECT_FALSE(PlanFlashInferDecode({4}, no_heads, &plan));
  EXPECT_EQ(plan.info.batch, -7) << "a refused plan is left untouched";
}

}  // namespace
}  // namespace attnserve::cuda
