// The host schedule of FlashInfer's MLA kernel (kernels/cuda/flashinfer/mla_plan.h), on the CPU:
// every (sequence, query tile) is served over exactly its visible keys, chunks tile the key range
// in order, split tiles get merge entries over their partial rows, sections are 16-byte aligned,
// and input MLAPlan would refuse is refused. Checked against rules written here from MLAPlan's
// description, not against the port's own helpers.
#include "kernels/cuda/flashinfer/mla_plan.h"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace attnserve::cuda {
namespace {

struct Batch {
  std::vector<FlashInferMlaSequence> sequences;
  std::vector<int32_t> q_indptr{0};
  std::vector<int32_t> kv_indptr{0};
  void Add(int qo_len, int kv_len, int page_size) {
    sequences.push_back({qo_len, kv_len});
    q_indptr.push_back(q_indptr.back() + qo_len);
    kv_indptr.push_back(kv_indptr.back() + (kv_len + page_size - 1) / page_size);
  }
};

int32_t At(const FlashInferMlaPlan& p, int section, int i) { return p.packed[section + i]; }

// Keys a causal tile of packed rows [tile * rows, (tile + 1) * rows) may see: every key up to its
// last row's token (queries right-aligned to the keys), rounded up to a whole token as MLAPlan
// does; the last tile sees all.
int CausalEnd(const FlashInferMlaSequence& s, int tile, int tile_rows, int heads) {
  const int packed = s.qo_len * heads;
  if ((tile + 1) * tile_rows >= packed) return s.kv_len;
  return std::min(s.kv_len - s.qo_len + ((tile + 1) * tile_rows + heads - 1) / heads, s.kv_len);
}

void CheckCoverage(const Batch& b, const FlashInferMlaPlan& p, int heads, bool causal) {
  for (int section : {p.q_indptr, p.kv_indptr, p.partial_indptr, p.merge_packed_offset_start,
                      p.q_len, p.kv_len, p.q_start, p.kv_start, p.kv_end, p.work_indptr}) {
    EXPECT_EQ(section % 4, 0) << "16-byte aligned";
  }
  const int tile_rows = 64 * p.num_blks_x;
  ASSERT_EQ(At(p, p.work_indptr, 0), 0);
  ASSERT_EQ(At(p, p.work_indptr, p.num_blks_y), p.total_works);
  // (sequence, q_start) -> the key chunks serving it, in the order the works list them.
  std::map<std::pair<int, int>, std::vector<std::pair<int, int>>> chunks;
  int partial_rows = 0;
  for (int c = 0; c < p.num_blks_y; ++c) {
    ASSERT_LE(At(p, p.work_indptr, c), At(p, p.work_indptr, c + 1));
    for (int w = At(p, p.work_indptr, c); w < At(p, p.work_indptr, c + 1); ++w) {
      const int q_indptr = At(p, p.q_indptr, w);
      const int seq = static_cast<int>(
          std::upper_bound(b.q_indptr.begin(), b.q_indptr.end() - 1, q_indptr) -
          b.q_indptr.begin() - 1);
      ASSERT_GE(seq, 0);
      EXPECT_EQ(At(p, p.kv_indptr, w), b.kv_indptr[seq]);
      EXPECT_EQ(At(p, p.q_len, w), b.sequences[seq].qo_len);
      EXPECT_EQ(At(p, p.kv_len, w), b.sequences[seq].kv_len);
      EXPECT_EQ(At(p, p.q_start, w) % tile_rows, 0);
      chunks[{seq, At(p, p.q_start, w)}].push_back({At(p, p.kv_start, w), At(p, p.kv_end, w)});
      if (At(p, p.partial_indptr, w) >= 0) {
        const int rows = std::min(tile_rows, b.sequences[seq].qo_len * heads -
                                                 At(p, p.q_start, w));
        partial_rows += rows;
      }
    }
  }
  EXPECT_EQ(partial_rows, p.partial_rows);
  for (size_t i = 0; i < b.sequences.size(); ++i) {
    const FlashInferMlaSequence& s = b.sequences[i];
    const int packed = s.qo_len * heads;
    const int num_tiles = std::max(1, (packed + tile_rows - 1) / tile_rows);
    for (int t = 0; t < (packed == 0 ? 0 : num_tiles); ++t) {
      auto it = chunks.find({static_cast<int>(i), t * tile_rows});
      ASSERT_NE(it, chunks.end()) << "sequence " << i << " tile " << t << " has no work";
      std::vector<std::pair<int, int>> ranges = it->second;
      std::sort(ranges.begin(), ranges.end());
      int next = 0;
      for (const auto& [begin, end] : ranges) {
        EXPECT_EQ(begin, next) << "chunks tile the key range";
        EXPECT_LE(begin, end);
        next = end;
      }
      EXPECT_EQ(next, causal ? CausalEnd(s, t, tile_rows, heads) : s.kv_len)
          << "sequence " << i << " tile " << t;
    }
  }
}

TEST(FlashInferMlaPlanTest, DecodeBatchOf128HeadsUsesClustersOfTwo) {
  Batch b;
  for (int kv : {1, 64, 65, 8192, 300}) b.Add(1, kv, 64);
  std::optional<FlashInferMlaPlan> p =
      PlanFlashInferMla(b.sequences, b.q_indptr, b.kv_indptr, 128, 512, true, 132);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->num_blks_x, 2) << "128 packed rows per sequence > 64";
  EXPECT_EQ(p->num_blks_y, 66);
  EXPECT_LE(p->merge_ctas, 132);
  EXPECT_GT(p->merge_ctas, 0) << "the 8192-key sequence is split";
  EXPECT_EQ(p->partial_o_bytes, int64_t{2} * 66 * 128 * 2 * 512);
  CheckCoverage(b, *p, 128, true);
}

TEST(FlashInferMlaPlanTest, ChunkedPrefillOverACachedPrefixIsCausal) {
  Batch b;
  b.Add(3, 100, 64);    // 3 new tokens over 97 cached: 48 packed rows, one tile.
  b.Add(40, 40, 64);    // A fresh prompt: 640 rows over 10 tiles of 64.
  b.Add(0, 7, 64);      // No new tokens: no tile.
  std::optional<FlashInferMlaPlan> p =
      PlanFlashInferMla(b.sequences, b.q_indptr, b.kv_indptr, 16, 512, true, 8);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->num_blks_x, 2) << "average packed length 229 > 64";
  CheckCoverage(b, *p, 16, true);
}

TEST(FlashInferMlaPlanTest, SplitTilesGetMergeEntriesOverTheirPartialRows) {
  Batch b;
  b.Add(1, 20000, 64);
  std::optional<FlashInferMlaPlan> p =
      PlanFlashInferMla(b.sequences, b.q_indptr, b.kv_indptr, 16, 512, true, 4);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->num_blks_x, 1);
  // 20000 keys over 4 clusters: a limit of 5120 keys, so 4 chunks of the one 16-row tile.
  EXPECT_EQ(p->total_works, 4);
  EXPECT_EQ(p->partial_rows, 4 * 16);
  ASSERT_GE(p->merge_ctas, 1);
  EXPECT_EQ(At(*p, p->merge_packed_offset_start, 0), 0);
  EXPECT_EQ(At(*p, p->merge_partial_stride, 0), 16);
  EXPECT_EQ(At(*p, p->merge_partial_packed_offset_end, 0), 4 * 16);
  int merged_rows = 0;
  for (int m = 0; m < p->merge_ctas; ++m) {
    merged_rows += At(*p, p->merge_packed_offset_end, m) - At(*p, p->merge_packed_offset_start, m);
  }
  EXPECT_EQ(merged_rows, 16) << "every row of the split tile is merged once";
  CheckCoverage(b, *p, 16, true);
}

TEST(FlashInferMlaPlanTest, NonCausalTilesSeeEveryKey) {
  Batch b;
  b.Add(10, 30, 16);
  b.Add(5, 5, 16);
  std::optional<FlashInferMlaPlan> p =
      PlanFlashInferMla(b.sequences, b.q_indptr, b.kv_indptr, 32, 512, false, 16);
  ASSERT_TRUE(p.has_value());
  CheckCoverage(b, *p, 32, false);
}

TEST(FlashInferMlaPlanTest, RefusesWhatMlaPlanRefuses) {
  Batch b;
  b.Add(2, 10, 16);
  EXPECT_FALSE(PlanFlashInferMla({}, {0}, {0}, 16, 512, true, 8).has_value()) << "empty batch";
  EXPECT_FALSE(PlanFlashInferMla({{5, 4}}, {0, 5}, {0, 1}, 16, 512, true, 8).has_value())
      << "kv_len < qo_len";
  EXPECT_FALSE(PlanFlashInferMla(b.sequences, {0}, b.kv_indptr, 16, 512, true, 8).has_value())
      << "q_indptr of the wrong size";
  EXPECT_FALSE(PlanFlashInferMla(b.sequences, b.q_indptr, b.kv_indptr, 0, 512, true, 8).has_value());
  EXPECT_FALSE(PlanFlashInferMla(b.sequences, b.q_indptr, b.kv_indptr, 16, 512, true, 0).has_value());
}

}  // namespace
}  // namespace attnserve::cuda
