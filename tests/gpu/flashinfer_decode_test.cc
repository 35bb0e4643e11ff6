// FlashInfer's decode kernel (kernels/cuda/flashinfer/paged_decode.h) on a real GPU, over pages in
// our layout, against float64: bf16 and f16 KV, head dims 64/128/256, GQA groups 1/4/8, lengths
// crossing page edges (1, 15, 16, 17, 200, 1000), pages scattered over a NaN-poisoned pool, q read
// from fused qkv rows whose K/V columns are NaN, a sliding window whose evicted leading pages are
// left out of the page list, logit soft-cap, page indices in a unit smaller than a page, and the
// split-KV plan (decode_plan.h) both splitting (batch 1 and 2 at 1000+ tokens) and not. Without a
// device every case skips ("FlashInfer decode: SKIPPED", which ctest reports as a skip).
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda/flashinfer/paged_decode.h"
#include "tests/gpu/device_test_buffer.h"
#include "tests/gpu/emulation_support.h"

namespace attnserve::cuda {
namespace {

using emulation::CompareWithReference;
using emulation::DrawCaseSeed;
using emulation::ElementBytes;
using emulation::LoadElement;
using emulation::MakePagedBatch;
using emulation::PagedBatch;
using emulation::SequenceShape;
using emulation::StoreElement;

struct DecodeCase {
  KvType type;
  int head_dim;
  int kv_heads;
  int group;
  int window;  // 0 = none.
  std::vector<int> lengths;
  float soft_cap = 0.0f;
  // Bytes before the first page in the device pool. Nonzero: pages sit at offsets that are not
  // multiples of the page size, so page indices count gcd(shift, page bytes)-byte units, as the
  // layer's slabbed pool makes them.
  int64_t pool_shift = 0;
  // Grid budget for the plan; 0 = the device's (FlashInferDecodeGridBudget).
  int budget = 0;
  // Whether the plan must split (1), must not (0), or either (-1): cases meant to cover one path
  // fail rather than silently cover the other.
  int expect_split = -1;
};

std::string CaseName(const DecodeCase& c) {
  return absl::StrCat(c.type == KvType::kBF16 ? "bf16" : "f16", "_hd", c.head_dim, "_kv",
                      c.kv_heads, "_g", c.group, c.window > 0 ? absl::StrCat("_w", c.window) : "",
                      c.soft_cap > 0 ? absl::StrCat("_cap", c.soft_cap) : "",
                      c.pool_shift > 0 ? absl::StrCat("_shift", c.pool_shift) : "", "_b",
                      c.lengths.size(), "_max", c.lengths.back());
}

// bf16 keeps 8 significant bits: outputs are rounded to it (2^-9 relative), plus accumulation in
// fp32 over up to 1000+ keys and, when split, partial outputs rounded to it before the merge;
// f16 keeps 11.
double Tolerance(KvType type) { return type == KvType::kBF16 ? 8e-3 : 1e-3; }

void RunCase(const DecodeCase& c) {
  constexpr int kPageSize = 16;
  const int heads = c.kv_heads * c.group;
  const int elem = ElementBytes(c.type);
  std::mt19937_64 rng(DrawCaseSeed(CaseName(c)));
  std::vector<SequenceShape> shapes;
  for (int length : c.lengths) shapes.push_back({length - 1, 1});
  MaskSpec mask;
  mask.causal = 1;
  mask.window = c.window;
  PagedBatch batch =
      MakePagedBatch(shapes, c.type, c.kv_heads, c.head_dim, kPageSize, mask, rng);
  const int64_t page_bytes = batch.PageElements() * elem;
  const int64_t unit = c.pool_shift > 0 ? std::gcd(c.pool_shift, page_bytes) : page_bytes;
  ASSERT_EQ(unit % 16, 0) << "FlashInfer's 16-byte loads";

  // FlashInfer's page list: page indices from the first page still in the window.
  std::vector<int32_t> indptr = {0}, page_indices, last_page_len, visible_pages;
  for (size_t b = 0; b < batch.sequences.size(); ++b) {
    const SequenceDesc& s = batch.sequences[b];
    const int pages = (s.length + kPageSize - 1) / kPageSize;
    for (int p = 0; p < pages; ++p) {
      const int64_t offset = batch.page_offsets[s.first_page + p];
      if (offset < 0) {
        ASSERT_TRUE(page_indices.size() == static_cast<size_t>(indptr.back()))
            << "an evicted page after a live one";
        continue;
      }
      ASSERT_EQ((c.pool_shift + offset) % unit, 0);
      page_indices.push_back(static_cast<int32_t>((c.pool_shift + offset) / unit));
    }
    visible_pages.push_back(static_cast<int32_t>(page_indices.size()) - indptr.back());
    indptr.push_back(static_cast<int32_t>(page_indices.size()));
    last_page_len.push_back(s.length - (pages - 1) * kPageSize);
  }

  // q inside fused qkv rows, rounded to the KV type (FlashInfer reads q in it); the reference gets
  // the rounded values. The K and V columns stay 0xFF (NaN): a wrong stride shows.
  const int64_t q_width = int64_t{heads} * c.head_dim;
  const int64_t qkv_stride = int64_t{heads + 2 * c.kv_heads} * c.head_dim;
  std::vector<float> q_rounded(batch.rows * q_width);
  std::vector<uint8_t> qkv_bytes(batch.rows * qkv_stride * elem, 0xFF);
  std::normal_distribution<float> normal;
  for (int r = 0; r < batch.rows; ++r) {
    for (int64_t i = 0; i < q_width; ++i) {
      q_rounded[r * q_width + i] = static_cast<float>(StoreElement(
          normal(rng), c.type, qkv_bytes.data() + (r * qkv_stride + i) * elem));
    }
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  const std::vector<double> expected = emulation::ReferenceAttention(
      batch, q_rounded.data(), q_width, heads, c.group, scale, c.soft_cap);

  FlashInferDecodeShape shape;
  shape.page_size = kPageSize;
  shape.num_heads = heads;
  shape.num_kv_heads = c.kv_heads;
  shape.head_dim = c.head_dim;
  shape.grid_budget = c.budget;
  if (shape.grid_budget == 0) {
    ASSERT_EQ(FlashInferDecodeGridBudget(c.type, c.head_dim, c.group, c.soft_cap > 0,
                                         &shape.grid_budget),
              cudaSuccess);
    ASSERT_GT(shape.grid_budget, 0);
  }
  FlashInferDecodePlan plan;
  ASSERT_TRUE(PlanFlashInferDecode(visible_pages, shape, &plan));
  if (c.expect_split >= 0) {
    ASSERT_EQ(plan.info.split_kv, c.expect_split == 1);
  }

  // The pool shifted by pool_shift bytes; the shift itself is NaN too.
  std::vector<uint8_t> pool_bytes(c.pool_shift + batch.pool.size() * sizeof(uint32_t), 0xFF);
  std::memcpy(pool_bytes.data() + c.pool_shift, batch.pool.data(),
              batch.pool.size() * sizeof(uint32_t));
  DeviceBuffer pool(pool_bytes.data(), pool_bytes.size());
  DeviceBuffer qkv(qkv_bytes.data(), qkv_bytes.size());
  const size_t out_bytes_count = static_cast<size_t>(batch.rows * q_width * elem);
  std::vector<uint8_t> out_bytes(out_bytes_count, 0xFF);
  DeviceBuffer out(out_bytes.data(), out_bytes.size());
  DeviceBuffer d_indptr(indptr.data(), indptr.size() * sizeof(int32_t));
  DeviceBuffer d_pages(page_indices.data(), page_indices.size() * sizeof(int32_t));
  DeviceBuffer d_last(last_page_len.data(), last_page_len.size() * sizeof(int32_t));
  DeviceBuffer d_plan(plan.packed.data(), plan.packed.size() * sizeof(int32_t));
  // Scratch poisoned: the merge must read only what the chunks wrote.
  std::vector<uint8_t> tmp_v_poison(plan.info.tmp_v_elements * elem, 0xFF);
  std::vector<uint8_t> tmp_s_poison(plan.info.tmp_s_elements * sizeof(float), 0xFF);
  DeviceBuffer tmp_v(tmp_v_poison.data(), tmp_v_poison.size());
  DeviceBuffer tmp_s(tmp_s_poison.data(), tmp_s_poison.size());

  FlashInferDecodeArgs args;
  args.kv.kv_type = c.type;
  args.kv.head_dim = c.head_dim;
  args.kv.num_kv_heads = c.kv_heads;
  args.kv.page_size = kPageSize;
  args.kv.pool = pool.get();
  args.kv.page_stride_elements = unit / elem;
  args.kv.indptr = static_cast<int32_t*>(d_indptr.get());
  args.kv.page_indices = static_cast<int32_t*>(d_pages.get());
  args.kv.last_page_len = static_cast<int32_t*>(d_last.get());
  args.num_heads = heads;
  args.q = qkv.get();
  args.q_stride_n = qkv_stride;
  args.q_stride_h = c.head_dim;
  args.out = out.get();
  args.window = c.window;
  args.soft_cap = c.soft_cap;
  args.sm_scale = static_cast<float>(scale);
  args.plan_info = plan.info;
  args.plan = static_cast<int32_t*>(d_plan.get());
  if (plan.info.split_kv) {
    args.tmp_v = tmp_v.get();
    args.tmp_s = static_cast<float*>(tmp_s.get());
  }
  ASSERT_TRUE(FlashInferDecodeSupports(c.type, c.head_dim, c.group));
  ASSERT_EQ(FlashInferDecode(args, /*stream=*/0), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  ASSERT_EQ(cudaMemcpy(out_bytes.data(), out.get(), out_bytes.size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  // Output row b is sequence b; the reference's rows are the sequences' first_row.
  std::vector<float> actual(expected.size());
  for (size_t b = 0; b < batch.sequences.size(); ++b) {
    const int row = batch.sequences[b].first_row;
    for (int64_t i = 0; i < q_width; ++i) {
      actual[row * q_width + i] =
          static_cast<float>(LoadElement(out_bytes.data() + (b * q_width + i) * elem, c.type));
    }
  }
  const emulation::OutputError error = CompareWithReference(actual, expected);
  std::printf("[flashinfer] %-44s rel err %.2e (bound %.0e); budget %d, %s: %d items\n",
              CaseName(c).c_str(), error.relative, Tolerance(c.type), shape.grid_budget,
              plan.info.split_kv ? "split" : "not split", plan.info.padded_batch_size);
  EXPECT_EQ(error.nan_count, 0);
  EXPECT_LE(error.relative, Tolerance(c.type));
}

class FlashInferDecodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveDevice()) {
      std::printf("FlashInfer decode: SKIPPED (no CUDA device)\n");
      GTEST_SKIP() << "no CUDA device";
    }
  }
};

const std::vector<int> kLengths = {1, 15, 16, 17, 200, 1000};

TEST_F(FlashInferDecodeTest, HeadDimsAndGroups) {
  for (KvType type : {KvType::kBF16, KvType::kF16}) {
    for (int head_dim : {64, 128, 256}) {
      for (int group : {1, 4, 8}) {
        const DecodeCase c{type, head_dim, /*kv_heads=*/2, group, /*window=*/0, kLengths};
        SCOPED_TRACE(CaseName(c));
        RunCase(c);
      }
    }
  }
}

TEST_F(FlashInferDecodeTest, SlidingWindowWithEvictedPages) {
  for (int window : {1, 16, 33, 700}) {
    DecodeCase c{KvType::kBF16, 128, /*kv_heads=*/2, /*group=*/4, window, kLengths};
    SCOPED_TRACE(CaseName(c));
    RunCase(c);
  }
}

TEST_F(FlashInferDecodeTest, SplitKvAtBatchOneAndTwo) {
  for (KvType type : {KvType::kBF16, KvType::kF16}) {
    for (const std::vector<int>& lengths :
         std::vector<std::vector<int>>{{1000}, {1500}, {1024, 1333}, {4097, 1}}) {
      DecodeCase c{type, 128, /*kv_heads=*/2, /*group=*/4, /*window=*/0, lengths};
      c.expect_split = 1;
      SCOPED_TRACE(CaseName(c));
      RunCase(c);
    }
  }
  // Group 1 (4 keys per thread tile) and 8 with a split sliding window.
  DecodeCase g1{KvType::kBF16, 64, /*kv_heads=*/4, /*group=*/1, /*window=*/0, {2000}};
  g1.expect_split = 1;
  RunCase(g1);
  DecodeCase g8{KvType::kF16, 256, /*kv_heads=*/1, /*group=*/8, /*window=*/900, {1200, 3000}};
  g8.expect_split = 1;
  RunCase(g8);
}

TEST_F(FlashInferDecodeTest, WithoutSplitWhenTheBatchFillsTheBudget) {
  // A budget of batch x kv_heads blocks: the plan keeps every sequence whole.
  DecodeCase c{KvType::kBF16, 128, /*kv_heads=*/2, /*group=*/4, /*window=*/0, kLengths};
  c.budget = static_cast<int>(kLengths.size()) * 2;
  c.expect_split = 0;
  RunCase(c);
}

TEST_F(FlashInferDecodeTest, LogitSoftCap) {
  // Gemma 2's cap of 50 (the scores here stay well below it, so this checks the variant's scale
  // path): bf16 and f16, split and not.
  for (KvType type : {KvType::kBF16, KvType::kF16}) {
    for (int budget : {0, 12}) {
      DecodeCase c{type, 256, /*kv_heads=*/2, /*group=*/2, /*window=*/0, kLengths};
      c.soft_cap = 50.0f;
      c.budget = budget;
      c.expect_split = budget == 0 ? 1 : 0;
      SCOPED_TRACE(CaseName(c));
      RunCase(c);
    }
  }
  // A cap of 1.5 bends most scores (|s| ~ 1 here): a missing or misplaced tanh fails it.
  DecodeCase c{KvType::kBF16, 128, /*kv_heads=*/2, /*group=*/4, /*window=*/33, kLengths};
  c.soft_cap = 1.5f;
  RunCase(c);
}

TEST_F(FlashInferDecodeTest, PageIndicesInUnitsSmallerThanAPage) {
  // 768 bytes before the first page: page indices count 256-byte units.
  for (int head_dim : {64, 128}) {
    DecodeCase c{KvType::kBF16, head_dim, /*kv_heads=*/2, /*group=*/4, /*window=*/0, kLengths};
    c.pool_shift = 768;
    SCOPED_TRACE(CaseName(c));
    RunCase(c);
  }
  DecodeCase c{KvType::kF16, 128, /*kv_heads=*/2, /*group=*/8, /*window=*/0, {1000, 1100}};
  c.pool_shift = 768;
  c.expect_split = 1;
  RunCase(c);
}

TEST(FlashInferDecodeShapes, UnsupportedShapesAreRefused) {
  EXPECT_FALSE(FlashInferDecodeSupports(KvType::kF32, 128, 4));
  EXPECT_FALSE(FlashInferDecodeSupports(KvType::kBF16, 96, 4));
  EXPECT_FALSE(FlashInferDecodeSupports(KvType::kBF16, 128, 16));
  EXPECT_FALSE(FlashInferDecodeSupports(KvType::kBF16, 128, 5));
  EXPECT_TRUE(FlashInferDecodeSupports(KvType::kF16, 64, 3));
  int budget = -1;
  EXPECT_EQ(FlashInferDecodeGridBudget(KvType::kBF16, 128, 16, false, &budget),
            cudaErrorInvalidValue);
  EXPECT_EQ(budget, -1);
  // Refused before any launch, so this runs without a device too.
  int32_t dummy[4] = {};
  FlashInferDecodeArgs args;
  args.kv.kv_type = KvType::kBF16;
  args.kv.head_dim = 128;
  args.kv.num_kv_heads = 2;
  args.kv.page_size = 16;
  args.kv.pool = dummy;
  args.kv.page_stride_elements = 8192;
  args.kv.indptr = args.kv.page_indices = args.kv.last_page_len = dummy;
  args.num_heads = 32;  // Group 16: no decode instance.
  args.q = args.out = dummy;
  args.q_stride_n = 32 * 128;
  args.q_stride_h = 128;
  args.plan = dummy;
  args.plan_info.batch = args.plan_info.padded_batch_size = 1;
  EXPECT_EQ(FlashInferDecode(args, 0), cudaErrorInvalidValue);
  // A split plan without scratch.
  args.num_heads = 8;
  args.plan_info.split_kv = true;
  args.plan_info.padded_batch_size = 4;
  EXPECT_EQ(FlashInferDecode(args, 0), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace attnserve::cuda
