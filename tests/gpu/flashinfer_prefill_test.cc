// FlashInfer's prefill kernel (kernels/cuda/flashinfer/paged_prefill.h) on a real GPU, scheduled by
// PlanFlashInferPrefill, over pages in our layout, against float64: bf16 and f16, head dims
// 64/128/256, GQA groups 1/4/8 and 32 (MQA with 32 heads, the decode-through-prefill path), ragged
// batches whose lengths cross page edges (1, 15, 16, 17, 200, 1000), chunks over a cached prefix,
// causal and non-causal masks, a sliding window with its evicted leading pages left out of the
// page list, and the logits soft-cap. Pages sit scattered in a NaN-poisoned pool at offsets that
// are multiples of a quarter page only (the page index unit of FlashInferPages smaller than a
// page), q rows have a stride wider than their heads with NaN in between, and the output starts
// as NaN. Without a device every case skips ("FlashInfer prefill: SKIPPED", a ctest skip).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda/flashinfer/paged_prefill.h"
#include "kernels/cuda/flashinfer/prefill_plan.h"
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

constexpr int kPageSize = 16;

struct PrefillCase {
  KvType type = KvType::kBF16;
  int head_dim = 128;
  int kv_heads = 2;
  int group = 4;
  bool causal = true;
  int window = 0;                     // 0 = none.
  float soft_cap = 0.0f;              // 0 = none.
  std::vector<SequenceShape> shapes;  // {tokens already cached, new tokens} per sequence.
};

std::string CaseName(const PrefillCase& c) {
  return absl::StrCat(c.type == KvType::kBF16 ? "bf16" : "f16", "_hd", c.head_dim, "_kv",
                      c.kv_heads, "_g", c.group, c.causal ? "" : "_noncausal",
                      c.window > 0 ? absl::StrCat("_w", c.window) : "",
                      c.soft_cap > 0 ? absl::StrCat("_cap", c.soft_cap) : "");
}

// Relative L2 error bounds. FlashInfer's prefill rounds the softmax weights P to the KV type
// before the P.V tensor-core product and writes the output in it; q.k and the sums accumulate in
// fp32. bf16 keeps 8 significant bits (2^-9 relative rounding per value, about 1e-3 rms after
// both roundings), f16 keeps 11 (2^-12). The bounds leave 4x margin over that, and stay far below
// what a wrong key, mask or page would cost (order 1).
double Tolerance(KvType type) { return type == KvType::kBF16 ? 8e-3 : 2e-3; }

// The batch's pages moved to offsets that are multiples of a quarter page only: slot s of
// LayOutPagedBatch's pool lands at s pages plus a gap growing by 1..3 quarter pages per slot, as
// pages of slabs whose sizes are not page multiples would. The gaps stay NaN.
struct SubPagePool {
  std::vector<uint8_t> bytes;
  int64_t unit_bytes = 0;            // The page index unit: a quarter page.
  std::vector<int64_t> page_offset;  // Per entry of batch.page_offsets: new byte offset, or -1.
};

SubPagePool ScatterAtSubPageOffsets(const PagedBatch& batch, std::mt19937_64& rng) {
  const int64_t page_bytes = batch.PageElements() * ElementBytes(batch.type);
  SubPagePool pool;
  pool.unit_bytes = page_bytes / 4;
  std::vector<int64_t> slot_offset(batch.pool_pages);
  std::uniform_int_distribution<int> gap_units(1, 3);
  int64_t gap = 0;
  for (int slot = 0; slot < batch.pool_pages; ++slot) {
    gap += gap_units(rng) * pool.unit_bytes;
    slot_offset[slot] = slot * page_bytes + gap;
  }
  pool.bytes.assign(static_cast<size_t>(batch.pool_pages * page_bytes + gap), 0xFF);
  const auto* source = reinterpret_cast<const uint8_t*>(batch.pool.data());
  for (int64_t old_offset : batch.page_offsets) {
    if (old_offset < 0) {
      pool.page_offset.push_back(-1);
      continue;
    }
    const int64_t new_offset = slot_offset[old_offset / page_bytes];
    std::memcpy(pool.bytes.data() + new_offset, source + old_offset, page_bytes);
    pool.page_offset.push_back(new_offset);
  }
  return pool;
}

void RunCase(const PrefillCase& c) {
  const int heads = c.kv_heads * c.group;
  const int d = c.head_dim;
  std::mt19937_64 rng(DrawCaseSeed(CaseName(c)));
  MaskSpec mask;
  mask.causal = c.causal ? 1 : 0;
  mask.window = c.window;
  PagedBatch batch = MakePagedBatch(c.shapes, c.type, c.kv_heads, d, kPageSize, mask, rng);
  const SubPagePool pool = ScatterAtSubPageOffsets(batch, rng);
  const int element_bytes = ElementBytes(c.type);

  // FlashInfer's page list from the first page still in the window, in quarter-page units.
  std::vector<int32_t> indptr = {0}, page_indices, last_page_len;
  std::vector<FlashInferPrefillSequence> plan_input;
  for (const SequenceDesc& s : batch.sequences) {
    const int pages = (s.length + kPageSize - 1) / kPageSize;
    int evicted = 0;
    for (int p = 0; p < pages; ++p) {
      const int64_t offset = pool.page_offset[s.first_page + p];
      if (offset < 0) {
        ASSERT_EQ(page_indices.size(), static_cast<size_t>(indptr.back()))
            << "an evicted page after a live one";
        ++evicted;
        continue;
      }
      ASSERT_EQ(offset % pool.unit_bytes, 0);
      page_indices.push_back(static_cast<int32_t>(offset / pool.unit_bytes));
    }
    indptr.push_back(static_cast<int32_t>(page_indices.size()));
    last_page_len.push_back(s.length - (pages - 1) * kPageSize);
    plan_input.push_back({s.num_new, s.length - evicted * kPageSize});
  }
  const std::optional<FlashInferPrefillPlan> plan = PlanFlashInferPrefill(plan_input, c.group, d);
  ASSERT_TRUE(plan.has_value());

  // q rows as a fused qkv buffer would hold them: heads, then room for K and V heads left NaN.
  // Rounded to the KV type (FlashInfer reads q in it); the reference gets the rounded values.
  const int64_t q_stride = int64_t{heads + 2 * c.kv_heads} * d;
  std::vector<float> q_rounded(static_cast<size_t>(batch.rows * q_stride), NAN);
  std::vector<uint8_t> q_bytes(q_rounded.size() * element_bytes, 0xFF);
  std::normal_distribution<float> normal;
  for (int r = 0; r < batch.rows; ++r) {
    for (int64_t e = 0; e < int64_t{heads} * d; ++e) {
      const int64_t i = r * q_stride + e;
      q_rounded[i] =
          static_cast<float>(StoreElement(normal(rng), c.type, q_bytes.data() + i * element_bytes));
    }
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const std::vector<double> expected = emulation::ReferenceAttention(
      batch, q_rounded.data(), q_stride, heads, c.group, scale, c.soft_cap);

  const std::vector<uint8_t> out_poison(expected.size() * element_bytes, 0xFF);
  DeviceBuffer d_pool(pool.bytes.data(), pool.bytes.size());
  DeviceBuffer d_q(q_bytes.data(), q_bytes.size());
  DeviceBuffer d_out(out_poison.data(), out_poison.size());
  DeviceBuffer d_indptr(indptr.data(), indptr.size() * sizeof(int32_t));
  DeviceBuffer d_pages(page_indices.data(), page_indices.size() * sizeof(int32_t));
  DeviceBuffer d_last(last_page_len.data(), last_page_len.size() * sizeof(int32_t));
  DeviceBuffer d_schedule(plan->packed.data(), plan->packed.size() * sizeof(int32_t));

  FlashInferPrefillArgs args;
  args.kv.kv_type = c.type;
  args.kv.head_dim = d;
  args.kv.num_kv_heads = c.kv_heads;
  args.kv.page_size = kPageSize;
  args.kv.pool = d_pool.get();
  args.kv.page_stride_elements = pool.unit_bytes / element_bytes;
  args.kv.indptr = d_indptr.ints();
  args.kv.page_indices = d_pages.ints();
  args.kv.last_page_len = d_last.ints();
  args.num_heads = heads;
  args.batch = plan->batch;
  args.q = d_q.get();
  args.q_stride_row = q_stride;
  args.schedule = FlashInferPrefillSchedule::Of(*plan, d_schedule.ints());
  // Rows are in sequence order, so the schedule's o_indptr is q's row offsets too.
  args.q_indptr = args.schedule.packed + plan->o_indptr_offset;
  args.out = d_out.get();
  args.causal = c.causal;
  args.window = c.window;
  args.soft_cap = c.soft_cap;
  args.sm_scale = static_cast<float>(scale);
  ASSERT_TRUE(FlashInferPrefillSupports(c.type, d, c.group));
  ASSERT_EQ(FlashInferPrefill(args, /*stream=*/0), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  std::vector<uint8_t> out_bytes(out_poison.size());
  ASSERT_EQ(cudaMemcpy(out_bytes.data(), d_out.get(), out_bytes.size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  std::vector<float> actual(expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    actual[i] = static_cast<float>(LoadElement(out_bytes.data() + i * element_bytes, c.type));
  }
  const emulation::OutputError error = CompareWithReference(actual, expected);
  std::printf("[flashinfer prefill] %-32s tile %3d blocks %4d rel err %.2e (bound %.0e)\n",
              CaseName(c).c_str(), plan->cta_tile_q, plan->padded_batch_size, error.relative,
              Tolerance(c.type));
  EXPECT_EQ(error.nan_count, 0);
  EXPECT_LE(error.relative, Tolerance(c.type));
}

class FlashInferPrefillTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveDevice()) {
      std::printf("FlashInfer prefill: SKIPPED (no CUDA device)\n");
      GTEST_SKIP() << "no CUDA device";
    }
  }
};

// Total lengths 1, 15, 16, 17, 200 and 1000: whole prompts, and chunks over a cached prefix (3 of
// 17 cached, 936 of 1000).
const std::vector<SequenceShape> kRaggedPrefill = {{0, 1},  {0, 15},  {0, 16},
                                                   {3, 14}, {0, 200}, {936, 64}};
// One new token per sequence (decode through the prefill kernel), same lengths.
const std::vector<SequenceShape> kDecode = {{0, 1}, {14, 1}, {15, 1}, {16, 1}, {199, 1}, {999, 1}};

TEST_F(FlashInferPrefillTest, HeadDimsAndGroups) {
  for (KvType type : {KvType::kBF16, KvType::kF16}) {
    for (int head_dim : {64, 128, 256}) {
      for (int group : {1, 4, 8}) {
        PrefillCase c;
        c.type = type;
        c.head_dim = head_dim;
        c.group = group;
        c.shapes = kRaggedPrefill;
        SCOPED_TRACE(CaseName(c));
        RunCase(c);
      }
    }
  }
}

TEST_F(FlashInferPrefillTest, MultiQueryDecodeAndPrefill) {
  // MQA with 32 heads: group 32, beyond FlashInfer's decode kernel.
  for (int head_dim : {64, 128, 256}) {
    for (const std::vector<SequenceShape>* shapes : {&kDecode, &kRaggedPrefill}) {
      PrefillCase c;
      c.head_dim = head_dim;
      c.kv_heads = 1;
      c.group = 32;
      c.shapes = *shapes;
      SCOPED_TRACE(CaseName(c));
      RunCase(c);
    }
  }
  PrefillCase f16;
  f16.type = KvType::kF16;
  f16.kv_heads = 1;
  f16.group = 32;
  f16.shapes = kDecode;
  RunCase(f16);
}

TEST_F(FlashInferPrefillTest, SmallGroupDecode) {
  // Packed rows 1 and 4 per sequence on 64-row tiles (FlashInfer's 16-row tile is not built).
  for (int group : {1, 4}) {
    PrefillCase c;
    c.group = group;
    c.shapes = kDecode;
    SCOPED_TRACE(CaseName(c));
    RunCase(c);
  }
}

TEST_F(FlashInferPrefillTest, NonCausal) {
  for (KvType type : {KvType::kBF16, KvType::kF16}) {
    PrefillCase c;
    c.type = type;
    c.causal = false;
    c.shapes = kRaggedPrefill;
    SCOPED_TRACE(CaseName(c));
    RunCase(c);
  }
  // A window is a causal notion (MaskSpec): non-causal attention ignores it.
  PrefillCase windowed;
  windowed.causal = false;
  windowed.window = 16;
  windowed.shapes = kRaggedPrefill;
  RunCase(windowed);
}

TEST_F(FlashInferPrefillTest, SlidingWindowWithEvictedPages) {
  for (int window : {1, 16, 33, 100}) {
    for (const std::vector<SequenceShape>* shapes : {&kRaggedPrefill, &kDecode}) {
      PrefillCase c;
      c.window = window;
      c.shapes = *shapes;
      SCOPED_TRACE(CaseName(c));
      RunCase(c);
    }
  }
  PrefillCase f16;
  f16.type = KvType::kF16;
  f16.head_dim = 64;
  f16.window = 33;
  f16.shapes = kRaggedPrefill;
  RunCase(f16);
}

TEST_F(FlashInferPrefillTest, SoftCap) {
  // A cap of 2 bends scores of N(0, 1) visibly: without it the error would be order 1.
  for (KvType type : {KvType::kBF16, KvType::kF16}) {
    PrefillCase c;
    c.type = type;
    c.soft_cap = 2.0f;
    c.shapes = kRaggedPrefill;
    SCOPED_TRACE(CaseName(c));
    RunCase(c);
  }
  PrefillCase windowed;
  windowed.soft_cap = 2.0f;
  windowed.window = 33;
  windowed.shapes = kRaggedPrefill;
  RunCase(windowed);
  PrefillCase non_causal;
  non_causal.soft_cap = 2.0f;
  non_causal.causal = false;
  non_causal.head_dim = 256;
  non_causal.shapes = kRaggedPrefill;
  RunCase(non_causal);
}

// Refused before any device call, so these run without a GPU too.
TEST(FlashInferPrefillShapes, UnsupportedShapesAreRefused) {
  EXPECT_FALSE(FlashInferPrefillSupports(KvType::kF32, 128, 4));
  EXPECT_FALSE(FlashInferPrefillSupports(KvType::kBF16, 96, 4));
  EXPECT_FALSE(FlashInferPrefillSupports(KvType::kBF16, 128, 0));
  EXPECT_TRUE(FlashInferPrefillSupports(KvType::kF16, 256, 32));

  const std::optional<FlashInferPrefillPlan> plan = PlanFlashInferPrefill({{1, 1}}, 1, 256);
  ASSERT_TRUE(plan.has_value());
  int32_t fake_device_schedule = 0;  // Never read: every case below is refused first.
  FlashInferPrefillArgs args;
  args.kv.kv_type = KvType::kBF16;
  args.kv.head_dim = 256;
  args.kv.num_kv_heads = 2;
  args.kv.page_size = 16;
  args.kv.page_stride_elements = 2 * 2 * 16 * 256;
  args.num_heads = 8;
  args.batch = 1;
  args.q_stride_row = 8 * 256;
  args.schedule = FlashInferPrefillSchedule::Of(*plan, &fake_device_schedule);

  FlashInferPrefillArgs bad = args;
  bad.num_heads = 7;  // Not a multiple of the KV heads.
  EXPECT_EQ(FlashInferPrefill(bad, 0), cudaErrorInvalidValue);
  bad = args;
  bad.q_stride_row = 8 * 256 - 1;  // Narrower than the heads.
  EXPECT_EQ(FlashInferPrefill(bad, 0), cudaErrorInvalidValue);
  bad = args;
  bad.q_stride_row = 8 * 256 + 4;  // Rows not 16-byte aligned.
  EXPECT_EQ(FlashInferPrefill(bad, 0), cudaErrorInvalidValue);
  bad = args;
  bad.kv.page_stride_elements = 2 * 2 * 16 * 256 + 4;  // Pages not 16-byte aligned.
  EXPECT_EQ(FlashInferPrefill(bad, 0), cudaErrorInvalidValue);
  bad = args;
  bad.kv.page_stride_elements = int64_t{1} << 32;  // Beyond paged_kv_t's uint32 stride.
  EXPECT_EQ(FlashInferPrefill(bad, 0), cudaErrorInvalidValue);
  bad = args;
  bad.schedule.cta_tile_q = 128;  // No 128-row instance for head dim 256.
  EXPECT_EQ(FlashInferPrefill(bad, 0), cudaErrorInvalidValue);
  bad = args;
  bad.schedule.cta_tile_q = 16;  // FlashInfer's smallest tile, not built here.
  EXPECT_EQ(FlashInferPrefill(bad, 0), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace attnserve::cuda
