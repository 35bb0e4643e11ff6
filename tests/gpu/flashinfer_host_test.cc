// The host side of the FlashInfer path, on the CPU: the page table CudaGqaLayer hands FlashInfer
// (kernels/cuda/flashinfer/page_table.h). No device needed; tier 1.
#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda/flashinfer/page_table.h"

namespace attnserve::cuda {
namespace {

using ::testing::ElementsAre;

SequenceDesc Sequence(int first_row, int num_new, int length, int first_page) {
  SequenceDesc s;
  s.first_row = first_row;
  s.num_new = num_new;
  s.first_index = length - num_new;
  s.length = length;
  s.first_page = first_page;
  return s;
}

TEST(FlashInferPageUnitTest, DividesEveryPageOffsetOfEverySlab) {
  // 3 KV heads x 16 tokens x 128 dims x 2 (K, V) x 2 bytes: 24 KiB pages in 4 MiB slabs, which
  // hold 170 pages and 16 KiB left over, so slab 1's pages are not multiples of 24 KiB.
  const int64_t page = 3 * 16 * 128 * 2 * 2, slab = int64_t{4} << 20;
  const int64_t unit = FlashInferPageUnitBytes(page, slab);
  EXPECT_EQ(unit, 8192);
  for (int64_t s = 0; s < 3; ++s) {
    for (int64_t p = 0; p < slab / page; ++p) EXPECT_EQ((s * slab + p * page) % unit, 0);
  }
  EXPECT_EQ(FlashInferPageUnitBytes(65536, slab), 65536);
}

TEST(FlashInferPageTableTest, RaggedBatchCrossingPageEdges) {
  // Lengths 1, 16, 17 and 40 with page size 16: 1, 1, 2 and 3 pages.
  const std::vector<SequenceDesc> seqs = {Sequence(0, 1, 1, 0), Sequence(1, 16, 16, 1),
                                          Sequence(17, 1, 17, 2), Sequence(18, 8, 40, 4)};
  const std::vector<int64_t> offsets = {4096, 0, 8192 * 3, 8192, 8192 * 10, 8192 * 11, 8192 * 12};
  absl::StatusOr<FlashInferPageTable> t = BuildFlashInferPageTable(seqs, offsets, 16, 4096);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_THAT(t->indptr, ElementsAre(0, 1, 2, 4, 7));
  EXPECT_THAT(t->page_indices, ElementsAre(1, 0, 6, 2, 20, 22, 24));
  EXPECT_THAT(t->last_page_len, ElementsAre(1, 16, 1, 8));
  EXPECT_THAT(t->q_indptr, ElementsAre(0, 1, 17, 18, 26));
  EXPECT_THAT(t->kv_len, ElementsAre(1, 16, 17, 40));
  EXPECT_THAT(t->kv_pages, ElementsAre(1, 1, 2, 3));
}

TEST(FlashInferPageTableTest, EvictedLeadingPagesAreLeftOutAndShortenTheKeys) {
  // 50 tokens, a window evicted pages 0 and 1: FlashInfer sees pages 2..3, 18 keys.
  const std::vector<SequenceDesc> seqs = {Sequence(0, 1, 50, 0)};
  const std::vector<int64_t> offsets = {-1, -1, 1024, 2048};
  absl::StatusOr<FlashInferPageTable> t = BuildFlashInferPageTable(seqs, offsets, 16, 1024);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_THAT(t->indptr, ElementsAre(0, 2));
  EXPECT_THAT(t->page_indices, ElementsAre(1, 2));
  EXPECT_THAT(t->last_page_len, ElementsAre(2));
  EXPECT_THAT(t->kv_len, ElementsAre(18));
}

TEST(FlashInferPageTableTest, RefusesWhatBreaksTheLayersInvariants) {
  const std::vector<SequenceDesc> seqs = {Sequence(0, 1, 40, 0)};
  // An evicted page after a kept one.
  EXPECT_EQ(BuildFlashInferPageTable(seqs, std::vector<int64_t>{0, -1, 1024}, 16, 1024)
                .status()
                .code(),
            absl::StatusCode::kInternal);
  // An offset that is not a multiple of the unit.
  EXPECT_EQ(BuildFlashInferPageTable(seqs, std::vector<int64_t>{0, 512, 1024}, 16, 1024)
                .status()
                .code(),
            absl::StatusCode::kInternal);
  // A page index past int32.
  EXPECT_EQ(BuildFlashInferPageTable(seqs, std::vector<int64_t>{0, int64_t{1} << 42, 1024}, 16, 2)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace attnserve::cuda
